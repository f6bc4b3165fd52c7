#!/usr/bin/env bash
# make bench: every speed and memory goal, measured. Each line of output is
# a Go benchmark result; the README quotes them with this command.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"
# The proxy benchmark runs nginx beside the guard's proxy, in the same run.
if ! command -v nginx >/dev/null && ! [ -x /usr/sbin/nginx ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
echo "== in-process benchmarks (log pump, classifier, GPU sampling, parsers)"
go test -run '^$' -bench . -benchmem -benchtime 2s $(go list ./... | grep -v /integration) 2>&1 | grep -E '^(Benchmark|ok|FAIL|---)' || true
echo "== end-to-end benchmarks (the shipped guard over the simulator)"
go test -run '^$' -bench . -benchtime 1x ./internal/integration/ 2>&1 | grep -E '^(Benchmark|ok|FAIL|---)'
