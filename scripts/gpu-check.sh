#!/usr/bin/env bash
# gpu-check.sh: check the guard's GPU view against nvidia-smi on a machine
# with a real NVIDIA GPU and driver (not part of `make test`; no CUDA
# toolkit or PyTorch needed, only the driver, Go and gcc).
#
#  1. builds the guard and scripts/cudalloc.c (which dlopen()s
#     libcuda.so.1 and allocates through cuInit/cuCtxCreate/cuMemAlloc);
#  2. compares `vllm-guard gpus --json` (device used/total, the allocating
#     process's bytes) with nvidia-smi before, during and after a 1 GiB
#     allocation that is freed with cuMemFree;
#  3. prints the guard's view of the GPU's hardware health (uncorrected ECC
#     counts, remapped rows, retired pages pending, lost, XIDs and whether
#     XID events can be watched) next to `nvidia-smi -q -d
#     ECC,ROW_REMAPPER,PAGE_RETIREMENT` (no fault needed: both should read
#     the same counters), and later the guard's /metrics series of them;
#  4. runs the guard over a command that allocates 2 GiB in a child, kills
#     that command's leader with SIGKILL (the child is orphaned, holding its
#     memory, as vLLM's EngineCore is), and shows that the memory is
#     released before the guard's next start.
#
#  5. with a CUDA build of vLLM and a local model (GPU_CHECK_MODEL), the
#     standby measurements of scripts/gpu-standby-check.sh: restarts with
#     and without the weight cache daemon and the startup plan, sleep and
#     wake, failover kill → first token (skipped, saying so, without them).
#
#   scripts/gpu-check.sh [DEVICE]        (default device 0)
set -euo pipefail
cd "$(dirname "$0")/.."
DEV="${1:-0}"
MIB=1024
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"

command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found: this script needs an NVIDIA GPU and driver" >&2; exit 2; }
command -v python3 >/dev/null || { echo "gpu-check: python3 is needed to read the JSON" >&2; exit 2; }

WORK="$(mktemp -d)"
GUARD_PID=""
ALLOC_PID=""
cleanup() {
	[ -n "$ALLOC_PID" ] && kill "$ALLOC_PID" 2>/dev/null || true
	[ -n "$GUARD_PID" ] && kill -TERM "$GUARD_PID" 2>/dev/null && wait "$GUARD_PID" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

echo "== build"
go build -o "$WORK/vllm-guard" ./cmd/vllm-guard
gcc -O2 -Wall -Wextra -o "$WORK/cudalloc" scripts/cudalloc.c -ldl
GUARD="$WORK/vllm-guard"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader

# compare LABEL [PID]: one line of the guard's view next to nvidia-smi's.
compare() {
	local label="$1" pid="${2:-0}"
	"$GUARD" gpus --json >"$WORK/gpus.json" || true
	local smi smi_proc
	smi="$(nvidia-smi -i "$DEV" --query-gpu=memory.used,memory.total --format=csv,noheader,nounits | tr -d ' ')"
	smi_proc="$(nvidia-smi -i "$DEV" --query-compute-apps=pid,used_memory --format=csv | awk -F', *' -v p="$pid" '$1==p {print $2}')"
	python3 - "$WORK/gpus.json" "$DEV" "$pid" "$label" "$smi" "${smi_proc:-none}" <<'PY'
import json, sys
path, dev, pid, label, smi, smi_proc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
snap = json.load(open(path))
d = next((x for x in snap.get("devices", []) if x["index"] == dev), None)
if d is None:
    print(f"{label:8} guard sees no GPU {dev}: {snap.get('reason', '')}")
    sys.exit(0)
mib = lambda b: b / (1 << 20)
g_used, g_total = mib(d["used_bytes"]), mib(d["total_bytes"])
s_used, s_total = (float(v) for v in smi.split(","))
proc = next((p for p in d.get("processes", []) if p["pid"] == pid), None)
g_proc = f"{mib(proc['used_bytes']):.0f} MiB" if proc else "none"
print(f"{label:8} guard {g_used:8.0f} / {g_total:.0f} MiB   nvidia-smi {s_used:8.0f} / {s_total:.0f} MiB   "
      f"diff {g_used - s_used:+.0f} MiB   pid {pid}: guard {g_proc}, nvidia-smi {smi_proc}")
PY
}

echo
echo "== allocate ${MIB} MiB on GPU $DEV through the driver API, then free it"
compare before
"$WORK/cudalloc" "$DEV" "$MIB" 6 >"$WORK/alloc.out" &
ALLOC_PID=$!
for _ in $(seq 100); do grep -q allocated "$WORK/alloc.out" 2>/dev/null && break; sleep 0.1; done
grep -q allocated "$WORK/alloc.out" || { echo "gpu-check: cudalloc did not allocate"; cat "$WORK/alloc.out"; exit 1; }
sleep 1 # one NVML refresh
compare during "$ALLOC_PID"
wait "$ALLOC_PID"
ALLOC_PID=""
grep -q freed "$WORK/alloc.out" || { echo "gpu-check: cudalloc did not free"; exit 1; }
sleep 1
compare after

echo
echo "== hardware health: the guard (NVML through go-nvml) next to nvidia-smi"
"$GUARD" gpus --json >"$WORK/gpus.json" || true
python3 - "$WORK/gpus.json" "$DEV" <<'PY'
import json, sys
snap, dev = json.load(open(sys.argv[1])), int(sys.argv[2])
h = next((x for x in snap.get("health") or [] if x["index"] == dev), None)
if h is None:
    print(f"guard: no health for GPU {dev}: {snap.get('reason', '')}")
    sys.exit(0)
ecc = h.get("ecc")
print(f"guard: GPU {dev} {h['uuid']}")
print(f"  lost {h['lost']}  reset required {h['reset_required']}")
print("  uncorrected ECC: " + (f"volatile {ecc['volatile_uncorrected']}  aggregate {ecc['aggregate_uncorrected']}" if ecc else "not reported"))
r = h.get("remapped_rows")
print("  remapped rows:   " + (f"correctable {r['correctable']}  uncorrectable {r['uncorrectable']}  pending {r['pending']}  failure {r['failure']}" if r else "not reported"))
p = h.get("retired_pages_pending")
print("  retired pages pending: " + ("not reported" if p is None else str(p)))
print("  hardware clock slowdown: " + ((", ".join(h.get("throttle") or []) or "none") if h.get("throttle_known") else "not reported"))
print(f"  XIDs seen: {h.get('xid_counts') or 'none'}")
print(f"  not reported by this GPU/driver: {', '.join(h.get('unsupported') or []) or 'nothing'}")
PY
echo "nvidia-smi -q -i $DEV -d ECC,ROW_REMAPPER,PAGE_RETIREMENT,PERFORMANCE:"
nvidia-smi -q -i "$DEV" -d ECC,ROW_REMAPPER,PAGE_RETIREMENT,PERFORMANCE | sed -n '/Attached GPUs/,$p' | sed 's/^/  /'

echo
echo "== the guard over a command whose allocating child is orphaned by a SIGKILL"
MPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$WORK/leader.sh" <<EOF
#!/usr/bin/env bash
# Stands in for vLLM's API server: its child holds GPU memory like EngineCore.
"$WORK/cudalloc" "$DEV" 2048 0 &
wait
EOF
chmod +x "$WORK/leader.sh"
cat >"$WORK/guard.toml" <<EOF
[vllm]
command = ["$WORK/leader.sh"]
port = $PORT
stop_timeout = "3s"
[vllm.env]
CUDA_VISIBLE_DEVICES = "$DEV"
[readiness]
probe = "health"
[restart]
initial_delay = "1s"
max_delay = "2s"
[gpu]
devices = ["$DEV"]
sample_interval = "500ms"
release_timeout = "30s"
[control]
socket = "$WORK/guard.sock"
http_listen = "127.0.0.1:$MPORT"
state_dir = "$WORK/state"
[log]
format = "json"
EOF
"$GUARD" run --config "$WORK/guard.toml" --events "$WORK/events.jsonl" 2>"$WORK/guard.log" &
GUARD_PID=$!
# The first start: wait for the child's allocation to show in NVML.
leader=""
for _ in $(seq 200); do
	leader=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    e=json.loads(l)
    if e["kind"]=="starting" and e.get("pid"): print(e["pid"]); break' "$WORK/events.jsonl" 2>/dev/null || true)
	[ -n "$leader" ] && nvidia-smi -i "$DEV" --query-compute-apps=pid --format=csv,noheader | grep -q . && break
	sleep 0.1
done
[ -n "$leader" ] || { echo "gpu-check: the guard did not start the command"; tail -20 "$WORK/guard.log"; exit 1; }
child=$(pgrep -P "$leader" -f cudalloc | head -1)
sleep 1
compare held "$child"
echo "the guard's hardware-health series (its /metrics) for GPU $DEV:"
python3 - "$MPORT" "$DEV" <<'PY'
import sys, urllib.request
port, dev = sys.argv[1], sys.argv[2]
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
names = ("vllm_guard_gpu_xid_total", "vllm_guard_gpu_ecc_uncorrected_errors", "vllm_guard_gpu_remapped_rows",
         "vllm_guard_gpu_remap_pending", "vllm_guard_gpu_remap_failure", "vllm_guard_gpu_retired_pages_pending", "vllm_guard_gpu_hw_throttle",
         "vllm_guard_gpu_lost")
seen = set()
for line in body.splitlines():
    if line.startswith(names) and f'gpu="{dev}"' in line:
        print("  " + line)
        seen.add(line.split("{")[0])
for n in names:
    if n not in seen:
        print(f"  {n}: no series (none yet, or not reported by this GPU/driver)")
PY
echo "SIGKILL to the command's leader (pid $leader); its child $child keeps 2 GiB, as an orphaned EngineCore would"
kill -KILL "$leader"
# Wait for the second start, then read the memory at once.
for _ in $(seq 600); do
	n=$(grep -c '"kind":"starting"' "$WORK/events.jsonl" || true)
	[ "$n" -ge 2 ] && break
	sleep 0.1
done
compare restart
python3 - "$WORK/events.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["kind"] in ("state", "starting", "exited"):
        what = e.get("reason") or ""
        if e["kind"] == "exited":
            f = e["failure"]
            what = f"{f['exit']}, cause {f['verdict']['cause']}"
        print(f"  {e['time'][11:23]} {e['kind']:9} {e.get('from', ''):>11} → {e.get('state', ''):12} {what}")
PY
if ps -p "$child" >/dev/null 2>&1; then
	echo "gpu-check: FAIL: the orphaned child $child is still alive"
	exit 1
fi
echo "the orphan $child is gone and its memory was released before the next start (see waiting_gpu → backoff → starting above)"
kill -TERM "$GUARD_PID"
wait "$GUARD_PID" || true
GUARD_PID=""
compare end

echo
echo "== standby: restarts, the weight cache daemon, sleep mode, failover (vLLM on the GPU)"
scripts/gpu-standby-check.sh "$DEV"
echo "gpu-check: done"
