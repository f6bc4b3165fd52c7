// Command fakevllm simulates `vllm serve` for every test, the demo and the
// benchmarks of vllm-guard. It owns the imitation of vLLM's outside: its
// command line, its log lines on the right streams (per era), its process
// tree (an API process and a VLLM::EngineCore child in the same process
// group, no parent-death signal), its port (bound early, refusing
// connections until "Application startup complete."), its OpenAI HTTP API
// and metrics, its GPU memory (published in the stand-in NVML state that
// integration/fakenvml reads) and its failures. See
// /work/shared/VLLM-FACTS.md for the behaviour it copies.
//
// # Command line
//
//	fakevllm serve MODEL [--host H] [--port P] [--gpu-memory-utilization F]
//	    [--max-num-seqs N] [--max-model-len N] [--served-model-name NAME]
//	    [--enforce-eager] [--max-num-batched-tokens N] [--kv-cache-memory-bytes N]
//	    [--api-key KEY]
//
// Both "--flag value" and "--flag=value" work; no abbreviations. An unknown
// flag prints argparse's usage and "vllm serve: error: unrecognized
// arguments: ..." on stderr and exits 2. Defaults: host 0.0.0.0, port 8000
// (port 0 binds a free port, printed in "Starting vLLM API server 0 on
// http://H:P"), utilization 0.9, max-num-seqs 256, max-model-len 4096,
// served name = MODEL. --api-key is listed in `non-default args` (as vLLM
// does, which is why the guard masks it) but not enforced: the guard's
// probes send no key. A utilization outside (0, 1] or other invalid values
// fail as a ValueError traceback, exit 1. A MODEL starting with "missing/"
// fails like a repository that does not exist (OSError in v0, ValueError
// later), exit 1. --enforce-eager skips the compile and graph phases.
//
// # Processes
//
// The API process re-executes this binary as "VLLM::EngineCore __engine
// ARGS" (so /proc/PID/cmdline shows VLLM::EngineCore). API → engine lines
// go on the engine's stdin ("load running=N prompt_tokens=T", "ready");
// engine → API lines on fd 3 ("loaded kv_tokens=N", "mem ...", "dead
// reason=..."). SIGTERM or SIGINT to the API: shutdown lines, SIGTERM to the
// engine, SIGKILL after 5 s, exit 0. A runtime engine death: vLLM's
// EngineDeadError wrappers, /health 503 for ~100 ms, uvicorn's shutdown
// lines, exit 0. An engine that fails to start: "Engine core
// initialization failed" traceback, exit 1. When the engine's stdin closes
// (the API process died) it lives on as an orphan, holding its memory,
// for FAKEVLLM_ORPHAN_TTL, then exits.
//
// # Environment
//
// Durations are Go durations ("300ms", "2s"); sizes may be fractional.
//
//	FAKEVLLM_ERA              log format: v0 (no brackets, no process prefix, V0
//	                          messages such as "# GPU blocks: N", metric
//	                          vllm:gpu_cache_usage_perc), v1-ansi (default:
//	                          brackets and ANSI-coloured "(APIServer pid=N)" /
//	                          "(EngineCore_0 pid=N)" prefixes), v1 (2026: plain
//	                          prefixes, banner "vLLM server version X, serving model M",
//	                          "Starting vLLM server on ...")
//	FAKEVLLM_LOAD_WEIGHTS     weights phase (default 300ms); shard bars on stderr
//	FAKEVLLM_COMPILE          torch.compile phase (default 100ms)
//	FAKEVLLM_SILENT_COMPILE   1: print nothing during compile (stall tests)
//	FAKEVLLM_KV_PROFILE       KV cache profiling phase (default 50ms)
//	FAKEVLLM_GRAPHS           CUDA graph capture phase (default 100ms); bars on stderr
//	FAKEVLLM_SERVER           API server setup after the engine loaded (default 50ms)
//	FAKEVLLM_PROGRESS_EVERY   during a phase, a progress line at least this often (default 1s)
//	FAKEVLLM_TOKEN_INTERVAL   time per generated token (default 1ms)
//	FAKEVLLM_TICK             memory recomputation period (default 50ms); also on
//	                          every request change
//	FAKEVLLM_ORPHAN_TTL       an engine (or the grandchild) whose parent is gone
//	                          exits after this long (default 10m)
//	FAKENVML_STATE            stand-in NVML state folder (see below); unset: a private
//	                          device of FAKEVLLM_GPU_TOTAL_GIB, nothing published
//	CUDA_VISIBLE_DEVICES      first entry (index or UUID) is the device; default 0;
//	                          set but empty: "No CUDA GPUs are available", exit 1
//	FAKEVLLM_GPU_TOTAL_GIB    device total when no devices file says it (default 80)
//	FAKEVLLM_WEIGHTS_GIB      model weights, held from the weights phase on (default 15)
//	FAKEVLLM_SEQ_COST_MIB     activation memory per running sequence (default 40)
//	FAKEVLLM_TOKEN_COST_KIB   memory per prompt token of admitted requests (default 16)
//	FAKEVLLM_LEAK_MIB_PER_S   leak while serving, from ready (default 0)
//	FAKEVLLM_API_MIB          the API process's own memory, from start (default 256)
//	FAKEVLLM_KV_BYTES_PER_TOKEN  KV cache bytes per token (default 131072)
//	FAKEVLLM_BACKGROUND_SEQS  simulated background demand in sequences (default 0)
//	FAKEVLLM_BACKGROUND_AFTER it starts this long after ready (default 0)
//	FAKEVLLM_BACKGROUND_RAMP  and ramps linearly over this long (default 0: a step)
//	FAKEVLLM_FAULT            comma-separated faults, below
//	FAKEVLLM_FAULT_MARKER     PATH: faults fire only if PATH does not exist; the
//	                          simulator creates PATH when one fires (one shot
//	                          across restarts)
//	FAKEVLLM_STATS_FILE       PATH: the API process writes {"max_write_block_ms",
//	                          "lines_written","bytes_written"} (its stdout+stderr
//	                          writes) atomically every second and on exit
//	FAKEVLLM_ENGINE_FAULTS    internal: the live faults, from the API to the engine
//
// A malformed value exits 2 with a message naming the variable.
//
// # GPU memory
//
// The engine holds the weights from the weights phase on, then the whole
// budget (utilization × total, or weights + --kv-cache-memory-bytes) after
// KV profiling, then while serving budget + running × SEQ_COST + prompt
// tokens of admitted requests × TOKEN_COST + LEAK × seconds since ready,
// where running = min(max_num_seqs, requests running + background
// demand). Startup checks, in vLLM's order: free = total − reserved −
// other live processes < utilization × total → "Free memory on device
// ... on startup is less than desired GPU memory utilization" ValueError;
// KV available = budget − weights − max_num_seqs × SEQ_COST ≤ 0 → "No
// available memory for the cache blocks"; KV tokens < max_model_len → the
// V1 "To serve at least one request with the models's max seq len" (V0:
// "The model's max seq len (N) is larger than the maximum number of
// tokens that can be stored in KV cache (M)"); all exit 1. While serving,
// when reserved + every live process (ours included) would exceed total,
// the engine prints a torch.OutOfMemoryError traceback and dies (the API
// exits 0 after the wrappers).
//
// /metrics adds simulator truth: fakevllm_gpu_used_bytes (the device as
// NVML sees it), fakevllm_true_seq_cost_bytes, fakevllm_true_safe_max_num_seqs
// (the largest max_num_seqs whose full batch fits the device now, given
// the other processes, prompts and leak).
//
// # Stand-in NVML state (shared with integration/fakenvml)
//
// DIR/devices: one device per line, "<uuid> <total_bytes> <reserved_bytes>
// <name with spaces>"; created atomically with one 80 GiB H100 when
// missing. DIR/procs/<pid>: "<device_index> <used_bytes>" lines, written
// atomically (temp file + rename) by each process whenever its memory
// changes and removed on a clean exit; a SIGKILLed process leaves it, and
// readers ignore dead or zombie pids. The API process, the engine and the
// grandchild each publish their own file.
//
// # Faults (FAKEVLLM_FAULT)
//
//	crash_on_start    during weights: "RuntimeError: NCCL error: unhandled system
//	                  error" traceback, engine-failed wrappers, exit 1
//	crash_after=DUR   DUR after ready the engine dies ("Worker proc VllmWorker-0
//	                  died unexpectedly"); API wrappers; exit 0
//	segv_after=DUR    DUR after ready the API process dies of SIGSEGV (after a
//	                  "Fatal Python error: Segmentation fault" line)
//	hang_loading      after weights: prints nothing more, never listens, stays alive
//	hang_after=DUR    DUR after ready every HTTP request blocks forever; silent
//	health503_after=DUR  DUR after ready /health answers 503
//	never_ready       listens and /health 200, but /v1/models lists nothing and
//	                  completions answer 500
//	ignore_sigterm    API and engine ignore SIGTERM (SIGKILL still works)
//	log_flood=MBPS    after ready, stats lines on stdout at MBPS × 10^6 bytes/s
//	invalid_utf8      after ready, one log line with invalid UTF-8
//	long_line         after ready, one log line longer than 1 MiB
//	control_bytes     after ready, one log line with NUL, BEL, an OSC escape, DEL and
//	                  C1 controls, followed by text shaped like the guard's own log line
//	close_stdout      early in startup, the API's fd 1 stops reaching the reader
//	                  (it is pointed at /dev/null, so no later descriptor reuses 1);
//	                  the engine inherits that; everything goes on
//	orphan_after=DUR  DUR after ready the API process SIGKILLs itself; the engine
//	                  keeps its memory until FAKEVLLM_ORPHAN_TTL
//	grandchild        at start, a setsid descendant ("fakevllm-grandchild") that
//	                  publishes 1 GiB and sleeps until FAKEVLLM_ORPHAN_TTL
//	oom_on_start      during graph capture: "CUDA out of memory occurred when
//	                  warming up sampler with N dummy requests" traceback, exit 1
//
// # HTTP
//
// GET /health (200; 503 once the engine is dead), GET /v1/models, GET
// /version, POST /v1/completions and /v1/chat/completions (OpenAI shapes;
// max_tokens default 16, one token per FAKEVLLM_TOKEN_INTERVAL; "stream":
// true → SSE "data: {...}" per token then "data: [DONE]"; a wrong model →
// 404 NotFoundError; prompt + max_tokens > max_model_len → 400), GET
// /metrics. At most max_num_seqs requests run; the rest wait FIFO. Prompt
// tokens ≈ characters / 4. Every response gets uvicorn's access line on
// stdout when it starts: INFO:     127.0.0.1:PORT - "POST /v1/completions HTTP/1.1" 200 OK.
package main
