// Command gen writes the classifier's log corpus (internal/cause/testdata/logs) from
// the facts in shared/VLLM-FACTS.md: the eras of vLLM's log format (V0 2024
// without brackets, V1 2025 with ANSI process prefixes, 2026 without ANSI),
// tensor-parallel workers interleaving, and journalctl/docker/Kubernetes
// wrappers. The logs are synthetic, written for this project, and the output
// is deterministic. Run from the repository root:
//
//	go run ./internal/cause/testdata/gen
package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// The eras of vLLM's log format; vllmlog writes them.
type era = vllmlog.Era

const (
	v0     = vllmlog.EraV0      // 2024: "INFO 10-14 12:00:00 api_server.py:527] msg"
	v1ansi = vllmlog.EraV1ANSI  // 2025: ANSI-wrapped "(APIServer pid=1)" + "[file.py:123]"
	y2026  = vllmlog.EraV1Plain // 2026: same without ANSI
)

type wrap int

const (
	plain   wrap = iota
	journal      // "Dec 02 09:31:24 gpu-node-3 vllm[4121]: "
	docker       // "2025-07-22T09:00:00.123456789Z "
	cri          // "2026-01-12T10:00:00.123456789Z stdout F "
)

type logw struct {
	era  era
	wrap wrap
	t    time.Time
	b    strings.Builder
	r    *rand.Rand
	api  string // API server process prefix ("" in V0)
	core string // engine core process prefix
}

func newLog(e era, w wrap, start string, seed uint64) *logw {
	t, err := time.Parse("2006-01-02 15:04:05", start)
	if err != nil {
		panic(err)
	}
	l := &logw{era: e, wrap: w, t: t, r: rand.New(rand.NewPCG(seed, 7))}
	switch e {
	case v1ansi:
		l.api, l.core = "APIServer pid=1", "EngineCore_0 pid=312"
	case y2026:
		l.api, l.core = "APIServer pid=1", "EngineCore pid=298"
	}
	return l
}

func (l *logw) tick(ms int) { l.t = l.t.Add(time.Duration(ms) * time.Millisecond) }

// emit writes one physical line with the outer wrapper.
func (l *logw) emit(s string) {
	switch l.wrap {
	case journal:
		l.b.WriteString(vllmlog.Journal(l.t, "gpu-node-3", "vllm[4121]"))
	case docker:
		l.b.WriteString(vllmlog.Docker(l.t))
	case cri:
		l.b.WriteString(vllmlog.CRI(l.t, "stdout", false))
	}
	l.b.WriteString(s)
	l.b.WriteByte('\n')
}

// sys writes a line from another journal identity (systemd, kernel).
func (l *logw) sys(ident, msg string) {
	l.b.WriteString(vllmlog.Journal(l.t, "gpu-node-3", ident) + msg + "\n")
}

func (l *logw) prefix(proc string) string { return vllmlog.ProcessPrefix(l.era, proc) }

func (l *logw) line(proc, level, file string, n int, msg string) string {
	return vllmlog.FormatLine(l.era, proc, level, l.t, file+":"+strconv.Itoa(n), msg)
}

func (l *logw) log(proc, level, file string, n int, msg string) {
	l.tick(5 + l.r.IntN(40))
	l.emit(l.line(proc, level, file, n, msg))
}

func (l *logw) info(proc, file string, n int, msg string) { l.log(proc, "INFO", file, n, msg) }
func (l *logw) warn(proc, file string, n int, msg string) { l.log(proc, "WARNING", file, n, msg) }
func (l *logw) err(proc, file string, n int, msg string)  { l.log(proc, "ERROR", file, n, msg) }

// raw writes unformatted output (tracebacks, uvicorn, tqdm) with the
// process prefix that V1 repeats on every line.
func (l *logw) raw(proc string, lines ...string) {
	for _, s := range lines {
		l.tick(1)
		l.emit(l.prefix(proc) + s)
	}
}

func (l *logw) String() string { return l.b.String() }

const site = "/usr/local/lib/python3.12/dist-packages/"

func frame(file string, n int, fn, code string) []string {
	return vllmlog.FormatFrame(site+file, n, fn, code)
}

func traceback(frames [][]string, exc ...string) []string {
	out := []string{vllmlog.TracebackHeader}
	for _, f := range frames {
		out = append(out, f...)
	}
	return append(out, exc...)
}

// ---- startup blocks ----------------------------------------------------

type run struct {
	version string
	model   string
	util    float64
	seqs    int
	maxLen  int
	tp      int
}

func (l *logw) banner(r run) {
	switch l.era {
	case v0:
		l.info("", "api_server.py", 585, "vLLM API server version "+r.version)
		l.info("", "api_server.py", 586, fmt.Sprintf("args: Namespace(subparser='serve', model_tag='%s', config='', host=None, port=8000, uvicorn_log_level='info', allow_credentials=False, allowed_origins=['*'], api_key=None, lora_modules=None, chat_template=None, response_role='assistant', ssl_keyfile=None, model='%s', tokenizer=None, skip_tokenizer_init=False, revision=None, trust_remote_code=False, download_dir=None, load_format='auto', dtype='auto', kv_cache_dtype='auto', max_model_len=%d, distributed_executor_backend=None, pipeline_parallel_size=1, tensor_parallel_size=%d, block_size=16, enable_prefix_caching=False, swap_space=4, gpu_memory_utilization=%v, max_num_batched_tokens=None, max_num_seqs=%d, enforce_eager=False, disable_log_requests=False)", r.model, r.model, r.maxLen, r.tp, r.util, r.seqs))
	case v1ansi:
		l.info(l.api, "api_server.py", 1805, "vLLM API server version "+r.version)
		l.info(l.api, "utils.py", 326, fmt.Sprintf("non-default args: {'model_tag': '%s', 'host': '0.0.0.0', 'model': '%s', 'max_model_len': %d, 'tensor_parallel_size': %d, 'gpu_memory_utilization': %v, 'max_num_seqs': %d}", r.model, r.model, r.maxLen, r.tp, r.util, r.seqs))
	case y2026:
		l.info(l.api, "api_server.py", 1312, fmt.Sprintf("vLLM server version %s, serving model %s", r.version, r.model))
		l.info(l.api, "utils.py", 253, fmt.Sprintf("non-default args: {'model_tag': '%s', 'model': '%s', 'max_model_len': %d, 'tensor_parallel_size': %d, 'gpu_memory_utilization': %v, 'max_num_seqs': %d}", r.model, r.model, r.maxLen, r.tp, r.util, r.seqs))
	}
}

func (l *logw) preamble() {
	l.info("", "__init__.py", 216, "Automatically detected platform cuda.")
	if l.era != v0 {
		l.warn(l.api, "__init__.py", 1742, "argument '--disable-log-requests' is deprecated and replaced with '--enable-log-requests'. This will be removed in v0.12.0.")
	}
}

func (l *logw) engineInit(r run) {
	if l.era == v0 {
		l.info("", "config.py", 1020, "Defaulting to use mp for distributed inference")
		l.info("", "llm_engine.py", 237, fmt.Sprintf("Initializing an LLM engine (v%s) with config: model='%s', speculative_config=None, tokenizer='%s', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=%d, download_dir=None, load_format=LoadFormat.AUTO, tensor_parallel_size=%d, pipeline_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=%s, use_v2_block_manager=True, enable_prefix_caching=False)", r.version, r.model, r.model, r.maxLen, r.tp, r.model))
		return
	}
	l.info(l.api, "config.py", 1604, fmt.Sprintf("Using max model len %d", r.maxLen))
	l.info(l.api, "config.py", 2434, "Chunked prefill is enabled with max_num_batched_tokens=8192.")
	l.info(l.core, "core.py", 654, "Waiting for init message from front-end.")
	l.info(l.core, "core.py", 73, fmt.Sprintf("Initializing a V1 LLM engine (v%s) with config: model='%s', speculative_config=None, tokenizer='%s', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=%d, download_dir=None, load_format=auto, tensor_parallel_size=%d, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=%s, enable_prefix_caching=True, chunked_prefill_enabled=True, compilation_config={\"level\":3,\"cudagraph_mode\":[2,1],\"use_inductor\":true}", r.version, r.model, r.model, r.maxLen, r.tp, r.model))
}

// workers are the process prefixes of TP ranks in this era.
func (l *logw) workers(tp int) []string {
	var out []string
	for i := 0; i < tp; i++ {
		switch l.era {
		case v0:
			if i > 0 {
				out = append(out, fmt.Sprintf("VllmWorkerProcess pid=%d", 5100+i))
			} else {
				out = append(out, "")
			}
		case v1ansi:
			out = append(out, fmt.Sprintf("VllmWorker rank=%d pid=%d", i, 400+i))
		case y2026:
			out = append(out, fmt.Sprintf("Worker_TP%d pid=%d", i, 400+i))
		}
	}
	return out
}

func (l *logw) distInit(tp int) {
	if tp == 1 {
		l.info(l.core, "parallel_state.py", 1134, "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0")
		return
	}
	for i, w := range l.workers(tp) {
		l.info(w, "utils.py", 1120, "Found nccl from library libnccl.so.2")
		l.info(w, "pynccl.py", 70, "vLLM is using nccl==2.26.2")
		l.info(w, "parallel_state.py", 1134, fmt.Sprintf("rank %d in world size %d is assigned as DP rank 0, PP rank 0, TP rank %d, EP rank %d", i, tp, i, i))
	}
	l.info(l.workers(tp)[0], "shm_broadcast.py", 289, fmt.Sprintf("vLLM message queue communication handle: Handle(local_reader_ranks=[1, 2, 3], buffer_handle=(%d, 4194304, 6, 'psm_5e1a2b'), local_subscribe_addr='ipc:///tmp/3f1c', remote_subscribe_addr=None, remote_addr_ipv6=False)", tp-1))
}

func (l *logw) loadWeights(r run) {
	w := l.workers(r.tp)
	main := w[0]
	if l.era != v0 && r.tp == 1 {
		main = l.core
	}
	l.info(main, "gpu_model_runner.py", 1953, "Starting to load model "+r.model+"...")
	l.info(main, "cuda.py", 328, "Using Flash Attention backend on V1 engine.")
	l.info(main, "weight_utils.py", 296, "Using model weights format ['*.safetensors']")
	for i := 0; i <= 4; i++ {
		bar := strings.Repeat("█", i*2) + strings.Repeat(" ", 8-i*2)
		l.tick(900)
		l.raw(main, fmt.Sprintf("Loading safetensors checkpoint shards: %3d%% Completed | %d/4 [00:%02d<00:%02d, %.2fit/s]", i*25, i, i*2, (4-i)*2, 0.4+float64(i)/10)+"\r"+bar)
	}
	l.raw(main, "")
	l.info(main, "default_loader.py", 262, "Loading weights took 4.27 seconds")
	if l.era == v0 {
		l.info(main, "model_runner.py", 1067, "Loading model weights took 14.9888 GB")
		return
	}
	l.info(main, "gpu_model_runner.py", 1975, "Model loading took 15.2683 GiB and 5.012816 seconds")
	l.info(main, "backends.py", 530, "Using cache directory: /root/.cache/vllm/torch_compile_cache/7bbd8b4c5a/rank_0_0/backbone for vLLM's torch.compile")
	l.info(main, "backends.py", 541, "Dynamo bytecode transform time: 5.55 s")
	l.tick(7000)
	l.info(main, "backends.py", 215, "Compiling a graph for dynamic shape takes 20.66 s")
	l.info(main, "monitor.py", 34, "torch.compile takes 26.21 s in total")
}

func (l *logw) kvCache(r run, availGiB float64, tokens int) {
	if l.era == v0 {
		l.info("", "distributed_gpu_executor.py", 57, fmt.Sprintf("# GPU blocks: %d, # CPU blocks: 2048", tokens/16))
		l.info("", "distributed_gpu_executor.py", 61, fmt.Sprintf("Maximum concurrency for %d tokens per request: %.2fx", r.maxLen, float64(tokens)/float64(r.maxLen)))
		return
	}
	l.info(l.core, "gpu_worker.py", 276, fmt.Sprintf("Available KV cache memory: %.2f GiB", availGiB))
	l.info(l.core, "kv_cache_utils.py", 849, fmt.Sprintf("GPU KV cache size: %s tokens", commas(tokens)))
	l.info(l.core, "kv_cache_utils.py", 853, fmt.Sprintf("Maximum concurrency for %s tokens per request: %.2fx", commas(r.maxLen), float64(tokens)/float64(r.maxLen)))
}

func commas(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func (l *logw) graphs() {
	main := l.core
	if l.era == v0 {
		l.info("", "model_runner.py", 1394, "Capturing cudagraphs for decoding. This may lead to unexpected consequences if the model is not static.")
		l.tick(12000)
		l.info("", "model_runner.py", 1523, "Graph capturing finished in 12 secs, took 0.82 GiB")
		return
	}
	for _, p := range []int{0, 25, 50, 75, 100} {
		l.tick(1500)
		l.raw(main, fmt.Sprintf("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): %3d%%|%s| %d/67 [00:%02d<00:00, 9.21it/s]", p, strings.Repeat("█", p/10)+strings.Repeat(" ", 10-p/10), p*67/100, p/14))
	}
	l.info(main, "gpu_model_runner.py", 2708, "Graph capturing finished in 7 secs, took 0.95 GiB")
	l.info(main, "core.py", 214, "init engine (profile, create kv cache, warmup model) took 38.21 seconds")
}

var routes = []string{"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/health", "/load", "/ping", "/tokenize", "/detokenize", "/v1/models", "/version", "/v1/responses", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/v1/audio/transcriptions", "/rerank", "/v1/rerank", "/invocations", "/metrics"}

func (l *logw) serverStart(ready bool) {
	switch l.era {
	case v0:
		l.info("", "api_server.py", 532, "Using supplied chat template:\nNone")
		l.info("", "launcher.py", 19, "Available routes are:")
		for _, r := range routes[:14] {
			l.info("", "launcher.py", 27, "Route: "+r+", Methods: GET, POST")
		}
	case v1ansi:
		l.info(l.api, "api_server.py", 1857, "Starting vLLM API server 0 on http://0.0.0.0:8000")
		l.info(l.api, "launcher.py", 29, "Available routes are:")
		for _, r := range routes {
			l.info(l.api, "launcher.py", 37, "Route: "+r+", Methods: GET")
		}
	case y2026:
		l.info(l.api, "api_server.py", 1402, "Starting vLLM server on http://0.0.0.0:8000")
		l.info(l.api, "launcher.py", 29, "Available routes are:")
		for _, r := range routes {
			l.info(l.api, "launcher.py", 37, "Route: "+r+", Methods: POST")
		}
	}
	l.raw(l.api, vllmlog.Uvicorn("Started server process [1]"), vllmlog.Uvicorn("Waiting for application startup."))
	if ready {
		l.raw(l.api, vllmlog.Uvicorn("Application startup complete."))
	}
}

// serve writes n lines of a healthy server: access logs and stats.
func (l *logw) serve(n int) {
	for i := 0; i < n; i++ {
		l.tick(200 + l.r.IntN(3000))
		switch l.r.IntN(4) {
		case 0:
			if l.era == v0 {
				l.info("", "metrics.py", 351, fmt.Sprintf("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: 0.0%%.", l.r.Float64()*3000, l.r.Float64()*900, l.r.IntN(40), l.r.Float64()*60))
			} else {
				l.info(l.api, "loggers.py", 123, fmt.Sprintf("Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: 0 reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%", l.r.Float64()*3000, l.r.Float64()*900, l.r.IntN(40), l.r.Float64()*60, l.r.Float64()*40))
			}
		case 1:
			if l.era != v0 {
				l.info(l.api, "logger.py", 41, fmt.Sprintf("Received request chatcmpl-%08x: prompt: '<|im_start|>user\\nSummarise the attached report<|im_end|>', params: SamplingParams(n=1, temperature=0.7, max_tokens=512), lora_request: None.", l.r.Uint32()))
				continue
			}
			fallthrough
		default:
			l.raw(l.api, vllmlog.FormatAccess(fmt.Sprintf("10.0.3.%d:%d", 2+l.r.IntN(200), 40000+l.r.IntN(20000)), "POST", "/v1/chat/completions", "HTTP/1.1", 200, "OK"))
		}
	}
}

func (l *logw) shutdownTail() {
	l.raw(l.api, vllmlog.Uvicorn("Shutting down"), vllmlog.Uvicorn("Waiting for application shutdown."), vllmlog.Uvicorn("Application shutdown complete."), vllmlog.Uvicorn("Finished server process [1]"))
}

// interleave merges per-process line lists the way concurrent writers mix.
func (l *logw) interleave(procs []string, bodies [][]string) {
	idx := make([]int, len(bodies))
	for {
		left := false
		for i := range bodies {
			if idx[i] >= len(bodies[i]) {
				continue
			}
			left = true
			k := 1 + l.r.IntN(3)
			for ; k > 0 && idx[i] < len(bodies[i]); k-- {
				l.raw(procs[i], bodies[i][idx[i]])
				idx[i]++
			}
		}
		if !left {
			return
		}
	}
}

// ---- common failure tails ------------------------------------------------

// engineStartFailure: the V1 wrapper lines around a root cause raised in the
// engine core while starting, and the API server's own traceback.
func (l *logw) engineStartFailure(root []string) {
	l.err(l.core, "core.py", 700, "EngineCore failed to start.")
	l.raw(l.core, traceback([][]string{
		frame("vllm/v1/engine/core.py", 691, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
		frame("vllm/v1/engine/core.py", 492, "__init__", "super().__init__(vllm_config, executor_class, log_stats,"),
		frame("vllm/v1/engine/core.py", 89, "__init__", "self._initialize_kv_caches(vllm_config)"),
		frame("vllm/v1/engine/core.py", 179, "_initialize_kv_caches", "self.model_executor.determine_available_memory())"),
	}, root...)...)
	l.raw(l.core, "Process EngineCore_0:")
	l.tick(400)
	l.raw(l.api, traceback([][]string{
		frame("vllm/entrypoints/openai/api_server.py", 1920, "<module>", "uvloop.run(run_server(args))"),
		frame("vllm/entrypoints/openai/api_server.py", 1850, "run_server", "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
		frame("vllm/v1/engine/core_client.py", 448, "__init__", "with launch_core_engines(vllm_config, executor_class,"),
		frame("vllm/v1/engine/utils.py", 729, "wait_for_engine_startup", "raise RuntimeError(\"Engine core initialization failed. \""),
	}, "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")...)
	l.raw("", "/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: There appear to be 1 leaked shared_memory objects to clean up at shutdown")
}

// engineRuntimeDeath: the V1 wrappers after the engine dies while serving;
// the API server then shuts down and exits 0.
func (l *logw) engineRuntimeDeath(root []string) {
	l.err(l.core, "core.py", 711, "EngineCore encountered a fatal error.")
	l.raw(l.core, traceback([][]string{
		frame("vllm/v1/engine/core.py", 702, "run_engine_core", "engine_core.run_busy_loop()"),
		frame("vllm/v1/engine/core.py", 729, "run_busy_loop", "self._process_engine_step()"),
		frame("vllm/v1/engine/core.py", 754, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
		frame("vllm/v1/worker/gpu_model_runner.py", 1580, "execute_model", "model_output = self.model("),
	}, root...)...)
	l.tick(300)
	l.err(l.api, "async_llm.py", 420, "AsyncLLM output_handler failed.")
	l.raw(l.api, traceback([][]string{
		frame("vllm/v1/engine/async_llm.py", 379, "output_handler", "outputs = await engine_core.get_output_async()"),
		frame("vllm/v1/engine/core_client.py", 790, "get_output_async", "raise self._format_exception(outputs) from None"),
	}, "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.")...)
	for i := 0; i < 3; i++ {
		l.raw(l.api, vllmlog.FormatAccess(fmt.Sprintf("10.0.3.%d:%d", 10+i, 51000+i), "POST", "/v1/chat/completions", "HTTP/1.1", 500, "Internal Server Error"))
	}
	l.tick(5000)
	l.shutdownTail()
}

// noiseBefore is what a container or a venv prints before vLLM's first line.
func (l *logw) noiseBefore() {
	l.raw("", "", "==========", "== CUDA ==", "==========", "", "CUDA Version 12.8.1", "",
		"Container image Copyright (c) 2016-2025, NVIDIA CORPORATION & AFFILIATES. All rights reserved.", "",
		"This container image and its contents are governed by the NVIDIA Deep Learning Container License.",
		"By pulling and using the container, you accept the terms and conditions of this license:",
		"https://developer.nvidia.com/ngc/nvidia-deep-learning-container-license", "",
		"A copy of this license is made available in this container at /NGC-DL-CONTAINER-LICENSE for your convenience.", "",
		"/usr/local/lib/python3.12/dist-packages/transformers/utils/hub.py:111: FutureWarning: Using `TRANSFORMERS_CACHE` is deprecated and will be removed in v5 of Transformers. Use `HF_HOME` instead.",
		"  warnings.warn(")
}

// noiseAfter is what dying Python processes print after the last log line.
func (l *logw) noiseAfter() {
	l.tick(800)
	l.raw("", "[rank0]:[W1012 08:14:51.402119850 ProcessGroupNCCL.cpp:1479] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources. For more info, please see https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())",
		"/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: There appear to be 2 leaked semaphore objects to clean up at shutdown",
		"  warnings.warn('resource_tracker: There appear to be %d '")
}

// usage is argparse's usage block of `vllm serve`, printed before its error.
func (l *logw) usage(prog string) {
	l.raw("", "usage: "+prog+" [-h] [--host HOST] [--port PORT]")
	flags := []string{"--uvicorn-log-level {critical,debug,error,info,trace,warning}", "--disable-uvicorn-access-log", "--allow-credentials",
		"--allowed-origins ALLOWED_ORIGINS", "--allowed-methods ALLOWED_METHODS", "--api-key API_KEY", "--lora-modules LORA_MODULES [LORA_MODULES ...]",
		"--chat-template CHAT_TEMPLATE", "--response-role RESPONSE_ROLE", "--ssl-keyfile SSL_KEYFILE", "--ssl-certfile SSL_CERTFILE",
		"--root-path ROOT_PATH", "--middleware MIDDLEWARE", "--enable-auto-tool-choice", "--tool-call-parser TOOL_CALL_PARSER",
		"--model MODEL", "--tokenizer TOKENIZER", "--revision REVISION", "--dtype {auto,bfloat16,float,float16,float32,half}",
		"--max-model-len MAX_MODEL_LEN", "--tensor-parallel-size TENSOR_PARALLEL_SIZE", "--pipeline-parallel-size PIPELINE_PARALLEL_SIZE",
		"--gpu-memory-utilization GPU_MEMORY_UTILIZATION", "--kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES", "--max-num-batched-tokens MAX_NUM_BATCHED_TOKENS",
		"--max-num-seqs MAX_NUM_SEQS", "--enforce-eager", "--enable-prefix-caching | --no-enable-prefix-caching", "--served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]",
		"--quantization QUANTIZATION", "--trust-remote-code", "--download-dir DOWNLOAD_DIR", "--load-format LOAD_FORMAT", "--seed SEED"}
	pad := strings.Repeat(" ", len("usage: "+prog)+1)
	for _, f := range flags {
		l.raw("", pad+"["+f+"]")
	}
	l.raw("", pad+"[model_tag]")
}

// ---- scenarios -------------------------------------------------------------

var qwen = run{version: "0.10.1.1", model: "Qwen/Qwen2.5-7B-Instruct", util: 0.85, seqs: 256, maxLen: 32768, tp: 1}

func startup(l *logw, r run) {
	l.preamble()
	l.banner(r)
	l.engineInit(r)
	l.distInit(r.tp)
	l.loadWeights(r)
}

func healthyStart(l *logw, r run, avail float64, tokens int) {
	startup(l, r)
	l.kvCache(r, avail, tokens)
	l.graphs()
	l.serverStart(true)
}

func main() {
	dir := filepath.Join("internal", "cause", "testdata", "logs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	for name, text := range scenarios() {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
}
