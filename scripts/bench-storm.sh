#!/usr/bin/env bash
# make bench-storm: the same failing vLLM (the simulator) under vllm-guard and
# under re-creations of systemd, the kubelet and supervisord, time-scaled.
# Prints the Markdown table (the README quotes it) and writes
# internal/bench/storm/results.json. Extra arguments go to the benchmark
# (e.g. -scenarios leak -supervisors vllm-guard -keep); see
# `go run ./internal/bench/storm -h`. Takes about 3 to 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"
for f in bin/vllm-guard bin/fakevllm build/lib/libnvidia-ml.so.1; do
  if [ ! -e "$f" ]; then
    echo "bench-storm: $f is missing: run \`make build\` first (make bench-storm does)" >&2
    exit 1
  fi
done
work=$(mktemp -d /tmp/vllm-guard-bench-storm.XXXXXX)
trap 'rm -rf "$work"' EXIT
go build -o "$work/storm" ./internal/bench/storm
export STORM_COMMAND="make bench-storm${*:+ (args: $*)}"
"$work/storm" -guard bin/vllm-guard -fakevllm bin/fakevllm -nvml-lib build/lib -json internal/bench/storm/results.json "$@"
