#!/usr/bin/env bash
# make bench-admission: more streaming clients than vLLM's memory holds
# (the simulator, over the stand-in NVML), in a ramp and in a burst after a
# warm-up, against vLLM directly, nginx with limit_conn at max_num_seqs,
# and the guard's proxy (at its default 1s GPU sampling and at 100ms).
# Prints the Markdown table (the README quotes it) and writes
# internal/bench/admission/results.json. Extra arguments go to the benchmark
# (e.g. -fronts guard -shapes burst -sample-interval 1s -keep); see
# `go run ./internal/bench/admission -h`. Takes about 8 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"
for f in bin/vllm-guard bin/fakevllm build/lib/libnvidia-ml.so.1; do
  if [ ! -e "$f" ]; then
    echo "bench-admission: $f is missing: run \`make build\` first (make bench-admission does)" >&2
    exit 2
  fi
done
# nginx is one of the fronts compared.
if ! command -v nginx >/dev/null && ! [ -x /usr/sbin/nginx ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
work=$(mktemp -d /tmp/vllm-guard-bench-admission.XXXXXX)
trap 'rm -rf "$work"' EXIT
go build -o "$work/admission" ./internal/bench/admission
export BENCH_ADMISSION_COMMAND="make bench-admission${*:+ (args: $*)}"
"$work/admission" -guard bin/vllm-guard -fakevllm bin/fakevllm -nvml-lib build/lib -json internal/bench/admission/results.json "$@"
