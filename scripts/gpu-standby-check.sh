#!/usr/bin/env bash
# gpu-standby-check.sh: measure, on a real GPU with a CUDA build of vLLM
# 0.32.0, what the standby work (issue 42) is built on (docs/standby-facts.md):
#
#  1. restarts: a cold start (disk, profiling), a restart with the startup
#     plan (VLLM_ENABLE_STARTUP_PLAN=1), a restart that maps the weights from
#     `vllm preload` (--load-format ipc_cache), and one with both;
#  2. the weight cache daemon: its /health, the memory NVML charges to it and
#     to the engine, and what a mapped engine does when the daemon is killed
#     (vLLM's source does not say: the CUDA driver decides);
#  3. sleep mode: what level 1 and level 2 free (nvidia-smi), the time to
#     fall asleep and to wake, and whether a level-2 wake answers as before;
#  4. failover by hand: a primary and a level-1 standby on the same GPU,
#     SIGKILL of the primary during a stream, then wake the standby and
#     time kill → first token of the continuation.
#
#   GPU_CHECK_MODEL=/path/to/model [GPU_CHECK_VLLM=vllm] scripts/gpu-standby-check.sh [DEVICE]
#
# Needs vLLM 0.32.0 with CUDA (GPU_CHECK_VLLM, default `vllm` on PATH) and a
# small local model (GPU_CHECK_MODEL; nothing is downloaded: the lent GPU
# machines reach nothing outside). Without them it says so and exits 0
# (scripts/gpu-check.sh calls it last). GPU_CHECK_DRY_RUN=1 prints each
# step's command instead of running it (this machine has no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV="${1:-0}"
VLLM="${GPU_CHECK_VLLM:-vllm}"
MODEL="${GPU_CHECK_MODEL:-}"
DRY="${GPU_CHECK_DRY_RUN:-0}"
UTIL="${GPU_CHECK_UTIL:-0.40}"

if [ "$DRY" != 1 ]; then
	if [ -z "$MODEL" ] || [ ! -e "$MODEL" ]; then
		echo "gpu-standby-check: skipped: set GPU_CHECK_MODEL to a local model folder (nothing is downloaded)"
		exit 0
	fi
	if ! command -v "$VLLM" >/dev/null || ! "$(dirname "$(command -v "$VLLM")")/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
		echo "gpu-standby-check: skipped: $VLLM is not a CUDA build of vLLM here (GPU_CHECK_VLLM names one)"
		exit 0
	fi
fi

WORK="$(mktemp -d /tmp/gsc.XXXX)" # short: the daemon's Unix socket path must fit in 108 bytes
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -KILL -- "-$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
export CUDA_VISIBLE_DEVICES="$DEV" TMPDIR="$WORK" VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.2f}')"; }
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
mem() {
	[ "$DRY" = 1 ] && { echo "?"; return; }
	nvidia-smi -i "$DEV" --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' '; }
apps() {
	[ "$DRY" = 1 ] && return
	nvidia-smi -i "$DEV" --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';'; }
run() { # run NAME CMD...: in its own process group, output in $WORK/NAME.log
	local name="$1"
	shift
	if [ "$DRY" = 1 ]; then
		echo "  would run: $*"
		LAST=0
		return
	fi
	setsid "$@" >"$WORK/$name.log" 2>&1 &
	LAST=$!
	PIDS+=("$LAST")
}
stop() { [ "$DRY" = 1 ] || { kill -TERM -- "-$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }; }
waitok() { # waitok URL LABEL: until 200, at most 15 min
	[ "$DRY" = 1 ] && return 0
	for _ in $(seq 9000); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ] && return 0
		sleep 0.1
	done
	echo "gpu-standby-check: $2 never answered 200 on $1"
	return 1
}
complete() { # complete PORT: one greedy completion, its text
	[ "$DRY" = 1 ] && { echo "(dry run)"; return; }
	curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
		-d "{\"model\":\"$MODEL\",\"prompt\":\"The capital of France is\",\"max_tokens\":16,\"temperature\":0}" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
serve() { # serve NAME PORT EXTRA...: a vLLM, timed to its first completion
	local name="$1" port="$2"
	shift 2
	local t0
	t0=$(now)
	run "$name" env "${SERVE_ENV[@]}" "$VLLM" serve "$MODEL" --port "$port" --gpu-memory-utilization "$UTIL" "$@"
	waitok "http://127.0.0.1:$port/health" "$name"
	complete "$port" >/dev/null
	echo "$name: ready and answered $(secs "$t0" "$(now)") s after the start; GPU $(mem) MiB used; $(apps)"
}
SERVE_ENV=(VLLM_CACHE_ROOT="$WORK/vc")
P1=$(freeport)
P2=$(freeport)
HP=$(freeport)

echo "== 1. restarts: cold, with the startup plan, with the weight cache daemon, with both"
serve cold "$P1"
stop "$LAST"
SERVE_ENV=(VLLM_CACHE_ROOT="$WORK/vc" VLLM_ENABLE_STARTUP_PLAN=1)
serve plan-first "$P1"
stop "$LAST"
serve plan-second "$P1"
grep -h "Applying persisted startup plan\|Startup plan not applied\|Saved startup plan" "$WORK"/plan-*.log 2>/dev/null | sed 's/^/  /' || true
stop "$LAST"

t0=$(now)
run preload "$VLLM" preload --model "$MODEL" --weight-cache-health-port "$HP" --weight-cache-health-host 127.0.0.1
DAEMON_GROUP=$LAST
waitok "http://127.0.0.1:$HP/health" "vllm preload"
echo "vllm preload: /health 200 after $(secs "$t0" "$(now)") s; GPU $(mem) MiB used; $(apps)"
SERVE_ENV=(VLLM_CACHE_ROOT="$WORK/vc")
serve ipc-first "$P1" --load-format ipc_cache
stop "$LAST"
serve ipc-second "$P1" --load-format ipc_cache
grep -h "Mapped .* tensors\|Weights are held outside\|Weight cache unusable" "$WORK"/ipc-*.log 2>/dev/null | sed 's/^/  /' || true
stop "$LAST"
SERVE_ENV=(VLLM_CACHE_ROOT="$WORK/vc" VLLM_ENABLE_STARTUP_PLAN=1)
serve ipc-plan "$P1" --load-format ipc_cache
ENGINE=$LAST

echo
echo "== 2. the daemon dies under a mapped engine"
before=$(complete "$P1")
if [ "$DRY" != 1 ]; then
	daemon=$(pgrep -g "$DAEMON_GROUP" -f 'multiprocessing' | head -1 || true)
	echo "SIGKILL to the daemon process ${daemon:-?} (group $DAEMON_GROUP); GPU before $(mem) MiB; $(apps)"
	[ -n "$daemon" ] && kill -KILL "$daemon"
	sleep 2
	echo "after: launcher $(kill -0 "$DAEMON_GROUP" 2>/dev/null && echo alive || echo "exited ($(wait "$DAEMON_GROUP" 2>/dev/null; echo $?))"); GPU $(mem) MiB; $(apps)"
	after=$(complete "$P1" || echo "(no answer)")
	echo "the engine's answer before: $before"
	echo "the engine's answer after:  $after"
	curl -s -o /dev/null -w "engine /health after the daemon's death: %{http_code}\n" "http://127.0.0.1:$P1/health" || true
fi
stop "$ENGINE"
stop "$DAEMON_GROUP"

echo
echo "== 3. sleep mode: level 1 and level 2"
SERVE_ENV=(VLLM_CACHE_ROOT="$WORK/vc" VLLM_SERVER_DEV_MODE=1)
serve sleeper "$P1" --enable-sleep-mode
SLEEPER=$LAST
awake=$(complete "$P1")
for level in 1 2; do
	[ "$DRY" = 1 ] && { echo "  would POST /sleep?level=$level, /wake_up"; continue; }
	m0=$(mem)
	t0=$(now)
	curl -s -X POST "http://127.0.0.1:$P1/sleep?level=$level" >/dev/null
	t1=$(now)
	m1=$(mem)
	curl -s -X POST "http://127.0.0.1:$P1/wake_up" >/dev/null
	t2=$(now)
	echo "level $level: GPU $m0 → $m1 MiB asleep; fell asleep in $(secs "$t0" "$t1") s; woke in $(secs "$t1" "$t2") s; GPU $(mem) MiB awake"
	echo "  answer after the wake equals the one before: $([ "$(complete "$P1")" = "$awake" ] && echo yes || echo NO)"
done
grep -h "Sleep mode freed\|It took\|CuMemAllocator: sleep freed" "$WORK/sleeper.log" 2>/dev/null | sed 's/^/  /' || true
curl -s "http://127.0.0.1:$P1/metrics" 2>/dev/null | grep -E '^vllm:(engine_sleep_state|sleep_mode_)' | sed 's/^/  /' || true
stop "$SLEEPER"

echo
echo "== 4. failover by hand: kill the primary mid-stream, wake the standby, time kill → first token"
SERVE_ENV=(VLLM_CACHE_ROOT="$WORK/vc" VLLM_SERVER_DEV_MODE=1 VLLM_ENABLE_STARTUP_PLAN=1)
serve standby "$P2" --enable-sleep-mode
STANDBY=$LAST
[ "$DRY" = 1 ] || curl -s -X POST "http://127.0.0.1:$P2/sleep?level=1" >/dev/null
echo "standby asleep: GPU $(mem) MiB; $(apps)"
SERVE_ENV=(VLLM_CACHE_ROOT="$WORK/vc" VLLM_ENABLE_STARTUP_PLAN=1)
serve primary "$P1"
PRIMARY=$LAST
if [ "$DRY" != 1 ]; then
	python3 - "$P1" "$P2" "$PRIMARY" "$MODEL" "$DEV" <<'PY'
import json, os, signal, subprocess, sys, time, urllib.request
p1, p2, group, model, dev = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
body = {"model": model, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": True}
req = urllib.request.Request(f"http://127.0.0.1:{p1}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
text = ""
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0].get("text", "")
            if len(text) > 40:
                break
except Exception as e:
    print("stream:", e)
t_kill = time.monotonic()
os.killpg(group, signal.SIGKILL)
def used():
    return int(subprocess.check_output(["nvidia-smi", "-i", dev, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]).decode().strip())
start_used = used()
while time.monotonic() - t_kill < 60 and used() > start_used * 0.6:
    time.sleep(0.05)
t_free = time.monotonic()
urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{p2}/wake_up", b"", method="POST"), timeout=120).read()
t_awake = time.monotonic()
body = {"model": model, "prompt": "Once upon a time" + text, "max_tokens": 20, "temperature": 0, "stream": True}
req = urllib.request.Request(f"http://127.0.0.1:{p2}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=60) as r:
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("text"):
            break
t_first = time.monotonic()
print(f"kill → primary's memory released {t_free - t_kill:.2f} s; → standby awake {t_awake - t_kill:.2f} s "
      f"(wake {t_awake - t_free:.2f} s); → first continued token {t_first - t_kill:.2f} s")
PY
fi
stop "$PRIMARY"
stop "$STANDBY"
echo "gpu-standby-check: done"
