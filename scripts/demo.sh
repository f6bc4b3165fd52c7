#!/usr/bin/env bash
# make demo: the guard supervises the vLLM simulator through one OOM.
# launch → loading → ready → OOM → restart on rung 1 → ready, then a clean stop.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/vllm-guard-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PATH="$root/bin:$PATH"
export FAKENVML_STATE="$work/gpu" LD_LIBRARY_PATH="$root/build/lib"
mkdir -p "$FAKENVML_STATE/procs"
echo "GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3 (simulated)" > "$FAKENVML_STATE/devices"
sed "s#@WORK@#$work#g" "$root/examples/demo.toml" > "$work/demo.toml"

echo "== vllm-guard demo: config $root/examples/demo.toml, simulator on 127.0.0.1:18000"
# The guard logs for the reader; the script reads its event stream (one
# JSON object a line: "kind" says what happened), never the log's wording.
events="$work/events.jsonl"
: > "$events"
"$root/bin/vllm-guard" run --config "$work/demo.toml" --events "$events" &
guard=$!
start=$SECONDS
while kill -0 "$guard" 2>/dev/null && [ $((SECONDS - start)) -lt 60 ]; do
  [ "$(grep -c '"kind":"ready"' "$events")" -ge 2 ] && break
  sleep 0.2
done
sleep 1 # let the reader see it hold
stopped_at=$(date +%s.%N)
kill -TERM "$guard" 2>/dev/null
wait "$guard" # the guard writes out its events before it exits
code=$?
stop_ms=$(awk -v a="$stopped_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%d", (b - a) * 1000 }')

readies=$(grep -c '"kind":"ready"' "$events")
ooms=$(grep '"kind":"exited"' "$events" | grep -c '"cause":"oom"')
# The profile of the last launch, and how the guard chose it.
last=$(grep '"kind":"starting"' "$events" | tail -1)
seqs=$(sed -n 's/.*"rung":{[^}]*"max_num_seqs":\([0-9]*\).*/\1/p' <<<"$last")
util=$(sed -n 's/.*"rung":{[^}]*"gpu_memory_utilization":\([0-9.]*\).*/\1/p' <<<"$last")
how=$(grep '"kind":"exited"' "$events" | tail -1 | sed -n 's/.*"decision":{.*"reason":"\([^"]*\)".*/\1/p')
echo
echo "== summary"
echo "The guard launched the simulated vLLM on rung 0 (max_num_seqs 256, gpu_memory_utilization 0.85)," \
  "said ready only after a 1-token completion answered, saw $ooms GPU OOM(s) when the background" \
  "demand outgrew rung 0, cleaned up the process tree, waited for the GPU memory, backed off, and" \
  "restarted with max_num_seqs $seqs and gpu_memory_utilization $util ($how), where vLLM became" \
  "ready again and held ($readies readiness events in all). On SIGTERM it stopped vLLM gracefully" \
  "and exited $code ${stop_ms} ms after the SIGTERM ($((SECONDS - start)) s for the whole demo)."
if [ "$code" -ne 0 ] || [ "$readies" -lt 2 ] || [ "$ooms" -lt 1 ]; then
  echo "demo FAILED: exit $code, $readies ready, $ooms OOM" >&2
  exit 1
fi
