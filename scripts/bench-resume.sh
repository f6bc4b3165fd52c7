#!/usr/bin/env bash
# make bench-resume: vLLM (the simulator, over the stand-in NVML) dies under
# a steady load of 64 greedy streams — an OOM once, and a leak that OOMs
# twice — in front of four fronts: vLLM direct restarted as systemd would,
# nginx with its retry (proxy_next_upstream), the guard with
# [proxy] resume = false, the guard. Per death and front: requests failed,
# streams cut, tokens repeated or missing (checked against each request's
# uninterrupted answer), added latency. Prints the Markdown table
# (docs/measured.md quotes it) and writes internal/bench/resume/results.json.
# Without arguments it then runs two variants of the guard's fronts (issue
# 40): several ids a chunk (-stream-interval 4; results-multi-id.json) and
# sampled streams with 2 ids a chunk, each answer checked for consistency
# with its own ids (-sampled -stream-interval 2; results-sampled.json).
# Arguments replace the three with one run of the benchmark (e.g. -fronts
# guard -scenarios oom -keep); see `go run ./internal/bench/resume -h`.
# About 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"
for f in bin/vllm-guard bin/fakevllm build/lib/libnvidia-ml.so.1; do
  if [ ! -e "$f" ]; then
    echo "bench-resume: $f is missing: run \`make build\` first (make bench-resume does)" >&2
    exit 2
  fi
done
# nginx is one of the fronts compared.
if ! command -v nginx >/dev/null && ! [ -x /usr/sbin/nginx ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
work=$(mktemp -d /tmp/vllm-guard-bench-resume.XXXXXX)
trap 'rm -rf "$work"' EXIT
go build -o "$work/resume" ./internal/bench/resume
run() {
  "$work/resume" -guard bin/vllm-guard -fakevllm bin/fakevllm -nvml-lib build/lib "$@"
}
if [ $# -gt 0 ]; then
  export BENCH_RESUME_COMMAND="make bench-resume (args: $*)"
  run -json internal/bench/resume/results.json "$@"
  exit
fi
rc=0
export BENCH_RESUME_COMMAND="make bench-resume"
run -json internal/bench/resume/results.json || rc=$?
echo
export BENCH_RESUME_COMMAND="make bench-resume (the multi-id variant: -stream-interval 4 -fronts guard-noresume,guard)"
run -json internal/bench/resume/results-multi-id.json -stream-interval 4 -fronts guard-noresume,guard || rc=$((rc ? rc : $?))
echo
export BENCH_RESUME_COMMAND="make bench-resume (the sampled variant: -sampled -stream-interval 2 -fronts guard-noresume,guard)"
run -json internal/bench/resume/results-sampled.json -sampled -stream-interval 2 -fronts guard-noresume,guard || rc=$((rc ? rc : $?))
exit $rc
