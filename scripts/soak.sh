#!/usr/bin/env bash
# soak.sh: `make soak`. The race-built guard supervises the vLLM simulator
# through 200 scripted failures of mixed kinds under a client load, then
# checks for orphans, goroutine/fd leaks, RSS growth (≤ 10 %), one incident
# per failure and restarts on the rung the policy chose. Prints the
# figures and a verdict; exits 1 when a goal is missed, 2 when it could not
# run. Arguments go to the soak program, e.g.:
#   scripts/soak.sh -failures 50 -seed 7      a shorter run, another mix
#   scripts/soak.sh -plain=false              the race build (its RSS grows with the detector's shadow memory)
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"
# The shipped build by default: the RSS goal is about what operators run.
exec "${GO:-go}" run ./internal/integration/soak -plain "$@"
