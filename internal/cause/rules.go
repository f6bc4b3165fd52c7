// The classifier's rules: what each needle in vLLM's output means, how much
// it weighs against the others, and the conditions a line must also meet.

package cause

import (
	"strings"
)

// Scores rank root causes when a log holds several: an OOM inside NCCL is an
// OOM, a free-memory check failure explains the KV error that may follow it,
// and a configuration error beats the generic crash lines it produces.
const (
	scoreOOM       = 100
	scoreGPUFault  = 95 // the GPU's hardware said so: beats the crash it causes
	scoreHostOOM   = 90
	scoreGPUBusy   = 80
	scoreKV        = 70
	scoreConfig    = 55 // argparse, model not found, port in use
	scoreValueErr  = 50 // other startup ValueErrors unrelated to memory, a broken install
	scoreTimeout   = 35 // a collective or a Ray channel timed out: the engine was stuck
	scoreCrash     = 30 // NCCL errors, segfaults, CUDA errors
	scoreDied      = 20 // "died unexpectedly"
	scoreStuck     = 15 // vLLM's own "stuck" warning: a hang only when nothing else explains the log
	scoreException = 10 // any other exception line: evidence, never proof of a failure
)

type rule struct {
	needle string
	cause  Cause
	score  int
}

// ruleCond is a condition a rule's line must meet besides holding its
// needle, and the rule's name.
type ruleCond struct {
	name string
	also func(msg string) bool
}

// ruleAlso: the rules whose needle alone would say too much, by needle.
var ruleAlso = map[string]ruleCond{
	"out of memory": {ruleGPURuntimeOOM, namesGPURuntime},
	"RPC call to ":  {ruleRPCTimeout, func(msg string) bool { return strings.Contains(msg, " timed out") }},
}

// ruleNames: needles that are one rule together, because one mechanism of
// one program prints them all (see the comments at the rules).
var ruleNames = map[string]string{
	"ray.exceptions.OutOfMemoryError":                       ruleRayMemoryMonitor,
	"Task was killed due to the node running low on memory": ruleRayMemoryMonitor,
	"killed due to memory pressure":                         ruleRayMemoryMonitor,
	"Ray killed this worker":                                ruleRayMemoryMonitor,
}

// ruleIDs and ruleConds are per rule (same index): its id and its extra
// condition (nil for none). A rule's id is its needle, or its name in
// ruleAlso; the leave-one-group-out pass of the report
// (policy/real_test.go) switches rules off by id, and the structural checks
// below have ids of their own (ruleArgparse …).
var (
	ruleIDs   []string
	ruleConds []func(string) bool
)

func init() {
	ruleIDs = make([]string, len(rules))
	ruleConds = make([]func(string) bool, len(rules))
	for i, r := range rules {
		ruleIDs[i] = r.needle
		if n, ok := ruleNames[r.needle]; ok {
			ruleIDs[i] = n
		}
		if c, ok := ruleAlso[r.needle]; ok {
			ruleIDs[i], ruleConds[i] = c.name, c.also
		}
	}
}

// namesGPURuntime: the line comes from CUDA, ROCm or NCCL's CUDA calls.
func namesGPURuntime(msg string) bool {
	return strings.Contains(msg, "CUDA") || strings.Contains(msg, "Cuda") || strings.Contains(msg, "cuda") || strings.Contains(msg, "HIP")
}

// rules are tried in order; the first that matches decides a line. Needles
// are literal (strings.Contains, no regexp) to keep Classify fast. Each says
// where its text comes from: the program that prints it, so that a rule
// holds for logs nobody here has seen, not only for the corpus log that
// showed it first.
var rules = []rule{
	// Ray's OutOfMemoryError is its memory monitor killing a worker for host
	// memory; it must come before the GPU rule below. Ray:
	// python/ray/exceptions.py (OutOfMemoryError) and the raylet's
	// src/ray/raylet/node_manager.cc, which prints "N Workers (tasks /
	// actors) killed due to memory pressure (OOM), M Workers crashed due to
	// other reasons at node …" and, in the task's error, "Task was killed due
	// to the node running low on memory. … Ray killed this worker …".
	// Not a rule: Ray's "Worker unexpectedly exits … There are some potential
	// root causes. (1) The process is killed by SIGKILL by OOM killer due to
	// high memory usage. (2) ray stop --force is called. (3) … SIGSEGV"
	// (src/ray/core_worker, gcs): a list of guesses, evidence of nothing.
	// One rule, one mechanism (ruleRayMemoryMonitor): these four are what
	// Ray's memory monitor says when it kills a worker.
	{"ray.exceptions.OutOfMemoryError", CauseHostOOM, scoreHostOOM},
	{"Task was killed due to the node running low on memory", CauseHostOOM, scoreHostOOM},
	{"killed due to memory pressure", CauseHostOOM, scoreHostOOM},
	{"Ray killed this worker", CauseHostOOM, scoreHostOOM},

	// PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp: "CUDA
	// out of memory. Tried to allocate …", raised as torch.OutOfMemoryError).
	{"OutOfMemoryError", CauseOOM, scoreOOM},
	{"CUDA out of memory", CauseOOM, scoreOOM},
	// One rule, one fact: CUDA's error string for a failed allocation,
	// "out of memory" (cudaGetErrorString(cudaErrorMemoryAllocation), the
	// driver's CUDA_ERROR_OUT_OF_MEMORY), whoever prints it: torch's "CUDA
	// error: out of memory" (c10/cuda/CUDAException.h, also as
	// torch.AcceleratorError), c10's "CUDA driver error: out of memory",
	// NCCL's CUDACHECK (src/include/checks.h: "Cuda failure %d '%s'", so
	// "Cuda failure 2 'out of memory'"), ROCm's "HIP out of memory". It must
	// come before the generic "CUDA error:" crash rule; the kernel's "Memory
	// cgroup out of memory" names no GPU runtime.
	{"out of memory", CauseOOM, scoreOOM}, // and namesGPURuntime (ruleAlso)
	// vLLM's --max-model-len auto (vllm/config: "Cannot auto-fit
	// max_model_len"), cuBLAS's status name for a failed allocation.
	{"Cannot auto-fit max_model_len", CauseOOM, scoreOOM},
	{"CUBLAS_STATUS_ALLOC_FAILED", CauseOOM, scoreOOM},

	// Host memory.
	// systemd (src/core/unit.c, unit_log_failure… "A process of this unit
	// has been killed by the OOM killer."); Ray's own "killed by the OOM
	// killer" is a guess in a list (above).
	{"has been killed by the OOM killer", CauseHostOOM, scoreHostOOM},
	// strerror(ENOMEM). PyTorch's MapAllocator (aten/src/ATen/MapAllocator.cpp:
	// "unable to mmap %d bytes from file <%s>: Cannot allocate memory (12)")
	// while mapping a safetensors file, Python's OSError "[Errno 12] Cannot
	// allocate memory" from fork or mmap: the host, never the GPU (CUDA says
	// "out of memory").
	{"Cannot allocate memory", CauseHostOOM, scoreHostOOM},
	// docker compose ("exited with code 137") and platforms' words for a
	// SIGKILLed container (128+9), Kubernetes' reason "OOMKilled".
	{"exited with code 137", CauseHostOOM, scoreHostOOM},
	{"exit code 137", CauseHostOOM, scoreHostOOM},
	{"OOMKilled", CauseHostOOM, scoreHostOOM},
	// The kernel, mm/oom_kill.c: dump_header's "%s invoked oom-killer:
	// gfp_mask=…", dump_oom_summary's "oom-kill:constraint=…,task=…", and
	// __oom_kill_process's "%s: Killed process %d (%s) total-vm:…", where %s
	// is "Out of memory" or "Memory cgroup out of memory" (a journal or dmesg
	// excerpt pasted with vLLM's output).
	{"Out of memory: Killed process", CauseHostOOM, scoreHostOOM},
	{"Memory cgroup out of memory", CauseHostOOM, scoreHostOOM},
	{"oom-kill:", CauseHostOOM, scoreHostOOM},
	{"invoked oom-killer:", CauseHostOOM, scoreHostOOM},

	// vLLM's free-memory check at startup (vllm/v1/worker/gpu_worker.py,
	// vllm/utils: "Free memory on device (…) on startup is less than desired
	// GPU memory utilization (…)") and V0's profiling assertion.
	{"less than desired GPU memory utilization", CauseGPUBusy, scoreGPUBusy},
	// vLLM 0.32.0 (v1/worker/utils.py) when weights are held by another
	// process: "Free memory on device cuda:0 (…) on startup is less than
	// the engine's budget after excluding external process's weights".
	{"on startup is less than the engine's budget", CauseGPUBusy, scoreGPUBusy},
	{"Error in memory profiling", CauseGPUBusy, scoreGPUBusy},

	// vLLM's KV cache checks: V0 raise_if_cache_size_invalid and
	// determine_num_available_blocks ("No available memory for the cache
	// blocks", "# GPU blocks: 0"), V1 vllm/v1/core/kv_cache_utils.py
	// check_enough_kv_cache_memory ("… is larger than the available KV cache
	// memory", "… larger than the maximum number of tokens that can be stored
	// in KV cache") and the worker's "Available KV cache memory: -…".
	{"No available memory for the cache blocks", CauseKVInsufficient, scoreKV},
	{"larger than the available KV cache memory", CauseKVInsufficient, scoreKV},
	{"larger than the maximum number of tokens that can be stored in KV cache", CauseKVInsufficient, scoreKV},
	{"Available KV cache memory: -", CauseKVInsufficient, scoreKV},
	{"# GPU blocks: 0,", CauseKVInsufficient, scoreKV},

	// argparse ("unrecognized arguments"), strerror(EADDRINUSE), and
	// huggingface_hub's and transformers' errors for a model that is not
	// there (huggingface_hub/errors.py, utils/_validators.py,
	// transformers/utils/hub.py), Python's FileNotFoundError.
	{"unrecognized arguments", CauseConfigError, scoreConfig},
	{"ddress already in use", CauseConfigError, scoreConfig},
	{"RepositoryNotFoundError", CauseConfigError, scoreConfig},
	{"Repository Not Found", CauseConfigError, scoreConfig},
	{"is not a local folder and is not a valid model identifier", CauseConfigError, scoreConfig},
	{"Incorrect path_or_model_id", CauseConfigError, scoreConfig},
	{"Invalid repository ID or local directory", CauseConfigError, scoreConfig},
	{"HFValidationError", CauseConfigError, scoreConfig},
	{"GatedRepoError", CauseConfigError, scoreConfig},
	{"Cannot access gated repo", CauseConfigError, scoreConfig},
	{"LocalEntryNotFoundError", CauseConfigError, scoreConfig},
	{"does not appear to have a file named", CauseConfigError, scoreConfig},
	{"FileNotFoundError", CauseConfigError, scoreConfig},

	// Hangs the engine reports itself. PyTorch's NCCL watchdog
	// (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: "[Rank N] Watchdog
	// caught collective operation timeout: WorkNCCL(…) ran for N
	// milliseconds before timing out."), Ray compiled graphs' channel
	// timeout (python/ray/exceptions.py RayChannelTimeoutError, "Timed out
	// waiting for object available to read"). vLLM's shared-memory
	// broadcast (vllm/distributed/device_communicators/shm_broadcast.py:
	// "No available shared memory broadcast block found in %s seconds. This
	// typically happens when some processes are hanging or doing some
	// time-consuming work (e.g. compilation, …)", every
	// VLLM_RINGBUFFER_WARNING_INTERVAL, 60 s) is only a sign: see
	// stallVerdict.
	{"Watchdog caught collective operation timeout", CauseHang, scoreTimeout},
	// vLLM's multiprocessing executor waiting on its workers
	// (v1/executor/multiproc_executor.py: raise TimeoutError(f"RPC call to
	// {method} timed out.") from the shared-memory queue's own bare
	// TimeoutError, see frameRules) and the engine client waiting on the
	// engine (v1/engine/core_client.py: "Timed out waiting for engine core
	// processes to start."): the engine was stuck, not crashed. Users' logs:
	// vllm-project/vllm issues #17965, #19668, #48801; kvcache-ai/Mooncake
	// #1458; verl-project/verl #6583; intel/llm-scaler #77.
	{"RPC call to ", CauseHang, scoreTimeout}, // and " timed out" (ruleAlso)
	{"Timed out waiting for engine core processes to start", CauseHang, scoreTimeout},
	{"RayChannelTimeoutError", CauseHang, scoreTimeout},
	{"Timed out waiting for object available to read", CauseHang, scoreTimeout},
	{shmStall, CauseHang, scoreStuck},

	// The GPU's hardware (gpu_fault). CUDA's error strings
	// (cudaGetErrorString / cuGetErrorString): cudaErrorECCUncorrectable
	// "uncorrectable ECC error encountered" (the driver's
	// CUDA_ERROR_ECC_UNCORRECTABLE), cudaErrorLaunchFailure "unspecified
	// launch failure" (a kernel died on the GPU; the driver logs an XID
	// beside it), cudaErrorNvlinkUncorrectable "uncorrectable NVLink error
	// was detected during the execution"; NVML's NVML_ERROR_GPU_IS_LOST
	// "GPU is lost" (nvidia-smi: "Unable to determine the device handle for
	// GPU …: GPU is lost. Reboot the system to recover this GPU"); the
	// kernel driver's XID report "NVRM: Xid (PCI:0000:3b:00): 79, pid=…,
	// GPU has fallen off the bus." pasted beside vLLM's output. An illegal
	// memory access or NCCL's unhandled CUDA error with an Xid line in the
	// same log is the GPU's (the Xid line decides, it scores above them);
	// without one it stays a crash (usually a software bug). They come
	// before the generic "CUDA error:" rule below.
	{"uncorrectable ECC error encountered", CauseGPUFault, scoreGPUFault},
	{"CUDA_ERROR_ECC_UNCORRECTABLE", CauseGPUFault, scoreGPUFault},
	{"unspecified launch failure", CauseGPUFault, scoreGPUFault},
	{"uncorrectable NVLink error", CauseGPUFault, scoreGPUFault},
	{"GPU is lost", CauseGPUFault, scoreGPUFault},
	{"fallen off the bus", CauseGPUFault, scoreGPUFault},
	{"Xid (PCI:", CauseGPUFault, scoreGPUFault},

	// NCCL's result names (src/include/nccl.h ncclResult_t, printed by
	// torch as "NCCL error: …"), CUDA's kernel faults, the C runtime's and
	// Python's fatal signals, and the executors' words for a dead worker.
	{"NCCL error", CauseCrash, scoreCrash},
	{"ncclSystemError", CauseCrash, scoreCrash},
	{"ncclInternalError", CauseCrash, scoreCrash},
	{"ncclUnhandledCudaError", CauseCrash, scoreCrash},
	{"ncclRemoteError", CauseCrash, scoreCrash},
	{"illegal memory access", CauseCrash, scoreCrash},
	{"device-side assert triggered", CauseCrash, scoreCrash},
	// ROCm's HSA runtime, on an invalid GPU address ("Memory access fault
	// by GPU node-2 (Agent handle: 0x…) on address 0x…. Reason: Page not
	// present or supervisor privilege."), printed bare before the abort:
	// AMD's illegal memory access, usually the application's. Users' logs:
	// vllm-project/vllm issues #35169, #16840; ROCm/legacy-rocm-build #5051.
	{"Memory access fault by GPU node", CauseCrash, scoreCrash},
	{"CUDA error:", CauseCrash, scoreCrash},
	{"Segmentation fault", CauseCrash, scoreCrash},
	{"SIGSEGV", CauseCrash, scoreCrash},
	{"Fatal Python error", CauseCrash, scoreCrash},
	{"core dumped", CauseCrash, scoreCrash},
	{"died unexpectedly", CauseCrash, scoreDied},
	{"exited with exit code", CauseCrash, scoreDied}, // a platform's word for a worker's death
}

// kernelRules are the kernel's own lines (NVRM's XID report): evidence
// in a saved journal, never in vLLM's output, where they can only be a
// quote.
var kernelRules = map[string]bool{"fallen off the bus": true, "Xid (PCI:": true}

// shmStall is vLLM's shared-memory broadcast warning (see rules).
const shmStall = "No available shared memory broadcast block found"

// addressFamilyRefused is strerror(EAFNOSUPPORT). systemd's
// RestrictAddressFamilies= makes socket() fail with it (its seccomp filter,
// src/shared/seccomp-util.c, returns EAFNOSUPPORT), and gloo, which vLLM
// uses for its CPU process groups, raises it as a RuntimeError
// (third_party/gloo/gloo/transport/tcp/pair.cc and device.cc: "[enforce fail
// at …/gloo/transport/tcp/….cc:N] … Address family not supported by
// protocol"): a deployment sandbox that a restart cannot change, reported as
// config_error. PyTorch's c10d prints the same errno as a harmless warning
// when a host has no IPv6 ("[W socket.cpp:697] [c10d] The client socket
// cannot be initialized to connect to [localhost]:29500 (errno: 97 - Address
// family not supported by protocol)") and then succeeds over IPv4, and
// NCCL's INFO/WARN lines report a socket it could not open before it tries
// the next: a warning line is never evidence (isTorchWarning; a fatal NCCL
// failure says "NCCL error" after it).
const addressFamilyRefused = "Address family not supported by protocol"

// isTorchWarning recognises c10's warning prefix, "[W socket.cpp:697] " or
// "[W1226 15:35:11.626067741 socket.cpp:752] ", possibly behind "[rank0]:".
func isTorchWarning(msg string) bool {
	if strings.HasPrefix(msg, "[rank") {
		if i := strings.Index(msg, "]:"); i > 0 && i < 16 {
			msg = msg[i+2:]
		}
	}
	return strings.HasPrefix(msg, "[W") && len(msg) > 2 && (msg[2] == ' ' || isDigit(msg[2]))
}

// frameRules name functions (or a file) of vLLM whose "raise" (the source
// line Python prints under the frame) says what failed, for excerpts cut
// before the exception line. The raise must start with raise.
var frameRules = []struct {
	fn, raise string
	cause     Cause
	score     int
}{
	{"in check_enough_kv_cache_memory", "raise ValueError(", CauseKVInsufficient, scoreKV},  // V1 KV check
	{"in _check_enough_kv_cache_memory", "raise ValueError(", CauseKVInsufficient, scoreKV}, // V1 KV check, later name
	{"in raise_if_cache_size_invalid", "raise ValueError(", CauseKVInsufficient, scoreKV},   // V0 KV check
	{"in _dummy_sampler_run", "raise RuntimeError(", CauseOOM, scoreOOM},                    // the sampler warm-up OOM
	// shm_broadcast.py: a worker never answered. The raise sits in acquire_read
	// (0.8-0.20) or in its read deadline's timeout_ms (2026 builds,
	// eugr/spark-vllm-docker#348): any frame of that file that raises it.
	{`shm_broadcast.py", line `, "raise TimeoutError", CauseHang, scoreTimeout},
}

// wrappers only say that the engine died; the root cause is above them.
var wrappers = []string{
	"EngineCore failed to start",
	"Engine core initialization failed",
	"EngineCore encountered a fatal error",
	"EngineCore encountered an issue",
	"AsyncLLM output_handler failed",
	"Got fatal signal from worker processes",
	"EngineDeadError",
	"MQLLMEngine is already dead",
	"Engine loop has died",
	"Engine process failed to start",
}

// prefilter: a line that holds none of these cannot match any rule, wrapper
// or exception, and skips the rule loop (most lines of a log).
// Keep it in step with rules, wrappers and the exception/argparse checks
// (TestPrefilterCoversRules).
var prefilter = []string{"rror", "emory", "died", "NCCL", "nccl", "fault", "Fatal", "ound", "in use",
	"unrecognized", "OOM", "oom-kill", "dumped", "illegal", "assert", "xception", "ngine", "_FAILED", "Value error",
	"stored in KV", "model identifier", "path_or_model_id", "repository ID", "gated repo", "file named", "Watchdog", "SIGSEGV", "output_handler",
	"Timed out", "auto-fit", "exit code", "exited with code", "killed", "fatal signal", "blocks: 0,", "oom-killer", "Address family",
	"ECC", "launch failure", "NVLink", "GPU is lost", "off the bus", "Xid", "RPC call to ", "engine's budget"}

func mayMatch(msg string) bool {
	for _, p := range prefilter {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// isArgparseError recognises "vllm serve: error: …" / "api_server.py: error: …".
func isArgparseError(msg string) bool {
	i := strings.Index(msg, ": error: ")
	if i <= 0 || i > 48 {
		return false
	}
	for j := 0; j < i; j++ {
		c := msg[j]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' || c == '/' || c == ' ') {
			return false
		}
	}
	return msg[0] != ' '
}

// memoryish: a ValueError about memory is not a configuration mistake to give
// up on; the specific memory rules above classify the known ones.
func memoryish(msg string) bool {
	return strings.Contains(msg, "memory") || strings.Contains(msg, "Memory") || strings.Contains(msg, "KV cache")
}
