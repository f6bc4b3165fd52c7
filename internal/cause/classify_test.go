package cause

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

func TestMessageOf(t *testing.T) {
	const msg = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB."
	for _, in := range []string{
		msg,
		"ERROR 10-14 12:00:00 model_runner.py:1703] " + msg,
		"ERROR 10-14 12:00:00 [model_runner.py:1703] " + msg,
		"(APIServer pid=1) ERROR 07-22 09:00:00 [core.py:700] " + msg,
		"(EngineCore_0 pid=312) " + msg,
		"(EngineCore_DP0 pid=301) " + msg,
		"(EngineCore pid=298) " + msg,
		"(VllmWorker rank=3 pid=403) " + msg,
		"(VllmWorker TP0 pid=400) " + msg,
		"(Worker_TP0 pid=400) " + msg,
		"(VllmWorkerProcess pid=5101) ERROR 10-14 12:00:00 multiproc_worker_utils.py:116] " + msg,
		vllmlog.StripANSI("\x1b[1;36m(EngineCore_0 pid=312)\x1b[0;0m " + msg),
		"Dec 02 09:31:24 gpu-node-3 vllm[1234]: (EngineCore pid=298) " + msg,
		"Dec  2 09:31:24 gpu-node-3 vllm[1234]: " + msg,
		"2025-12-02T09:31:24+0000 gpu-node-3 vllm[1234]: " + msg,
		"2025-11-04T02:00:00.241000000Z (EngineCore_DP0 pid=188) " + msg,
		"2026-01-20T04:00:00.123456789Z stdout F (EngineCore pid=298) " + msg,
		"2026-01-20T04:00:00.123456789Z stderr P " + msg,
		msg + "\r",
	} {
		if got := vllmlog.Message(in); got != msg {
			t.Errorf("vllmlog.Message(%q) = %q", in, got)
		}
	}
	// Indentation of traceback source lines survives the prefix.
	if got := vllmlog.Message("(EngineCore pid=298)     raise ValueError("); got != "    raise ValueError(" {
		t.Errorf("source line: %q", got)
	}
	// Not prefixes: left alone.
	for _, in := range []string{"(see above) something", "INFO:     Application startup complete.", "Decimal 12 value: 3"} {
		if got := vllmlog.Message(in); got != in {
			t.Errorf("vllmlog.Message(%q) = %q, want it unchanged", in, got)
		}
	}
}

func lines(texts ...string) []Line {
	out := make([]Line, len(texts))
	for i, s := range texts {
		out[i] = Line{N: i + 1, Text: s}
	}
	return out
}

func TestClassifyCases(t *testing.T) {
	const (
		ready   = "(APIServer pid=1) INFO:     Application startup complete."
		failed  = "(EngineCore_0 pid=312) ERROR 07-22 09:00:00 [core.py:700] EngineCore failed to start."
		initErr = "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
		dead    = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."
	)
	tests := []struct {
		name     string
		e        Exit
		cause    Cause
		conf     string
		evidence []int  // line numbers
		summary  string // substring
	}{
		{"start failure", Exit{StartFailure: `exec: "vllm": executable file not found in $PATH`, ExitCode: -1},
			CauseConfigError, "high", nil, "could not be started"},
		{"hang", Exit{Hang: "no load progress for 10m0s", Signal: "SIGKILL", SignalByGuard: true, Lines: lines("INFO 1", "INFO 2")},
			CauseHang, "high", nil, "no load progress"},
		{"hang with a dead engine that ran out of memory", Exit{Hang: "liveness: /health returned 503", Signal: "SIGKILL", SignalByGuard: true,
			Lines: lines(ready, "torch.OutOfMemoryError: CUDA out of memory.", dead)}, CauseOOM, "high", []int{2}, "killed as hung"},
		{"host oom kill", Exit{HostOOMKill: true, Signal: "SIGKILL", ExitCode: -1, Lines: lines(ready)},
			CauseHostOOM, "high", nil, "OOM killer"},
		{"an OOM-killed engine, then the API server exits by itself", Exit{HostOOMKill: true, ExitCode: 0,
			Lines: lines(ready, "(EngineCore pid=2) ERROR Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.", dead)},
			CauseHostOOM, "high", []int{2}, "OOM killer killed a process of vLLM's tree"},
		{"an OOM kill beside a log that names GPU memory", Exit{HostOOMKill: true, ExitCode: 1,
			Lines: lines("torch.OutOfMemoryError: CUDA out of memory.", initErr)}, CauseOOM, "high", []int{1}, ""},
		{"SIGKILL by the guard is not host oom", Exit{HostOOMKill: true, Signal: "SIGKILL", SignalByGuard: true, ExitCode: -1, Lines: lines(ready)},
			CauseCrash, "low", nil, "sent by the guard"},
		{"SIGKILL by someone else", Exit{Signal: "SIGKILL", ExitCode: -1, Lines: lines(ready)},
			CauseCrash, "low", nil, "not sent by the guard"},
		{"exit 0 after ready", Exit{ExitCode: 0, Lines: lines(ready)}, CauseCrash, "low", nil, "code 0"},
		{"wrappers only", Exit{ExitCode: 1, Lines: lines(failed, initErr)}, CauseCrash, "low", nil, "engine death at line 1"},
		{"oom inside nccl beats the nccl error", Exit{ExitCode: 1, Lines: lines(
			"(VllmWorker rank=0 pid=400) RuntimeError: NCCL error: unhandled cuda error",
			"(VllmWorker rank=2 pid=402) ncclUnhandledCudaError: Call to CUDA function failed.",
			"(VllmWorker rank=2 pid=402) Cuda failure 'out of memory'",
			"(EngineCore_0 pid=290) ERROR 04-02 13:00:00 [multiproc_executor.py:140] Worker proc VllmWorker-2 died unexpectedly, shutting down executor.",
			failed, initErr)}, CauseOOM, "high", []int{3}, "out of memory"},
		{"CUDA driver error", Exit{ExitCode: 1, Lines: lines("RuntimeError: CUDA driver error: out of memory", initErr)}, CauseOOM, "high", []int{1}, ""},
		{"CUDA error: out of memory", Exit{ExitCode: 1, Lines: lines("RuntimeError: CUDA error: out of memory", initErr)}, CauseOOM, "high", []int{1}, ""},
		{"old torch OOM", Exit{ExitCode: 1, Lines: lines("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.69 GiB total capacity; 22.1 GiB already allocated)")}, CauseOOM, "high", []int{1}, ""},
		{"gpu busy beats the kv error after it", Exit{ExitCode: 1, Lines: lines(
			"ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired GPU memory utilization (0.95, 45.01 GiB).",
			"ValueError: No available memory for the cache blocks.")}, CauseGPUBusy, "high", []int{1}, ""},
		{"kv beats the config-looking ValueError", Exit{ExitCode: 1, Lines: lines(
			"INFO 06-01 11:00:11 [gpu_worker.py:276] Available KV cache memory: -2.14 GiB",
			"ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")},
			CauseKVInsufficient, "high", []int{1, 2}, ""},
		{"positive KV memory is not evidence", Exit{ExitCode: 1, Offline: true, Lines: lines("INFO 06-01 11:00:11 [gpu_worker.py:276] Available KV cache memory: 16.23 GiB")},
			"", "", nil, "still starting"},
		{"argparse", Exit{ExitCode: 2, Lines: lines("usage: vllm serve [model_tag] [options]", "vllm serve: error: argument --max-num-seqs: invalid int value: 'many'")},
			CauseConfigError, "high", []int{2}, "invalid int value"},
		{"config errors do not count once ready", Exit{ExitCode: 0, Lines: lines(ready, "ValueError: This model's maximum context length is 4096 tokens.", "Engine core proc EngineCore died unexpectedly, shutting down client.")},
			CauseCrash, "high", []int{3}, "died unexpectedly"},
		{"memory ValueError is not a config error", Exit{ExitCode: 1, Lines: lines("ValueError: Insufficient memory for the requested batch")},
			CauseCrash, "low", []int{1}, "Insufficient memory"},
		{"inferred oom from memory", Exit{ExitCode: 0, Critical: 0.97, MemFractions: []float64{0.9, 0.98, 0.95}, Lines: lines(ready, "Engine core proc EngineCore died unexpectedly, shutting down client.")},
			CauseOOM, "low", []int{2}, "inferred from memory"},
		{"memory below critical is not oom", Exit{ExitCode: 0, Critical: 0.97, MemFractions: []float64{0.9, 0.96}, Lines: lines(ready)},
			CauseCrash, "low", nil, ""},
		{"memory does not override a config error", Exit{ExitCode: 2, Critical: 0.97, MemFractions: []float64{0.99}, Lines: lines("vllm serve: error: unrecognized arguments: --swap-space 4")},
			CauseConfigError, "high", []int{1}, ""},
		{"nccl watchdog timeout is a hang", Exit{ExitCode: 0, Lines: lines(ready, "[rank0]:[E909 19:41:02.123 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)")},
			CauseHang, "high", []int{2}, "Watchdog"},
		{"ANSI in the lines", Exit{ExitCode: 1, Lines: lines("\x1b[1;36m(EngineCore_0 pid=312)\x1b[0;0m torch.OutOfMemoryError: CUDA out of memory.")},
			CauseOOM, "high", []int{1}, ""},
		{"offline healthy", Exit{Offline: true, Lines: lines(ready)}, "", "", nil, "no failure found: vLLM became ready"},
		{"offline traceback while starting", Exit{Offline: true, Lines: lines("Traceback (most recent call last):", "  File \"x.py\", line 1, in f", "KeyError: 'rope_scaling'")},
			CauseCrash, "low", []int{3}, "KeyError"},
		{"offline wrapper only", Exit{Offline: true, Lines: lines(ready, dead)}, CauseCrash, "low", nil, "no root-cause line"},
		{"the last run of several is classified", Exit{Offline: true, Lines: lines(
			"INFO 10-14 12:00:00 api_server.py:585] vLLM API server version 0.6.3", "torch.OutOfMemoryError: CUDA out of memory.",
			"INFO 10-14 12:05:00 api_server.py:585] vLLM API server version 0.6.3", "INFO:     Application startup complete.")},
			"", "", nil, "became ready"},
		{"explicit phase overrides the log", Exit{ExitCode: 1, Phase: PhaseReady, Lines: lines("vllm serve: error: unrecognized arguments: --x")},
			CauseCrash, "low", nil, ""},
		// A failed bind is a configuration error in any phase (issue 32 item
		// 4): "ready" may have been another instance's vLLM on the port.
		{"bind failure after ready", Exit{ExitCode: 1, Phase: PhaseReady, Lines: lines(
			"(APIServer pid=9) Traceback (most recent call last):",
			"(APIServer pid=9)     sock.bind(addr)",
			"(APIServer pid=9) OSError: [Errno 98] Address already in use")},
			CauseConfigError, "high", []int{3}, "Address already in use"},
		{"uvicorn bind failure after ready", Exit{ExitCode: 1, Phase: PhaseReady, Lines: lines(
			"ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use")},
			CauseConfigError, "high", []int{1}, "address already in use"},

		// Issue 13: more OOM strings.
		{"nccl driver path with the error number", Exit{ExitCode: 1, Lines: lines(
			"(VllmWorker rank=3 pid=15164) ERROR 06-19 07:06:13 [multiproc_executor.py:527] torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2",
			"(VllmWorker rank=3 pid=15164) ERROR 06-19 07:06:13 [multiproc_executor.py:527] ncclUnhandledCudaError: Call to CUDA function failed.",
			"(VllmWorker rank=3 pid=15164) ERROR 06-19 07:06:13 [multiproc_executor.py:527] Cuda failure 2 'out of memory'", failed)},
			CauseOOM, "high", []int{3}, "Cuda failure 2"},
		{"auto-fit max model len", Exit{ExitCode: 1, Lines: lines(
			"(EngineCore_DP0 pid=301) ValueError: Cannot auto-fit max_model_len: not enough GPU memory", failed)},
			CauseOOM, "high", []int{1}, "auto-fit"},
		{"accelerator error out of memory", Exit{ExitCode: 1, Lines: lines("torch.AcceleratorError: CUDA error: out of memory", initErr)},
			CauseOOM, "high", []int{1}, ""},
		// Issue 16: what the real corpus teaches.
		{"ray's OutOfMemoryError is host memory", Exit{ExitCode: 1, Lines: lines(
			"ERROR 03-21 17:27:44 [core.py:340] ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.")},
			CauseHostOOM, "high", []int{1}, "host memory"},
		{"raylet memory-pressure kill", Exit{Offline: true, Lines: lines(
			"(raylet) [2025-04-02 15:02:00,117 E 135782 135782] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons")},
			CauseHostOOM, "high", []int{1}, ""},
		{"a list of possible causes is not an OOM kill", Exit{Offline: true, Lines: lines(
			"ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
			"The actor is dead because its worker process has died. Some common causes include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray stop --force was called")},
			CauseCrash, "high", []int{1}, ""},
		{"exit 137 in a container", Exit{Offline: true, Lines: lines("vllm-1 exited with code 137")},
			CauseHostOOM, "high", []int{1}, ""},
		{"frames without the exception line are a crash", Exit{Offline: true, Lines: lines(
			`ERROR 01-20 18:39:37 engine.py:135]   File "/usr/local/lib/python3.12/dist-packages/vllm/engine/llm_engine.py", line 1390, in step`,
			"ERROR 01-20 18:39:37 engine.py:135]     outputs = self.model_executor.execute_model(")},
			CauseCrash, "low", []int{1}, "no exception line"},
		{"the KV check's raise without the exception line", Exit{Offline: true, Lines: lines(
			`  File "/x/vllm/v1/core/kv_cache_utils.py", line 588, in check_enough_kv_cache_memory`,
			"    raise ValueError(")},
			CauseKVInsufficient, "high", []int{2}, ""},
		{"the sampler warm-up's raise without the exception line", Exit{Offline: true, Lines: lines(
			`  File "/x/vllm/v1/worker/gpu_model_runner.py", line 3221, in _dummy_sampler_run`,
			"    raise RuntimeError(", "RuntimeError: CUDA out of")},
			CauseOOM, "high", []int{2}, ""},
		{"the sampler warm-up re-raising something else is no OOM", Exit{Offline: true, Lines: lines(
			`  File "/x/vllm/v1/worker/gpu_model_runner.py", line 3221, in _dummy_sampler_run`,
			"    raise e", "RuntimeError: something else")},
			CauseCrash, "low", []int{3}, ""},
		{"shm broadcast warnings alone are a hang", Exit{Offline: true, Lines: lines(
			"(EngineCore pid=2025) INFO 08-13 11:27:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.",
			"(EngineCore pid=2025) INFO 08-13 11:28:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.")},
			CauseHang, "low", []int{1, 2}, "2 shared-memory broadcast warning(s)"},
		{"a dead worker beats the shm warnings", Exit{Offline: true, Lines: lines(
			"DEBUG 07-04 17:35:10 [shm_broadcast.py:456] No available shared memory broadcast block found in 60 second.",
			"ERROR 07-04 17:35:16 [multiproc_executor.py:140] Worker proc VllmWorker-1 died unexpectedly, shutting down executor.")},
			CauseCrash, "high", []int{2}, ""},
		{"ray channel timeout is a hang", Exit{ExitCode: 0, Lines: lines(
			"ERROR 06-16 10:59:13 [core.py:505] ray.exceptions.RayChannelTimeoutError: System error: Timed out waiting for object available to read.", dead)},
			CauseHang, "high", []int{1}, ""},
		{"a broken install is a config error", Exit{ExitCode: 1, Lines: lines("ModuleNotFoundError: No module named 'vllm.entrypoints'")},
			CauseConfigError, "high", []int{1}, ""},
		{"V0 zero GPU blocks", Exit{ExitCode: 1, Lines: lines("INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: 0, # CPU blocks: 256")},
			CauseKVInsufficient, "high", []int{1}, ""},
		{"V0 some GPU blocks are no evidence", Exit{Offline: true, Lines: lines("INFO 11-07 17:53:33 gpu_executor.py:122] # GPU blocks: 4025, # CPU blocks: 4681")},
			"", "", nil, "no failure found"},
		{"host ENOMEM mapping the weights", Exit{ExitCode: 1, Lines: lines(
			"ERROR 06-02 09:39:03 [core.py:396] RuntimeError: unable to mmap 16933256392 bytes from file <model.safetensors>: Cannot allocate memory (12)")},
			CauseHostOOM, "high", []int{1}, ""},

		// Issue 25: rules from the source text of vLLM, PyTorch, gloo, Ray
		// and the kernel, not from one log.
		{"gloo refused an address family (a sandboxed unit) is a config error", Exit{ExitCode: 1, Lines: lines(
			"(EngineCore_DP0 pid=90) ERROR 01-04 15:58:26 [core.py:866] RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:178] socket: Address family not supported by protocol", failed)},
			CauseConfigError, "high", []int{1}, "Address family"},
		{"c10d's errno 97 warning on a host without IPv6 is no failure", Exit{Offline: true, Lines: lines(
			"[W socket.cpp:464] [c10d] The server socket cannot be initialized on [::]:29500 (errno: 97 - Address family not supported by protocol).",
			"[W1226 15:35:11.626067741 socket.cpp:752] [c10d] The client socket cannot be initialized to connect to [localhost]:29500 (errno: 97 - Address family not supported by protocol).",
			"[rank0]:[W socket.cpp:697] [c10d] The client socket cannot be initialized to connect to [localhost]:29500 (errno: 97 - Address family not supported by protocol).",
			ready)}, "", "", nil, "became ready"},
		{"NCCL's warning about an address family, while starting, is no failure", Exit{Offline: true, Lines: lines(
			"[W socket.cpp:464] [c10d] The server socket cannot be initialized on [::]:29500 (errno: 97 - Address family not supported by protocol).",
			"node1:2414:2469 [0] NCCL WARN Net : Socket creation failed : Address family not supported by protocol",
			"node1:2414:2469 [0] NCCL INFO Using network Socket")}, "", "", nil, "still starting"},
		{"PermissionError at startup is a config error", Exit{ExitCode: 1, Lines: lines(
			"(EngineCore_DP0 pid=90) PermissionError: [Errno 1] Operation not permitted", failed)},
			CauseConfigError, "high", []int{1}, "PermissionError"},
		{"the bare words operation not permitted are no evidence", Exit{Offline: true, Lines: lines(
			"node1:2414:2469 [0] NCCL INFO Failed to set CPU affinity: Operation not permitted")},
			"", "", nil, "still starting"},
		{"the kernel's oom-killer line", Exit{Offline: true, Lines: lines(
			"Dec 02 09:31:24 gpu-node-3 kernel: python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
			"Dec 02 09:31:24 gpu-node-3 kernel: oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/system.slice/vllm.service,task=python3,pid=4121,uid=998",
			"Dec 02 09:31:24 gpu-node-3 kernel: Memory cgroup out of memory: Killed process 4121 (python3) total-vm:98765432kB, anon-rss:61234567kB, file-rss:0kB")},
			CauseHostOOM, "high", []int{1, 2, 3}, "oom-killer"},
		{"ray's older list of guesses is not an OOM kill", Exit{Offline: true, Lines: lines(
			"ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
			"Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.")},
			CauseCrash, "high", []int{1}, ""},
		{"requests at 0 tokens/s for minutes while serving are a hang", Exit{Offline: true, Lines: append(lines(ready), stats(2, 13, 10, 0, 1)...)},
			CauseHang, "low", []int{2, 14}, "0 tokens/s over 2m0s"},
		{"0 tokens/s lines without time stamps, a dozen of them", Exit{Offline: true, Lines: append(lines(ready), stats(2, 12, 0, 0, 1)...)},
			CauseHang, "low", []int{2, 13}, "12 stats lines"},
		{"a stall that recovers is no hang", Exit{Offline: true, Lines: append(append(lines(ready), stats(2, 13, 10, 0, 1)...), stats(15, 1, 10, 25.5, 1)...)},
			"", "", nil, "became ready"},
		{"30 s at 0 tokens/s is unknown", Exit{Offline: true, Lines: append(lines(ready), stats(2, 4, 10, 0, 1)...)},
			CauseUnknown, "low", []int{2, 5}, "unknown"},
		{"idle stats lines are no stall", Exit{Offline: true, Lines: append(lines(ready), stats(2, 20, 10, 0, 0)...)},
			"", "", nil, "became ready"},
		{"one broadcast warning while starting is unknown (compilation)", Exit{Offline: true, Lines: lines(
			"(EngineCore pid=2025) INFO 08-13 11:27:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).")},
			CauseUnknown, "low", []int{1}, "unknown"},
		{"one broadcast warning while serving is a hang", Exit{Offline: true, Lines: lines(ready,
			"(APIServer pid=1) INFO:     127.0.0.1:56038 - \"GET /health HTTP/1.1\" 200 OK",
			"(EngineCore pid=2025) INFO 08-13 11:27:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.",
			"(APIServer pid=1) INFO:     127.0.0.1:56038 - \"GET /health HTTP/1.1\" 200 OK")},
			CauseHang, "low", []int{3}, "1 shared-memory broadcast warning(s)"},
		{"uvicorn's access lines alone say it serves (the log starts after its startup line)", Exit{Offline: true, Lines: lines(
			"(APIServer pid=1) INFO:     127.0.0.1:56038 - \"GET /v1/videos/x HTTP/1.1\" 200 OK",
			"(EngineCore pid=2025) INFO 08-13 11:27:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.",
			"(APIServer pid=1) INFO:     127.0.0.1:56038 - \"GET /v1/videos/x HTTP/1.1\" 200 OK")},
			CauseHang, "low", []int{2}, "1 shared-memory broadcast warning(s)"},
		{"broadcast warnings while compiling, then ready, are no hang", Exit{Offline: true, Lines: lines(
			"(EngineCore pid=2025) INFO 08-13 11:27:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.",
			"(EngineCore pid=2025) INFO 08-13 11:28:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.",
			ready)}, "", "", nil, "became ready"},
		{"a shutdown that never finished is unknown", Exit{Offline: true, Lines: lines(ready,
			"(APIServer pid=1) INFO 08-13 11:27:02 [launcher.py:80] Shutting down FastAPI HTTP server.",
			"(APIServer pid=1) INFO:     Shutting down")},
			CauseUnknown, "low", []int{2}, "began shutting down at line 2"},
		{"a shutdown that finished is no failure", Exit{Offline: true, Lines: lines(ready,
			"(APIServer pid=1) INFO:     Shutting down", "(APIServer pid=1) INFO:     Waiting for application shutdown.",
			"(APIServer pid=1) INFO:     Application shutdown complete.")},
			"", "", nil, "became ready"},
		{"a shutdown that hangs", Exit{Offline: true, Lines: lines(ready,
			"(APIServer pid=1) INFO:     Shutting down",
			"(APIServer pid=1) INFO:     Waiting for connections to close. (CTRL+C to force quit)",
			"(EngineCore pid=2025) INFO 08-13 11:27:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.",
			"(EngineCore pid=2025) INFO 08-13 11:28:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.")},
			CauseHang, "low", []int{4, 5}, "while shutting down"},
		{"errors while starting that name no cause are unknown", Exit{Offline: true, Lines: lines(
			"(APIServer pid=1) INFO 04-15 10:00:00 [api_server.py:1043] vLLM API server version 0.8.4",
			"(EngineCore_0 pid=312) ERROR 04-15 10:00:05 [x.py:1] something went wrong in a way no rule knows",
			"(EngineCore_0 pid=312) CRITICAL 04-15 10:00:06 [x.py:2] and again")},
			CauseUnknown, "low", []int{2, 3}, "2 error line(s) while starting"},
		{"errors after ready are no failure", Exit{Offline: true, Lines: lines(ready,
			"(APIServer pid=1) ERROR 04-15 10:00:05 [serving_chat.py:1] a request was rejected")},
			"", "", nil, "became ready"},
		{"live, a stall sign alone is a crash, never unknown", Exit{ExitCode: 0, Lines: lines(ready,
			"(EngineCore pid=2025) INFO 08-13 11:27:02 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds.")},
			CauseCrash, "low", nil, "code 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := Classify(tc.e)
			if v.Cause != tc.cause || v.Confidence != tc.conf {
				t.Fatalf("got %q/%q, want %q/%q (summary %q, evidence %v)", v.Cause, v.Confidence, tc.cause, tc.conf, v.Summary, v.Evidence)
			}
			var got []int
			for _, l := range v.Evidence {
				got = append(got, l.N)
			}
			if len(got) != len(tc.evidence) {
				t.Fatalf("evidence lines %v, want %v", got, tc.evidence)
			}
			for i := range got {
				if got[i] != tc.evidence[i] {
					t.Fatalf("evidence lines %v, want %v", got, tc.evidence)
				}
			}
			if !strings.Contains(v.Summary, tc.summary) {
				t.Errorf("summary %q, want it to contain %q", v.Summary, tc.summary)
			}
			if (v.Cause == "") != (len(v.Advice) == 0) {
				t.Errorf("advice %v for cause %q", v.Advice, v.Cause)
			}
			checkEvidence(t, tc.e.Lines, v)
		})
	}
}

// stats returns n of vLLM's V1 stats lines numbered from first, every
// every seconds (0: no time stamps), each with the generation throughput gen
// and running requests.
func stats(first, n, every int, gen float64, running int) []Line {
	out := make([]Line, n)
	t0 := time.Date(0, 8, 13, 11, 27, 2, 0, time.UTC)
	for i := range out {
		msg := fmt.Sprintf("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%%, Prefix cache hit rate: 0.0%%", gen, running)
		text := "(APIServer pid=1) " + msg
		if every > 0 {
			text = "(APIServer pid=1) INFO " + t0.Add(time.Duration(i*every)*time.Second).Format(vllmlog.StampLayout) + " [loggers.py:271] " + msg
		}
		out[i] = Line{N: first + i, Text: text}
	}
	return out
}

// TestSandboxAdvice: a sandbox's refusal says where to look, not "fix the
// vLLM arguments".
func TestSandboxAdvice(t *testing.T) {
	for _, l := range []string{
		"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:178] socket: Address family not supported by protocol",
		"PermissionError: [Errno 1] Operation not permitted",
	} {
		v := Classify(Exit{ExitCode: 1, Lines: lines(l)})
		if v.Cause != CauseConfigError || len(v.Advice) == 0 || !strings.Contains(v.Advice[0], "RestrictAddressFamilies=") {
			t.Errorf("%q: verdict %q, advice %q: want config_error and the sandbox advice", l, v.Cause, v.Advice)
		}
	}
}

// TestEvidenceDeduplicated: four workers printing the same OOM are one line.
// TestClientTextIsNeverEvidence: uvicorn's access lines copy a client's
// path and query, and vLLM may log prompts: neither makes a cause (issue
// 24 item 2: one GET /v1/models?OutOfMemoryError turned the next crash
// into an OOM).
func TestClientTextIsNeverEvidence(t *testing.T) {
	const (
		ready = "(APIServer pid=1) INFO:     Application startup complete."
		died  = "(APIServer pid=1) ERROR 07-22 09:00:00 [core_client.py:564] Engine core proc EngineCore_0 died unexpectedly, shutting down client."
	)
	for _, hostile := range []string{
		`(APIServer pid=1) INFO:     10.0.0.9:40000 - "GET /v1/models?OutOfMemoryError HTTP/1.1" 200 OK`,
		`(APIServer pid=1) INFO:     10.0.0.9:40000 - "GET /v1/models?CUDA%20out%20of%20memory HTTP/1.1" 200 OK`,
		`(APIServer pid=1) INFO 07-22 09:00:00 [logger.py:41] Received request cmpl-1: prompt: 'torch.OutOfMemoryError: CUDA out of memory.', params: SamplingParams(n=1)`,
		`(APIServer pid=1) INFO 07-22 09:00:00 [logger.py:60] Generated response cmpl-1: output: 'less than desired GPU memory utilization'`,
	} {
		v := Classify(Exit{ExitCode: 0, Phase: PhaseReady, Lines: lines(ready, hostile, died)})
		if v.Cause != CauseCrash {
			t.Errorf("%s\n  made the cause %s (evidence %+v), want crash", hostile, v.Cause, v.Evidence)
		}
	}
}

func TestEvidenceDeduplicated(t *testing.T) {
	var ls []string
	for i := 0; i < 4; i++ {
		ls = append(ls, "(VllmWorker rank="+string(rune('0'+i))+" pid=40"+string(rune('0'+i))+") torch.OutOfMemoryError: CUDA out of memory.")
	}
	v := Classify(Exit{ExitCode: 1, Lines: lines(ls...)})
	if v.Cause != CauseOOM || len(v.Evidence) != 1 || v.Evidence[0].N != 1 {
		t.Fatalf("%+v", v)
	}
}

func TestDiagnoseFacts(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "logs", "v1-2025-ansi-ready.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := Diagnose(f)
	if err != nil {
		t.Fatal(err)
	}
	x := rep.Facts
	if x.VLLMVersion != "0.10.1.1" || x.Model != "Qwen/Qwen2.5-7B-Instruct" || x.GPUMemoryUtilization != 0.85 || x.MaxNumSeqs != 256 ||
		x.MaxModelLen != 32768 || x.KVCacheTokens != 425424 || x.AvailableKVCacheGiB == nil || *x.AvailableKVCacheGiB != 16.23 ||
		x.ModelLoadGiB != 15.2683 || x.ModelLoadSeconds != 5.012816 || x.InitEngineSeconds != 38.21 || !x.Ready || x.Runs != 1 ||
		!strings.HasPrefix(x.MaxConcurrency, "32,768 tokens per request: 12.98x") || !strings.Contains(x.NonDefaultArgs, "'max_num_seqs': 256") {
		t.Errorf("facts: %+v", x)
	}

	f0, err := os.ReadFile(filepath.Join("testdata", "logs", "v0-2024-kv-maxseqlen.log"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err = Diagnose(bytes.NewReader(f0))
	if err != nil {
		t.Fatal(err)
	}
	x = rep.Facts
	if x.VLLMVersion != "0.6.3.post1" || x.GPUMemoryUtilization != 0.9 || x.MaxNumSeqs != 256 || x.MaxModelLen != 131072 ||
		x.KVCacheBlocks != 1478 || x.ModelLoadGiB != 14.9888 || x.Ready {
		t.Errorf("V0 facts: %+v", x)
	}

	f2, err := os.ReadFile(filepath.Join("testdata", "logs", "2026-negative-kv.log"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err = Diagnose(bytes.NewReader(f2))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Facts.AvailableKVCacheGiB == nil || *rep.Facts.AvailableKVCacheGiB != -2.14 {
		t.Errorf("negative KV memory: %v", rep.Facts.AvailableKVCacheGiB)
	}
}

// TestWriteTextOrder: next steps follow the postmortem's order.
func TestWriteTextOrder(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "logs", "2026-oom-runtime.log"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Diagnose(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	last := -1
	for _, s := range []string{"cause:      oom", "evidence:", "facts:", "advice:", "next steps:", "memory trend", "the log", "concurrency and utilization together", "probe alignment"} {
		i := strings.Index(out, s)
		if i < 0 || i < last {
			t.Fatalf("%q missing or out of order in:\n%s", s, out)
		}
		last = i
	}
}

func TestDiagnoseEmptyAndErrors(t *testing.T) {
	rep, err := Diagnose(strings.NewReader(""))
	if err != nil || rep.Cause != "" || rep.Lines != 0 {
		t.Fatalf("empty log: %+v, %v", rep, err)
	}
	if _, err := Diagnose(errReader{}); err == nil || !strings.Contains(err.Error(), "reading the log") {
		t.Fatalf("read error: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, os.ErrClosed }

// TestPrefilterCoversRules: every needle passes the prefilter, or its rule
// could never fire.
func TestPrefilterCoversRules(t *testing.T) {
	for _, r := range rules {
		if !mayMatch(r.needle) {
			t.Errorf("rule %q is hidden by the prefilter", r.needle)
		}
	}
	for _, w := range wrappers {
		if !mayMatch(w) {
			t.Errorf("wrapper %q is hidden by the prefilter", w)
		}
	}
}

// Live, the guard's lines are one run: stderr and stdout interleave, so a
// traceback can come before the banner of the same run on stdout.
func TestLiveLinesAreOneRunWhateverTheOrder(t *testing.T) {
	lines := []Line{
		{N: 1, Stream: "stdout", Text: "(APIServer pid=1) INFO 12-02 10:56:33 [api_server.py:1805] vLLM API server version 0.11.0"},
		{N: 2, Stream: "stderr", Text: "(APIServer pid=1) Traceback (most recent call last):"},
		{N: 3, Stream: "stderr", Text: "(APIServer pid=1)     sock.bind(addr)"},
		{N: 4, Stream: "stderr", Text: "(APIServer pid=1) OSError: [Errno 98] Address already in use"},
		{N: 5, Stream: "stdout", Text: "(APIServer pid=1) INFO 12-02 10:56:33 [utils.py:233] non-default args: {'model_tag': 'm'}"},
	}
	v := Classify(Exit{Lines: lines, ExitCode: 1, Phase: PhaseStarting})
	if v.Cause != CauseConfigError || len(v.Evidence) == 0 || v.Evidence[0].N != 4 {
		t.Fatalf("verdict %+v: want config_error from line 4", v)
	}
}

// vLLM 0.32.0's KV error wraps: the frame's code line ("raise ValueError(")
// comes before the message; the summary names the exception (seen on the
// real vLLM, integration/realvllm).
func TestSummaryNamesTheExceptionNotTheRaise(t *testing.T) {
	ev := []Line{{N: 70, Text: "(EngineCore pid=1) ERROR 12-03 06:44:57 [core.py:1510]     raise ValueError("},
		{N: 71, Text: "(EngineCore pid=1) ERROR 12-03 06:44:57 [core.py:1510] ValueError: To serve at least one request with the model's max seq len (4096)"}}
	got := summaryFor(CauseKVInsufficient, ev)
	if !strings.Contains(got, "line 71: ValueError: To serve") {
		t.Fatalf("summary %q, want the exception's line", got)
	}
	if got := (Verdict{Evidence: ev}).Words(); !strings.HasPrefix(got, "line 71: ValueError: To serve") {
		t.Fatalf("the decision's reason quotes %q, want the exception's line", got)
	}
}

// A run the group ended on this host is recorded as what it is: the
// group's end, with the member's rank and word, not a hang with NCCL's
// advice; a memory cause in this host's own log still wins.
func TestTheGroupsEndIsItsOwnCause(t *testing.T) {
	g := &GroupEnd{Epoch: 3, Rank: 1, Said: "ended", Why: "member 1's guard says its vLLM ended"}
	v := Classify(Exit{ExitCode: -1, Signal: "SIGKILL", SignalByGuard: true, Hang: "the group's epoch 3 ended", Group: g, Phase: PhaseReady})
	if v.Cause != CauseGroup || v.Group == nil || v.Group.Rank != 1 || v.Group.Said != "ended" {
		t.Fatalf("verdict %+v, want group naming member 1 and its word", v)
	}
	if !strings.Contains(v.Summary, "member 1's guard says its vLLM ended") || !strings.Contains(v.Summary, "epoch 3") {
		t.Errorf("summary %q names neither the member nor the epoch", v.Summary)
	}
	for _, a := range v.Advice {
		if strings.Contains(a, "NCCL") {
			t.Errorf("advice on NCCL for the group's end: %q", a)
		}
	}
	if len(v.Advice) == 0 || !strings.Contains(v.Advice[0], "member 1's host") {
		t.Errorf("advice %q does not point at member 1's host", v.Advice)
	}
	lost := Classify(Exit{ExitCode: -1, Signal: "SIGKILL", SignalByGuard: true, Hang: "x", Group: &GroupEnd{Epoch: 2, Why: "the leader not heard for the loss timeout"}})
	if lost.Cause != CauseGroup || !strings.Contains(lost.Advice[0], "not heard") {
		t.Errorf("a lost leader: %+v", lost)
	}
	oom := Classify(Exit{ExitCode: -1, Signal: "SIGKILL", SignalByGuard: true, Hang: "x", Group: g,
		Lines: []Line{{N: 1, Text: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}}})
	if oom.Cause != CauseOOM {
		t.Errorf("this host's own OOM before the group's end: %s, want oom", oom.Cause)
	}
}
