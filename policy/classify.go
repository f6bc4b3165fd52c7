package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// Scores rank root causes when a log holds several: an OOM inside NCCL is an
// OOM, a free-memory check failure explains the KV error that may follow it,
// and a configuration error beats the generic crash lines it produces.
const (
	scoreOOM       = 100
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
var ruleAlso = map[string]ruleCond{"out of memory": {ruleGPURuntimeOOM, namesGPURuntime}}

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
	{"RayChannelTimeoutError", CauseHang, scoreTimeout},
	{"Timed out waiting for object available to read", CauseHang, scoreTimeout},
	{shmStall, CauseHang, scoreStuck},

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
	{"CUDA error:", CauseCrash, scoreCrash},
	{"Segmentation fault", CauseCrash, scoreCrash},
	{"SIGSEGV", CauseCrash, scoreCrash},
	{"Fatal Python error", CauseCrash, scoreCrash},
	{"core dumped", CauseCrash, scoreCrash},
	{"died unexpectedly", CauseCrash, scoreDied},
	{"exited with exit code", CauseCrash, scoreDied}, // a platform's word for a worker's death
}

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

// frameRules name functions of vLLM whose "raise" (the source line Python
// prints under the frame) says what failed, for excerpts cut before the
// exception line. The raise must start with raise.
var frameRules = []struct {
	fn, raise string
	cause     Cause
	score     int
}{
	{"in check_enough_kv_cache_memory", "raise ValueError(", CauseKVInsufficient, scoreKV},  // V1 KV check
	{"in _check_enough_kv_cache_memory", "raise ValueError(", CauseKVInsufficient, scoreKV}, // V1 KV check, later name
	{"in raise_if_cache_size_invalid", "raise ValueError(", CauseKVInsufficient, scoreKV},   // V0 KV check
	{"in _dummy_sampler_run", "raise RuntimeError(", CauseOOM, scoreOOM},                    // the sampler warm-up OOM
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
	"Timed out", "auto-fit", "exit code", "exited with code", "killed", "fatal signal", "blocks: 0,", "oom-killer", "Address family"}

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

type lineKind uint8

const (
	kindNone lineKind = iota
	kindRoot
	kindWrapper
)

// Ids of the checks that are not needle rules (see rule.id).
const (
	ruleGPURuntimeOOM    = "CUDA/HIP/NCCL: out of memory"
	ruleRayMemoryMonitor = "Ray's memory monitor killed a worker"
	ruleErrorsStarting   = "errors while starting, no cause named"
	ruleArgparse         = "argparse: a usage error (\"prog: error: …\")"
	ruleValueError       = "exception: ValueError/ValidationError (not about memory)"
	ruleBrokenInstall    = "exception: ModuleNotFoundError/ImportError"
	rulePermission       = "exception: PermissionError"
	ruleAddressFamily    = "sandbox: " + addressFamilyRefused
	ruleException        = "exception: any other"
	ruleStalledStats     = "stats: requests running at 0 tokens/s"
	ruleWaitingEngine    = "starting: waiting for the engine core, over and over"
	ruleShutdown         = "shutdown: begun, never finished"
)

// matchLine classifies one message (prefixes already stripped); off, when
// not nil, switches rules off by id (the report's leave-one-group-out pass).
// id names the rule that decided the line.
func matchLine(msg string, off map[string]bool) (kind lineKind, cause Cause, score int, id string) {
	// Traceback source lines ("    raise ValueError(\"No available memory…")
	// and frame lines repeat text of the exception below them: they are
	// matched against the rules only (an excerpt may end before the
	// exception), never read as an exception or a wrapper themselves.
	if strings.HasPrefix(msg, "    ") {
		if !mayMatch(msg) {
			return kindNone, "", 0, ""
		}
		return matchRules(msg, off)
	}
	if isFrame(msg) || !mayMatch(msg) || isGuessList(msg) {
		return kindNone, "", 0, ""
	}
	for _, w := range wrappers {
		if strings.Contains(msg, w) && !off[w] {
			return kindWrapper, "", 0, w
		}
	}
	if k, c, sc, id := matchRules(msg, off); k != kindNone {
		return k, c, sc, id
	}
	on := func(id string) bool { return !off[id] }
	if strings.Contains(msg, addressFamilyRefused) && !isTorchWarning(msg) && !strings.Contains(msg, "NCCL INFO") &&
		!strings.Contains(msg, "NCCL WARN") && on(ruleAddressFamily) {
		return kindRoot, CauseConfigError, scoreConfig, ruleAddressFamily
	}
	if isArgparseError(msg) && on(ruleArgparse) {
		return kindRoot, CauseConfigError, scoreConfig, ruleArgparse
	}
	typ, isExc := vllmlog.ExceptionType(msg)
	if (isExc && (strings.HasSuffix(typ, "ValueError") || strings.HasSuffix(typ, "ValidationError"))) ||
		strings.HasPrefix(strings.TrimLeft(msg, " "), "Value error, ") {
		if !memoryish(msg) && on(ruleValueError) {
			return kindRoot, CauseConfigError, scoreValueErr, ruleValueError
		}
	}
	// A broken install (vllm or one of its modules cannot be imported) does
	// not heal on a restart.
	if (typ == "ModuleNotFoundError" || typ == "ImportError") && on(ruleBrokenInstall) {
		return kindRoot, CauseConfigError, scoreValueErr, ruleBrokenInstall
	}
	// EPERM/EACCES at startup: a sandbox (systemd's SystemCallFilter=,
	// ProtectSystem=, ReadOnlyPaths=; a container's seccomp profile) or file
	// modes refuse what vLLM needs. Python raises PermissionError for both
	// errnos; a restart meets the same refusal. Only the exception counts,
	// never the bare words "Operation not permitted", which NCCL and others
	// print in warnings they recover from.
	if typ == "PermissionError" && on(rulePermission) {
		return kindRoot, CauseConfigError, scoreValueErr, rulePermission
	}
	if isExc && on(ruleException) {
		return kindRoot, CauseCrash, scoreException, ruleException
	}
	return kindNone, "", 0, ""
}

// isGuessList recognises Ray's explanation of a dead worker, which lists
// what might have killed it ("There are some potential root causes. (1) The
// process is killed by SIGKILL by OOM killer … (3) … SIGSEGV …", newer "Some
// common causes include: (1) the process was killed by the OOM killer …"):
// the guesses name causes without evidence for any of them.
func isGuessList(msg string) bool {
	return strings.Contains(msg, "potential root causes") || strings.Contains(msg, "common causes include")
}

func matchRules(msg string, off map[string]bool) (lineKind, Cause, int, string) {
	for i := range rules {
		if strings.Contains(msg, rules[i].needle) && (ruleConds[i] == nil || ruleConds[i](msg)) && !off[ruleIDs[i]] {
			return kindRoot, rules[i].cause, rules[i].score, ruleIDs[i]
		}
	}
	return kindNone, "", 0, ""
}

// isFrame recognises a traceback frame line, `File "x.py", line 12, in f`
// (or faulthandler's `File "x.py", line 12 in f`), however indented.
func isFrame(msg string) bool {
	t := strings.TrimLeft(msg, " ")
	return strings.HasPrefix(t, `File "`) && strings.Contains(t, `", line `)
}

// holdsFrame recognises a frame behind a prefix the guard does not strip
// (CI timestamps, compose service names, "[rank0]:") or inside a paste
// that lost its newlines: the line is a traceback, and may hold more.
func holdsFrame(msg string) bool {
	i := strings.Index(msg, `  File "`)
	return i > 0 && strings.Contains(msg[i:], `", line `)
}

// frameCause is what the raise printed under the frame fn says, if
// anything; id is "frame: " + fn.
func frameCause(frame, src string, off map[string]bool) (Cause, int, string, bool) {
	src = strings.TrimLeft(src, " ")
	if !strings.HasPrefix(src, "raise ") {
		return "", 0, "", false
	}
	for _, r := range frameRules {
		if strings.HasPrefix(src, r.raise) && strings.Contains(frame, r.fn) && !off["frame: "+r.fn] {
			return r.cause, r.score, "frame: " + r.fn, true
		}
	}
	return "", 0, "", false
}

const maxHits = 16

// hits are the matched lines of one cause at its best score so far.
type hits struct {
	score int
	idx   []int
}

func (h *hits) add(i, score int) {
	switch {
	case score > h.score:
		h.score = score
		h.idx = append(h.idx[:0], i)
	case score == h.score && len(h.idx) < maxHits:
		h.idx = append(h.idx, i)
	case score == h.score && score == scoreException:
		// Generic exceptions: the latest are closest to the death.
		copy(h.idx, h.idx[1:])
		h.idx[len(h.idx)-1] = i
	}
}

// scan is what one pass over the lines found.
type scan struct {
	byCause   map[Cause]*hits
	ready     bool // "Application startup complete." seen
	readyLine int
	wrapper   int // index of the first wrapper line, -1 if none
	traceback bool
	lastTB    int // index of the last traceback line (header or frame), -1 if none
	lastFrame int // index of the last traceback frame line, -1 if none
	waiting   int // "Waiting for … core engine proc(s) to start." lines
	start     int // index of the first line of the last run

	// Stall signs (see stallVerdict).
	shm         []int // vLLM's shared-memory broadcast warnings since the last progress
	shmServing  bool  // the first of them came while vLLM served (ready, or answering requests)
	serving     bool  // ready, or uvicorn's access log seen
	stalled     []int // stats lines with requests running at 0 tokens/s since the last progress
	shutdown    int   // index of the start of a shutdown that never finished, -1 if none
	shutdownEnd bool
	errLines    []int // lines vLLM logged at level ERROR or CRITICAL (at most maxHits)

	// off and fired serve the report's leave-one-group-out pass (see
	// real_test.go): off switches rules off by id, fired records the id and
	// cause of every rule that decided a line. Both are nil in production.
	off   map[string]bool
	fired map[string]Cause
}

// shutdownStarts open a shutdown: uvicorn's (uvicorn/server.py, "Shutting
// down", "Waiting for connections to close. (CTRL+C to force quit)",
// "Waiting for background tasks to complete. (CTRL+C to force quit)",
// uvicorn/lifespan/on.py "Waiting for application shutdown.") and vLLM's
// own (vllm/entrypoints/launcher.py "Shutting down FastAPI HTTP server.").
// shutdownEnds close one: uvicorn's "Application shutdown complete." and
// "Finished server process [N]".
var (
	shutdownStarts = []string{"INFO:     Shutting down", "Shutting down FastAPI HTTP server", "Waiting for application shutdown",
		"Waiting for connections to close", "Waiting for background tasks to complete"}
	shutdownEnds = []string{"Application shutdown complete", "Finished server process"}
)

func (s *scan) root(i int, c Cause, score int, id string) {
	h := s.byCause[c]
	if h == nil {
		h = &hits{}
		s.byCause[c] = h
	}
	h.add(i, score)
	if s.fired != nil {
		s.fired[id] = c
	}
}

// progress: the engine moved (a stats line with tokens, readiness); stall
// signs before it are history, not a hang.
func (s *scan) progress() {
	s.shm = s.shm[:0]
	s.stalled = s.stalled[:0]
	s.shmServing = false
}

// text is line l as evidence shows it: ANSI stripped, no trailing CR/space.
func text(l Line) string { return strings.TrimRight(vllmlog.StripANSI(l.Text), "\r\n ") }

// runMarkers open a run of vLLM; a saved log may hold several runs and only
// the last one is classified. The guard's own lines are always one run: its
// stdout and stderr interleave, so a traceback on stderr can come before a
// banner line on stdout of the same run, and must not be cut away.
var runMarkers = []string{"vLLM API server version", "vLLM server version", "non-default args:"}

func scanLines(lines []Line, severalRuns bool) *scan { return scanWith(lines, severalRuns, nil, nil) }

func scanWith(lines []Line, severalRuns bool, off map[string]bool, fired map[string]Cause) *scan {
	s := &scan{byCause: make(map[Cause]*hits, 4), wrapper: -1, readyLine: -1, lastFrame: -1, lastTB: -1, shutdown: -1, off: off, fired: fired}
	for i := range lines {
		if !severalRuns {
			break
		}
		t := lines[i].Text
		if strings.Contains(t, "erver version") || strings.Contains(t, "non-default args:") {
			for _, m := range runMarkers {
				if strings.Contains(t, m) {
					s.start = i
				}
			}
		}
	}
	for i := s.start; i < len(lines); i++ {
		// A client's text (an access line's path and query, a logged
		// prompt) is never evidence: one GET /v1/models?OutOfMemoryError
		// must not make the next crash an OOM.
		if vllmlog.IsClientText(lines[i].Text) {
			continue
		}
		msg := vllmlog.Message(lines[i].Text)
		if vllmlog.IsStartupComplete(msg) {
			s.ready = true
			s.serving = true
			s.readyLine = i
			s.progress()
			continue
		}
		if strings.Contains(msg, "core engine proc(s) to start") {
			s.waiting++
			continue
		}
		if vllmlog.IsTracebackHeader(msg) {
			s.traceback = true
			s.lastTB = i
			continue
		}
		if isFrame(msg) {
			// Excerpts often start inside a traceback: frames are a
			// traceback even without its first line.
			s.traceback = true
			s.lastFrame, s.lastTB = i, i
			continue
		}
		if len(s.errLines) < maxHits && isErrorLevel(lines[i].Text) {
			s.errLines = append(s.errLines, i)
		}
		if strings.Contains(msg, "tokens/s") {
			if st, ok := vllmlog.ParseStats(msg); ok {
				switch {
				case st.Prompt > 0 || st.Generation > 0:
					s.progress()
				case st.Running > 0:
					s.stalled = append(s.stalled, i)
				}
				continue
			}
		}
		if strings.HasPrefix(msg, vllmlog.UvicornPrefix) {
			if _, ok := vllmlog.ParseAccess(msg); ok {
				s.serving = true
				continue
			}
			s.shutdownLine(i, msg)
		} else if strings.Contains(msg, "hutting down") || strings.Contains(msg, "Waiting for") {
			s.shutdownLine(i, msg)
		}
		if holdsFrame(msg) {
			s.traceback = true
			s.lastFrame, s.lastTB = i, i
		}
		kind, cause, score, id := matchLine(msg, off)
		if fired != nil && kind != kindNone {
			recordAll(msg, fired)
		}
		if kind == kindNone && s.lastFrame >= 0 && s.lastFrame == i-1 {
			// The source line under a frame: a raise in a known check.
			if c, sc, fid, ok := frameCause(vllmlog.Message(lines[i-1].Text), msg, off); ok {
				kind, cause, score, id = kindRoot, c, sc, fid
			}
		}
		switch kind {
		case kindWrapper:
			if s.wrapper < 0 {
				s.wrapper = i
			}
			if fired != nil {
				fired[id] = CauseCrash
			}
		case kindRoot:
			if id == shmStall {
				// A sign, weighed at the end (stallVerdict), not a hit.
				if len(s.shm) == 0 {
					s.shmServing = s.serving
				}
				s.shm = append(s.shm, i)
				if fired != nil {
					fired[id] = CauseHang
				}
				continue
			}
			s.root(i, cause, score, id)
		}
	}
	return s
}

// isErrorLevel reports whether vLLM's logger wrote line at level ERROR or
// CRITICAL (its level prefix, behind the wrappers and the process prefix).
func isErrorLevel(line string) bool {
	if !strings.Contains(line, "ERROR ") && !strings.Contains(line, "CRITICAL ") {
		return false
	}
	t, _ := vllmlog.CutWrapper(vllmlog.StripANSI(line))
	for range 2 { // the process prefix may precede or follow the level
		t, _, _ = vllmlog.CutProcess(t)
		if _, lvl, ok := vllmlog.CutLevel(t); ok {
			return lvl == "ERROR" || lvl == "CRITICAL"
		}
	}
	return false
}

// shutdownLine notes the start or the end of a shutdown.
func (s *scan) shutdownLine(i int, msg string) {
	for _, m := range shutdownEnds {
		if strings.Contains(msg, m) {
			s.shutdownEnd = true
			return
		}
	}
	for _, m := range shutdownStarts {
		if strings.Contains(msg, m) {
			if s.shutdown < 0 || s.shutdownEnd {
				s.shutdown, s.shutdownEnd = i, false
			}
			return
		}
	}
}

// best returns the winning cause among the log's hits, ignoring config
// errors when vLLM had become ready (request errors are not fatal) and
// scores below min.
func (s *scan) best(phase Phase, min int) (Cause, *hits) {
	var bc Cause
	var bh *hits
	for _, c := range Causes {
		h := s.byCause[c]
		if h == nil || h.score < min || (c == CauseConfigError && phase == PhaseReady) {
			continue
		}
		if bh == nil || h.score > bh.score {
			bc, bh = c, h
		}
	}
	return bc, bh
}

// evidence turns hit indices into lines, one per distinct message (four TP
// workers printing the same OOM make one line of evidence), at most four.
func (s *scan) evidence(lines []Line, h *hits) []Line {
	if h == nil {
		return nil
	}
	out := make([]Line, 0, 4)
	seen := make(map[string]bool, 4)
	for _, i := range h.idx {
		m := vllmlog.Message(lines[i].Text)
		if seen[m] {
			continue
		}
		seen[m] = true
		out = append(out, Line{N: lines[i].N, Stream: lines[i].Stream, Text: text(lines[i])})
		if len(out) == 4 {
			break
		}
	}
	return out
}

// Classify gives one cause, with its evidence, for one death of vLLM (or,
// with e.Offline, for a saved log, where "" means no failure was found).
// It is a pure function of e.
func Classify(e Exit) Verdict { return verdictOf(e, scanLines(e.Lines, e.Offline)) }

func verdictOf(e Exit, s *scan) Verdict {
	phase := e.Phase
	if phase == "" {
		phase = PhaseStarting
		if s.ready {
			phase = PhaseReady
		}
	}
	v := classify(e, s, phase)
	if v.Cause != "" {
		v.Advice = adviceFor(v)
	}
	return v
}

func classify(e Exit, s *scan, phase Phase) Verdict {
	// The guard's own failure to start vLLM (EMFILE, EAGAIN, ENOMEM, its
	// keeper) says nothing about vLLM's configuration. It is a crash of the
	// start, not a new cause: it backs off and counts toward the crash loop
	// like one, and the summary names it.
	if e.GuardFailure != "" {
		return Verdict{Cause: CauseCrash, Confidence: "high", guardStart: true,
			Summary: "the guard could not start vLLM: " + e.GuardFailure + " (its own error, not vLLM's configuration)"}
	}
	if e.StartFailure != "" {
		return Verdict{Cause: CauseConfigError, Confidence: "high",
			Summary: "vLLM could not be started: " + e.StartFailure}
	}
	if e.Hang != "" {
		// A dead engine also fails liveness; if the log names a memory cause,
		// that is the root cause the ladder must react to.
		if c, h := s.best(phase, scoreKV); h != nil {
			ev := s.evidence(e.Lines, h)
			return Verdict{Cause: c, Confidence: "high", Evidence: ev,
				Summary: summaryFor(c, ev) + " (then killed as hung: " + e.Hang + ")"}
		}
		return Verdict{Cause: CauseHang, Confidence: "high", Summary: "vLLM hung: " + e.Hang}
	}
	if e.HostOOMKill && e.Signal == "SIGKILL" && !e.SignalByGuard {
		ev := s.evidence(e.Lines, s.byCause[CauseHostOOM])
		return Verdict{Cause: CauseHostOOM, Confidence: "high", Evidence: ev,
			Summary: "killed by the kernel OOM killer (SIGKILL, cgroup oom_kill count went up): host memory ran out, not GPU memory"}
	}

	c, h := s.best(phase, scoreDied)
	// The OOM killer mostly takes the biggest process of the tree, the
	// EngineCore or a worker; the API server then reports a dead engine and
	// exits by itself. Unless the log names a cause of its own, that death
	// is the host's memory.
	if e.HostOOMKill && !e.SignalByGuard && (h == nil || c == CauseCrash || c == CauseHostOOM) {
		var ev []Line
		if h != nil {
			ev = s.evidence(e.Lines, h)
		}
		return Verdict{Cause: CauseHostOOM, Confidence: "high", Evidence: ev,
			Summary: "the kernel OOM killer killed a process of vLLM's tree (cgroup oom_kill count went up), then vLLM ended: host memory ran out, not GPU memory"}
	}
	if h != nil && c != CauseCrash {
		ev := s.evidence(e.Lines, h)
		return Verdict{Cause: c, Confidence: "high", Evidence: ev, Summary: summaryFor(c, ev)}
	}
	// A crash with no OOM line but the GPU at the ceiling is most likely an
	// OOM that died before it could say so (NCCL, a killed worker).
	if !e.Offline && e.Critical > 0 {
		peak := 0.0
		for _, f := range e.MemFractions {
			peak = max(peak, f)
		}
		if peak >= e.Critical {
			var ev []Line
			if h != nil {
				ev = s.evidence(e.Lines, h)
			}
			return Verdict{Cause: CauseOOM, Confidence: "low", Evidence: ev,
				Summary: fmt.Sprintf("GPU out of memory, inferred from memory: no OOM line in the log, but GPU memory reached %.1f%% (critical %.1f%%) just before vLLM died",
					peak*100, e.Critical*100)}
		}
	}
	if h != nil {
		ev := s.evidence(e.Lines, h)
		return Verdict{Cause: CauseCrash, Confidence: "high", Evidence: ev, Summary: summaryFor(CauseCrash, ev)}
	}

	if e.Offline {
		return classifyOffline(e, s, phase)
	}
	// Any exit the guard did not ask for is a failure, whatever its code.
	ev := s.evidence(e.Lines, s.byCause[CauseCrash])
	return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: ev, Summary: exitWords(e, s, ev)}
}

// classifyOffline finishes a saved log with no decisive root-cause line: a
// failure is reported only when the log shows one, and a log that shows
// signs but cannot decide says CauseUnknown with what it saw.
func classifyOffline(e Exit, s *scan, phase Phase) Verdict {
	excs := s.evidence(e.Lines, s.byCause[CauseCrash])
	if s.wrapper >= 0 {
		return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: excs,
			Summary: fmt.Sprintf("vLLM's engine died (line %d: %s) and the log holds no root-cause line above it",
				e.Lines[s.wrapper].N, clip(vllmlog.Message(e.Lines[s.wrapper].Text), 120))}
	}
	if v, ok := s.stallVerdict(e.Lines); ok {
		return v
	}
	if phase == PhaseStarting && s.waiting >= 3 && !s.traceback && !s.off[ruleWaitingEngine] {
		s.fire(ruleWaitingEngine, CauseHang)
		return Verdict{Cause: CauseHang, Confidence: "low",
			Summary: fmt.Sprintf("vLLM stalled while starting: the engine core never came up (%d \"Waiting for … core engine proc(s) to start\" lines)", s.waiting)}
	}
	if phase == PhaseStarting && s.traceback {
		if len(excs) > 0 {
			return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: excs, Summary: summaryFor(CauseCrash, excs)}
		}
		// The excerpt ends inside a traceback: still a failure.
		var ev []Line
		if s.lastFrame >= 0 {
			l := e.Lines[s.lastFrame]
			ev = []Line{{N: l.N, Stream: l.Stream, Text: text(l)}}
		}
		sum := "vLLM crashed: the log holds a traceback but no exception line"
		if len(ev) > 0 {
			sum += fmt.Sprintf(" (its last frame, line %d: %s)", ev[0].N, clip(strings.TrimSpace(vllmlog.Message(ev[0].Text)), 160))
		}
		return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: ev, Summary: sum}
	}
	if s.shutdown >= 0 && !s.shutdownEnd && s.lastTB < s.shutdown && !s.off[ruleShutdown] {
		// No sign of a stuck engine after it: a drain still running, a
		// shutdown that hung, or a log cut short. The text cannot say.
		s.fire(ruleShutdown, CauseUnknown)
		l := e.Lines[s.shutdown]
		return Verdict{Cause: CauseUnknown, Confidence: "low", Evidence: []Line{{N: l.N, Stream: l.Stream, Text: text(l)}},
			Summary: fmt.Sprintf("unknown: vLLM began shutting down at line %d and the log ends before the shutdown finished (no \"Application shutdown complete.\"): a shutdown that hung, or a log cut during the drain",
				l.N)}
	}
	if phase == PhaseReady {
		return Verdict{Summary: "no failure found: vLLM became ready"}
	}
	if len(s.errLines) > 0 && !s.off[ruleErrorsStarting] {
		// vLLM said something went wrong and never became ready, but
		// named nothing a rule knows: not "no failure", not a guess.
		s.fire(ruleErrorsStarting, CauseUnknown)
		var ev []Line
		for _, i := range []int{s.errLines[0], s.errLines[len(s.errLines)-1]} {
			if len(ev) == 0 || ev[0].N != e.Lines[i].N {
				ev = append(ev, Line{N: e.Lines[i].N, Stream: e.Lines[i].Stream, Text: text(e.Lines[i])})
			}
		}
		return Verdict{Cause: CauseUnknown, Confidence: "low", Evidence: ev,
			Summary: fmt.Sprintf("unknown: vLLM logged %d error line(s) while starting (first at line %d: %s) and the log ends before it became ready, naming no cause",
				len(s.errLines), ev[0].N, clip(vllmlog.Message(ev[0].Text), 160))}
	}
	return Verdict{Summary: "no failure found: the log ends while vLLM was still starting"}
}

// recordAll records in fired every rule that matches msg, not only the
// first: a rule shadowed by another on the same line is borne out by that
// line too (the report's support must not miss it, or a rule written from a
// log would pass for one supported by no log at all).
func recordAll(msg string, fired map[string]Cause) {
	for i := range rules {
		if strings.Contains(msg, rules[i].needle) && (ruleConds[i] == nil || ruleConds[i](msg)) {
			fired[ruleIDs[i]] = rules[i].cause
		}
	}
	for _, w := range wrappers {
		if strings.Contains(msg, w) {
			fired[w] = CauseCrash
		}
	}
	off := map[string]bool{}
	for range 8 { // the structural checks, each in turn
		k, c, _, id := matchLine(msg, off)
		if k == kindNone || off[id] {
			return
		}
		if k == kindRoot {
			fired[id] = c
		}
		off[id] = true
	}
}

func (s *scan) fire(id string, c Cause) {
	if s.fired != nil {
		s.fired[id] = c
	}
}

// How long requests must sit at 0 tokens/s before the log calls it a hang,
// and how many stats lines stand for that when the lines carry no time
// (vLLM logs stats every 10 s by default: VLLM_LOG_STATS_INTERVAL).
const (
	stalledFor      = 2 * time.Minute
	stalledLines    = 12
	stalledLinesMin = 3 // fewer say nothing, even as unknown
)

// stallVerdict weighs the signs of a stuck engine that the log ends on (no
// progress after them, no traceback after them): vLLM's shared-memory
// broadcast warnings and stats lines with requests running at 0 tokens/s.
//
// vLLM prints its broadcast warning when a worker has not read for 60 s,
// "hanging or doing some time-consuming work (e.g. compilation, weight/kv
// cache quantization)". Twice in a row, or once while it serves (compiling
// is over by then), is a hang; once while starting may be a long
// compilation: unknown. A stats line with running requests and no tokens is
// an engine that no longer steps while /health still answers 200; for
// stalledFor it is a hang, shorter it is unknown (a very long prefill is
// counted only when it completes). Signs that begin after a shutdown began
// are a shutdown that itself hung.
func (s *scan) stallVerdict(lines []Line) (Verdict, bool) {
	shm, stalled := s.shm, s.stalled
	if s.off[shmStall] {
		shm = nil
	}
	if s.off[ruleStalledStats] {
		stalled = nil
	}
	if len(shm) == 0 && len(stalled) < stalledLinesMin {
		return Verdict{}, false
	}
	first := -1
	if len(shm) > 0 {
		first = shm[0]
	}
	if len(stalled) >= stalledLinesMin && (first < 0 || stalled[0] < first) {
		first = stalled[0]
	}
	if s.lastTB > first {
		return Verdict{}, false // something failed after the signs: not a stall
	}
	stuckStats, span := false, ""
	if len(stalled) >= stalledLinesMin {
		t0, ok0 := vllmlog.Stamp(lines[stalled[0]].Text)
		t1, ok1 := vllmlog.Stamp(lines[stalled[len(stalled)-1]].Text)
		if d := t1.Sub(t0); ok0 && ok1 && d >= 0 {
			stuckStats = d >= stalledFor
			span = fmt.Sprintf(" over %s", d)
		} else {
			stuckStats = len(stalled) >= stalledLines
		}
	}
	shmHang := len(shm) >= 2 || (len(shm) == 1 && s.shmServing)

	var ev []Line
	add := func(idx []int) {
		if len(idx) == 0 {
			return
		}
		for _, i := range []int{idx[0], idx[len(idx)-1]} {
			if len(ev) > 0 && ev[len(ev)-1].N == lines[i].N {
				continue
			}
			ev = append(ev, Line{N: lines[i].N, Stream: lines[i].Stream, Text: text(lines[i])})
		}
	}
	var what []string
	if len(shm) > 0 {
		add(shm)
		what = append(what, fmt.Sprintf("%d shared-memory broadcast warning(s) (\"%s\", line %d)", len(shm), shmStall, lines[shm[0]].N))
	}
	if len(stalled) >= stalledLinesMin {
		add(stalled)
		what = append(what, fmt.Sprintf("%d stats lines with requests running at 0 tokens/s%s (lines %d–%d)",
			len(stalled), span, lines[stalled[0]].N, lines[stalled[len(stalled)-1]].N))
	}
	seen := strings.Join(what, " and ")
	if len(shm) > 0 {
		s.fire(shmStall, CauseHang)
	}
	if len(stalled) >= stalledLinesMin {
		s.fire(ruleStalledStats, CauseHang)
	}
	if shmHang || stuckStats {
		sum := "vLLM hung: the log ends on " + seen + ", with no progress and no error after them"
		if s.shutdown >= 0 && !s.shutdownEnd && s.shutdown < first {
			sum = fmt.Sprintf("vLLM hung while shutting down (the shutdown began at line %d and never finished): %s", lines[s.shutdown].N, seen)
		}
		return Verdict{Cause: CauseHang, Confidence: "low", Evidence: ev, Summary: sum}, true
	}
	return Verdict{Cause: CauseUnknown, Confidence: "low", Evidence: ev,
		Summary: "unknown: the log ends on " + seen + "; too little to call a hang (vLLM prints the broadcast warning during long compilations too), and no failure after it"}, true
}

func exitWords(e Exit, s *scan, ev []Line) string {
	var what string
	switch {
	case e.Signal != "" && e.SignalByGuard:
		what = "vLLM died by " + e.Signal + " sent by the guard"
	case e.Signal != "":
		what = "vLLM was killed by " + e.Signal + " (not sent by the guard)"
	case e.ExitCode == 0:
		what = "vLLM exited with code 0 without being asked to stop (vLLM exits 0 after its engine dies)"
	default:
		what = fmt.Sprintf("vLLM exited with code %d", e.ExitCode)
	}
	if len(ev) > 0 {
		what += "; last error: " + clip(vllmlog.Message(ev[len(ev)-1].Text), 160)
	} else if s.wrapper >= 0 {
		what += fmt.Sprintf("; engine death at line %d, no root-cause line in the log", e.Lines[s.wrapper].N)
	}
	return what
}

var causeTitle = map[Cause]string{
	CauseOOM:            "GPU out of memory",
	CauseKVInsufficient: "KV cache does not fit in the GPU memory budget",
	CauseGPUBusy:        "GPU memory held by another process at startup",
	CauseConfigError:    "vLLM rejected its configuration",
	CauseHang:           "vLLM hung",
	CauseCrash:          "vLLM crashed",
	CauseHostOOM:        "host memory ran out (kernel OOM killer)",
	CauseUnknown:        "unknown: the log cannot decide",
}

func summaryFor(c Cause, ev []Line) string {
	t := causeTitle[c]
	if len(ev) == 0 {
		return t
	}
	// A traceback's evidence may start at the frame's code ("raise
	// ValueError(") when the message wraps to the next line: say the
	// exception itself.
	pick := ev[0]
	for _, l := range ev {
		if _, ok := vllmlog.ExceptionType(vllmlog.Message(l.Text)); ok {
			pick = l
			break
		}
	}
	return fmt.Sprintf("%s: line %d: %s", t, pick.N, clip(vllmlog.Message(pick.Text), 200))
}

// adviceFor gives the operator's next steps for a verdict, most specific first.
func adviceFor(v Verdict) []string {
	ev := ""
	for _, l := range v.Evidence {
		ev += l.Text + "\n"
	}
	has := func(s string) bool { return strings.Contains(ev, s) || strings.Contains(v.Summary, s) }
	switch v.Cause {
	case CauseOOM:
		a := []string{
			"the guard steps one rung down (lower max_num_seqs and gpu_memory_utilization) and restarts",
			"lower --max-num-seqs or --max-num-batched-tokens to shrink activation peaks; lower gpu_memory_utilization to leave room outside the KV cache",
			"check for other processes on the GPU: vllm-guard gpus",
		}
		if has("warming up sampler") {
			a = append([]string{"the sampler warm-up runs max_num_seqs dummy requests: lower max_num_seqs first"}, a...)
		}
		if has("ncclUnhandledCudaError") || has("Cuda failure") {
			a = append(a, "NCCL ran out of GPU memory for its buffers: leave more room (lower gpu_memory_utilization)")
		}
		return a
	case CauseKVInsufficient:
		return []string{
			"raise gpu_memory_utilization (if the GPU has room) or lower --max-model-len so one full-length sequence fits in the KV cache",
			"a lower max_num_seqs shrinks the profiling run and leaves more memory for the KV cache",
		}
	case CauseGPUBusy:
		return []string{
			"another process holds GPU memory, often an orphaned EngineCore or worker of the previous run: find it with vllm-guard gpus (or nvidia-smi) and stop it",
			"or lower gpu_memory_utilization so this instance fits beside the other tenant",
		}
	case CauseConfigError:
		switch {
		case has("ddress already in use"):
			return []string{"another process listens on vLLM's port: stop it or change [vllm] port", "the guard does not retry a configuration error (exit 78)"}
		case has("unrecognized arguments") || has(": error: "):
			return []string{"fix or remove the flag vLLM rejected ([vllm] command or the extra args); `vllm serve --help` lists this version's flags", "the guard does not retry a configuration error (exit 78)"}
		case has("Repository") || has("model identifier") || has("path_or_model_id") || has("gated repo") || has("GatedRepo") ||
			has("FileNotFound") || has("LocalEntryNotFound") || has("file named") || has("HFValidation"):
			return []string{"check the model name or path in [vllm] command; for gated or private models set HF_TOKEN in [vllm] env; offline (HF_HUB_OFFLINE=1) needs the model in the cache", "the guard does not retry a configuration error (exit 78)"}
		case has(addressFamilyRefused) || has("PermissionError"):
			return []string{
				"a sandbox refused what vLLM needs, and a restart meets the same refusal: with systemd, RestrictAddressFamilies= must allow AF_UNIX and AF_NETLINK besides AF_INET and AF_INET6 (vLLM's processes talk over unix sockets; gloo and NCCL list the interfaces through netlink); check SystemCallFilter=, ProtectSystem=, ReadOnlyPaths= and the container's seccomp profile; `systemd-analyze security` shows what the unit forbids",
				"the guard does not retry a configuration error (exit 78)",
			}
		case has("could not be started"):
			return []string{"check [vllm] command: the executable must exist and be executable in the guard's PATH (or give an absolute path)", "the guard does not retry a configuration error (exit 78)"}
		}
		return []string{"fix the vLLM arguments or model configuration named in the evidence ([vllm] command)", "the guard does not retry a configuration error (exit 78)"}
	case CauseHang:
		return []string{
			"read the last lines before the kill: the last load phase reached shows where it stuck",
			"with tensor parallelism check NCCL (NCCL_DEBUG=INFO, /dev/shm size, P2P); raise [readiness] stall_timeout only if loading or compiling legitimately takes longer",
		}
	case CauseUnknown:
		return []string{
			"the log does not decide: pass more of it (the lines after the last one here, and the minutes before the first sign) or the guard's incident record",
			"for a suspected hang: check whether requests still finish (vllm:generation_tokens_total keeps rising) and whether a worker is busy compiling (CPU at 100 %) or stuck (py-spy dump --pid of the EngineCore and workers)",
		}
	case CauseHostOOM:
		return []string{
			"host RAM ran out, not GPU memory: raise the memory limit of the unit or container (MemoryMax=, --memory, resources.limits.memory)",
			"reduce host memory use: CPU offload / CPU KV cache size, fewer API server processes, model loading with less host copying",
		}
	}
	a := []string{"read the first error above the engine-death messages; the guard restarts on the same rung with backoff"}
	if has("NCCL") || has("nccl") || has("Watchdog") {
		a = append(a, "NCCL failed: check NCCL_DEBUG=INFO output, /dev/shm size (docker --shm-size), P2P/IB settings and GPU health (nvidia-smi -q, dmesg Xid)")
	}
	if has("illegal memory access") || has("CUDA error") || has("device-side assert") {
		a = append(a, "a CUDA kernel failed: check dmesg for Xid errors; try --enforce-eager to rule out CUDA graphs")
	}
	return a
}
