// Command gen writes the classifier's log corpus (policy/testdata/logs) from
// the facts in shared/VLLM-FACTS.md: the eras of vLLM's log format (V0 2024
// without brackets, V1 2025 with ANSI process prefixes, 2026 without ANSI),
// tensor-parallel workers interleaving, and journalctl/docker/Kubernetes
// wrappers. The logs are synthetic, written for this project, and the output
// is deterministic. Run from the repository root:
//
//	go run ./policy/testdata/gen
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

func scenarios() map[string]string {
	out := map[string]string{}

	// --- V0, 2024 -------------------------------------------------------
	r0 := run{version: "0.6.3.post1", model: "meta-llama/Llama-3.1-8B-Instruct", util: 0.9, seqs: 256, maxLen: 16384, tp: 1}
	{
		l := newLog(v0, plain, "2024-10-14 12:00:00", 1)
		l.noiseBefore()
		healthyStart(l, r0, 0, 23648)
		l.serve(120)
		out["v0-2024-ready.log"] = l.String()
	}
	{
		l := newLog(v0, plain, "2024-10-15 08:10:00", 2)
		l.noiseBefore()
		healthyStart(l, r0, 0, 23648)
		l.serve(60)
		l.err("", "async_llm_engine.py", 63, "Engine background task failed")
		l.raw("", traceback([][]string{
			frame("vllm/engine/async_llm_engine.py", 53, "_log_task_completion", "return_value = task.result()"),
			frame("vllm/engine/async_llm_engine.py", 939, "run_engine_loop", "result = task.result()"),
			frame("vllm/worker/model_runner.py", 1703, "execute_model", "hidden_or_intermediate_states = model_executable("),
			frame("torch/nn/modules/module.py", 1736, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
		}, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Process 51233 has 78.12 GiB memory in use. Of the allocated memory 74.40 GiB is allocated by PyTorch, and 2.91 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")...)
		l.raw("", "", "The above exception was the direct cause of the following exception:", "")
		l.raw("", traceback([][]string{
			frame("vllm/engine/async_llm_engine.py", 65, "_log_task_completion", "raise AsyncEngineDeadError("),
		}, "vllm.engine.async_llm_engine.AsyncEngineDeadError: Task finished unexpectedly. This should never happen! Please open an issue on Github. See stack trace above for the actual cause.")...)
		l.err("", "client.py", 250, "RuntimeError('Engine loop has died')")
		l.err("", "launcher.py", 88, "MQLLMEngine is already dead, terminating server process")
		l.raw("", vllmlog.FormatAccess("10.0.3.7:41512", "POST", "/v1/chat/completions", "HTTP/1.1", 500, "Internal Server Error"))
		l.shutdownTail()
		l.noiseAfter()
		out["v0-2024-oom-runtime.log"] = l.String()
	}
	{
		l := newLog(v0, plain, "2024-09-02 17:45:10", 3)
		l.noiseBefore()
		r := r0
		r.maxLen = 131072
		startup(l, r)
		l.kvCache(r, 0, 23648)
		l.raw("", traceback([][]string{
			frame("vllm/entrypoints/openai/api_server.py", 585, "<module>", "uvloop.run(run_server(args))"),
			frame("vllm/engine/llm_engine.py", 338, "__init__", "self._initialize_kv_caches()"),
			frame("vllm/engine/llm_engine.py", 480, "_initialize_kv_caches", "self.model_executor.initialize_cache(num_gpu_blocks, num_cpu_blocks)"),
			frame("vllm/worker/worker.py", 462, "raise_if_cache_size_invalid", "raise ValueError("),
		}, "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (23648). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")...)
		l.raw("", "/usr/lib/python3.10/multiprocessing/resource_tracker.py:224: UserWarning: resource_tracker: There appear to be 1 leaked semaphore objects to clean up at shutdown")
		l.noiseAfter()
		out["v0-2024-kv-maxseqlen.log"] = l.String()
	}
	{
		l := newLog(v0, plain, "2024-08-20 10:00:00", 4)
		l.noiseBefore()
		l.info("", "__init__.py", 216, "Automatically detected platform cuda.")
		l.usage("api_server.py")
		l.raw("", "api_server.py: error: argument --gpu-memory-utilization: invalid float value: '0.9x'")
		out["v0-2024-argparse.log"] = l.String()
	}
	{
		l := newLog(v0, plain, "2024-11-03 03:12:44", 5)
		l.noiseBefore()
		r := r0
		r.version = "0.6.4.post1"
		startup(l, r)
		l.raw("", traceback([][]string{
			frame("vllm/engine/llm_engine.py", 469, "_initialize_kv_caches", "self.model_executor.determine_num_available_blocks())"),
			frame("vllm/worker/worker.py", 202, "determine_num_available_blocks", "self.baseline_snapshot)"),
			frame("vllm/utils.py", 1623, "memory_profiling", "assert weights_memory > 0 and ..."),
		}, "AssertionError: Error in memory profiling. Initial free memory 31.2 GiB, current free memory 32.4 GiB. This happens when the GPU memory was not properly cleaned up before initializing the vLLM instance.")...)
		l.noiseAfter()
		out["v0-2024-gpu-busy.log"] = l.String()
	}
	{
		l := newLog(v0, plain, "2024-12-01 22:01:00", 6)
		l.noiseBefore()
		healthyStart(l, r0, 0, 23648)
		l.serve(40)
		l.err("", "async_llm_engine.py", 63, "Engine background task failed")
		l.raw("", traceback([][]string{
			frame("vllm/worker/model_runner.py", 1703, "execute_model", "hidden_or_intermediate_states = model_executable("),
			frame("vllm/attention/backends/flash_attn.py", 719, "forward", "flash_attn_varlen_func("),
		}, "RuntimeError: CUDA error: an illegal memory access was encountered", "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.", "For debugging consider passing CUDA_LAUNCH_BLOCKING=1", "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")...)
		l.err("", "client.py", 250, "RuntimeError('Engine loop has died')")
		l.shutdownTail()
		l.noiseAfter()
		out["v0-2024-crash-illegal-memory.log"] = l.String()
	}

	// --- V1, 2025, ANSI ----------------------------------------------------
	{
		l := newLog(v1ansi, plain, "2025-07-22 09:00:00", 11)
		l.noiseBefore()
		healthyStart(l, qwen, 16.23, 425424)
		l.serve(150)
		out["v1-2025-ansi-ready.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-07-23 09:00:00", 12)
		l.noiseBefore()
		healthyStart(l, qwen, 16.23, 425424)
		l.serve(50)
		for i := 0; i < 3; i++ {
			l.err(l.api, "serving_chat.py", 222, "Error in preprocessing prompt inputs")
			l.raw(l.api, traceback([][]string{
				frame("vllm/entrypoints/openai/serving_chat.py", 205, "create_chat_completion", ") = await self._preprocess_chat("),
				frame("vllm/entrypoints/openai/serving_engine.py", 411, "_validate_input", "raise ValueError("),
			}, "ValueError: This model's maximum context length is 32768 tokens. However, you requested 40211 tokens (39187 in the messages, 1024 in the completion). Please reduce the length of the messages or completion.")...)
			l.raw(l.api, vllmlog.FormatAccess("10.0.3.9:50122", "POST", "/v1/chat/completions", "HTTP/1.1", 400, "Bad Request"))
			l.serve(20)
		}
		out["v1-2025-ready-request-errors.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-05-10 14:20:00", 13)
		l.noiseBefore()
		r := qwen
		r.version, r.seqs, r.util = "0.9.1", 1024, 0.92
		startup(l, r)
		l.kvCache(r, 9.87, 184800)
		l.engineStartFailure([]string{
			"RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.",
		})
		l.noiseAfter()
		out["v1-2025-ansi-oom-sampler.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-06-01 11:00:00", 14)
		l.noiseBefore()
		r := qwen
		r.maxLen = 131072
		startup(l, r)
		l.info(l.core, "gpu_worker.py", 276, "Available KV cache memory: 2.50 GiB")
		l.engineStartFailure([]string{
			"ValueError: To serve at least one request with the models's max seq len (131072), (4.00 GiB KV cache is needed, which is larger than the available KV cache memory (2.50 GiB). Based on the available memory, the estimated maximum model length is 81920. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
		})
		l.noiseAfter()
		out["v1-2025-ansi-kv.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-08-11 06:30:00", 15)
		l.noiseBefore()
		r := qwen
		r.util = 0.95
		l.preamble()
		l.banner(r)
		l.engineInit(r)
		l.distInit(1)
		l.engineStartFailure([]string{
			"ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired GPU memory utilization (0.95, 45.01 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
		})
		l.noiseAfter()
		out["v1-2025-ansi-gpu-busy.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-03-17 16:05:00", 16)
		l.noiseBefore()
		r := qwen
		r.model = "Qwen/Qwen2.5-7B-Instruc"
		l.preamble()
		l.banner(r)
		l.raw(l.api, traceback([][]string{
			frame("huggingface_hub/utils/_http.py", 409, "hf_raise_for_status", "response.raise_for_status()"),
			frame("requests/models.py", 1024, "raise_for_status", "raise HTTPError(http_error_msg, response=self)"),
		}, "requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/Qwen/Qwen2.5-7B-Instruc/resolve/main/config.json")...)
		l.raw(l.api, "", "The above exception was the direct cause of the following exception:", "")
		l.raw(l.api, traceback([][]string{
			frame("transformers/utils/hub.py", 403, "cached_file", "resolved_file = hf_hub_download("),
		}, "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-67d84a1c-2b1f)", "", "Repository Not Found for url: https://huggingface.co/Qwen/Qwen2.5-7B-Instruc/resolve/main/config.json.", "Please make sure you specified the correct `repo_id` and `repo_type`.", "If you are trying to access a private or gated repo, make sure you are authenticated.")...)
		l.raw(l.api, "", "The above exception was the direct cause of the following exception:", "")
		l.raw(l.api, traceback([][]string{
			frame("vllm/transformers_utils/config.py", 295, "get_config", "config_dict, _ = PretrainedConfig.get_config_dict("),
		}, "OSError: Qwen/Qwen2.5-7B-Instruc is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'", "If this is a private repository, make sure to pass a token having permission to this repo either by logging in with `huggingface-cli login` or by passing `token=<your_token>`")...)
		l.noiseAfter()
		out["v1-2025-ansi-model-not-found.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-04-02 13:00:00", 17)
		l.noiseBefore()
		r := run{version: "0.8.5", model: "meta-llama/Llama-3.3-70B-Instruct", util: 0.92, seqs: 512, maxLen: 65536, tp: 4}
		l.core = "EngineCore_0 pid=290"
		startup(l, r)
		ws := l.workers(4)
		var bodies [][]string
		for i := range ws {
			root := "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
			if i == 2 {
				root = "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'"
			}
			body := append([]string{l.line("", "ERROR", "multiproc_executor.py", 470, "WorkerProc hit an exception.")},
				traceback([][]string{
					frame("vllm/v1/executor/multiproc_executor.py", 465, "worker_busy_loop", "output = func(*args, **kwargs)"),
					frame("vllm/v1/worker/gpu_worker.py", 185, "determine_available_memory", "self.model_runner.profile_run()"),
					frame("vllm/distributed/device_communicators/pynccl.py", 123, "all_reduce", "self.nccl.ncclAllReduce(buffer_type(in_tensor.data_ptr()),"),
				}, strings.Split(root, "\n")...)...)
			bodies = append(bodies, body)
		}
		l.interleave(ws, bodies)
		l.err(l.core, "multiproc_executor.py", 140, "Worker proc VllmWorker-2 died unexpectedly, shutting down executor.")
		l.engineStartFailure([]string{"Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause."})
		l.noiseAfter()
		out["v1-2025-tp4-nccl-oom.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-09-09 19:00:00", 18)
		l.noiseBefore()
		r := run{version: "0.10.2", model: "Qwen/Qwen2.5-32B-Instruct", util: 0.9, seqs: 256, maxLen: 32768, tp: 2}
		l.core = "EngineCore_DP0 pid=301"
		healthyStart(l, r, 22.4, 183000)
		l.serve(80)
		ws := l.workers(2)
		bodies := [][]string{
			{"[rank0]:[E909 19:41:02.123 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=81234, OpType=ALLREDUCE, NumelIn=8388608, NumelOut=8388608, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
				"[rank0]:[E909 19:41:02.125 ProcessGroupNCCL.cpp:2168] [PG ID 2 PG GUID 3 Rank 0] failure detected by watchdog at work sequence id: 81234 PG status: last enqueued work: 81234, last completed work: 81233",
				"terminate called after throwing an instance of 'c10::DistBackendError'"},
			{"[rank1]:[E909 19:41:03.001 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=81234, OpType=ALLREDUCE, NumelIn=8388608, NumelOut=8388608, Timeout(ms)=600000) ran for 600871 milliseconds before timing out.",
				"Fatal Python error: Aborted"},
		}
		l.interleave(ws, bodies)
		l.err(l.core, "multiproc_executor.py", 149, "Worker proc VllmWorker-1 died unexpectedly, shutting down executor.")
		l.engineRuntimeDeath([]string{"Exception: Worker failed with error 'Worker proc died unexpectedly', please check the stack trace above for the root cause"})
		l.noiseAfter()
		out["v1-2025-tp2-nccl-crash.log"] = l.String()
	}
	{
		l := newLog(v1ansi, plain, "2025-10-20 07:00:00", 19)
		l.noiseBefore()
		l.preamble()
		l.banner(qwen)
		l.engineInit(qwen)
		for i := 0; i < 40; i++ {
			l.tick(10000)
			l.log(l.api, "DEBUG", "utils.py", 751, "Waiting for 1 local, 0 remote core engine proc(s) to start.")
		}
		out["v1-2025-hang-startup.log"] = l.String()
	}
	{
		l := newLog(v1ansi, docker, "2025-11-04 02:00:00", 20)
		l.noiseBefore()
		l.core = "EngineCore_DP0 pid=188"
		r := qwen
		r.version, r.util = "0.11.0", 0.9
		l.preamble()
		l.banner(r)
		l.engineInit(r)
		l.distInit(1)
		l.engineStartFailure([]string{
			"ValueError: Free memory on device (20.11/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
		})
		l.noiseAfter()
		out["docker-2025-gpu-busy.log"] = l.String()
	}

	// --- 2026, no ANSI ------------------------------------------------------
	r26 := run{version: "0.14.1", model: "Qwen/Qwen3-8B", util: 0.85, seqs: 256, maxLen: 40960, tp: 1}
	{
		l := newLog(y2026, plain, "2026-01-12 10:00:00", 21)
		l.noiseBefore()
		healthyStart(l, r26, 41.2, 300032)
		l.serve(90)
		l.engineRuntimeDeath([]string{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 79.19 GiB of which 612.31 MiB is free. Including non-PyTorch memory, this process has 78.58 GiB memory in use. Of the allocated memory 72.14 GiB is allocated by PyTorch, and 4.91 GiB is reserved by PyTorch but unallocated."})
		l.noiseAfter()
		out["2026-oom-runtime.log"] = l.String()
	}
	{
		l := newLog(y2026, plain, "2026-02-03 18:22:00", 22)
		l.noiseBefore()
		r := r26
		r.util = 0.6
		startup(l, r)
		l.info(l.core, "gpu_worker.py", 276, "Available KV cache memory: -2.14 GiB")
		l.engineStartFailure([]string{"ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."})
		l.noiseAfter()
		out["2026-negative-kv.log"] = l.String()
	}
	{
		l := newLog(y2026, plain, "2026-02-14 08:00:00", 23)
		l.noiseBefore()
		// vLLM binds its port before loading: a taken port fails right after the banner.
		l.preamble()
		l.banner(r26)
		l.info(l.api, "config.py", 1604, fmt.Sprintf("Using max model len %d", r26.maxLen))
		l.raw(l.api, "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use")
		l.raw(l.api, traceback([][]string{
			frame("vllm/entrypoints/openai/api_server.py", 1920, "<module>", "uvloop.run(run_server(args))"),
			frame("vllm/entrypoints/openai/api_server.py", 1838, "run_server", "sock = create_server_socket(sock_addr)"),
			frame("vllm/entrypoints/openai/api_server.py", 1801, "create_server_socket", "sock.bind(addr)"),
		}, "OSError: [Errno 98] Address already in use")...)
		l.noiseAfter()
		out["2026-address-in-use.log"] = l.String()
	}
	{
		l := newLog(y2026, plain, "2026-03-01 12:00:00", 24)
		l.noiseBefore()
		l.info("", "__init__.py", 216, "Automatically detected platform cuda.")
		l.usage("vllm serve")
		l.raw("", "vllm serve: error: unrecognized arguments: --swap-space 4")
		out["2026-unrecognized-args.log"] = l.String()
	}
	{
		l := newLog(y2026, plain, "2026-03-09 09:09:00", 25)
		l.noiseBefore()
		r := r26
		r.tp = 3
		l.preamble()
		l.banner(r)
		l.raw(l.api, traceback([][]string{
			frame("vllm/entrypoints/cli/serve.py", 58, "cmd", "uvloop.run(run_server(args))"),
			frame("vllm/engine/arg_utils.py", 1302, "create_engine_config", "config = VllmConfig("),
			frame("pydantic/_internal/_dataclasses.py", 121, "__init__", "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)"),
		}, "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
			"  Value error, Total number of attention heads (32) must be divisible by tensor parallel size (3). [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]",
			"    For further information visit https://errors.pydantic.dev/2.11/v/value_error")...)
		l.noiseAfter()
		out["2026-valueerror.log"] = l.String()
	}
	{
		l := newLog(y2026, plain, "2026-04-18 21:00:00", 26)
		l.noiseBefore()
		healthyStart(l, r26, 41.2, 300032)
		l.serve(70)
		l.err(l.api, "core_client.py", 564, "Engine core proc EngineCore died unexpectedly, shutting down client.")
		l.tick(300)
		l.err(l.api, "async_llm.py", 420, "AsyncLLM output_handler failed.")
		l.raw(l.api, traceback([][]string{
			frame("vllm/v1/engine/async_llm.py", 379, "output_handler", "outputs = await engine_core.get_output_async()"),
		}, "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.")...)
		l.tick(5000)
		l.shutdownTail()
		l.noiseAfter()
		out["2026-crash-died.log"] = l.String()
	}
	{
		l := newLog(y2026, cri, "2026-01-20 04:00:00", 27)
		l.noiseBefore()
		healthyStart(l, r26, 41.2, 300032)
		l.serve(100)
		out["k8s-2026-ready.log"] = l.String()
	}

	// --- journalctl -----------------------------------------------------------
	{
		l := newLog(y2026, journal, "2025-12-02 09:30:00", 31)
		l.sys("systemd[1]", "Started vllm.service - vLLM OpenAI-compatible server.")
		r := r26
		r.version, r.seqs = "0.12.0", 512
		startup(l, r)
		l.engineStartFailure([]string{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.71 GiB. GPU 0 has a total capacity of 44.40 GiB of which 2.10 GiB is free. Including non-PyTorch memory, this process has 42.29 GiB memory in use."})
		l.sys("systemd[1]", "vllm.service: Main process exited, code=exited, status=1/FAILURE")
		l.sys("systemd[1]", "vllm.service: Failed with result 'exit-code'.")
		l.sys("systemd[1]", "vllm.service: Consumed 1min 12.331s CPU time, 9.2G memory peak.")
		out["journal-2025-oom.log"] = l.String()
	}
	{
		l := newLog(y2026, journal, "2025-12-05 14:00:00", 32)
		l.sys("systemd[1]", "Started vllm.service - vLLM OpenAI-compatible server.")
		healthyStart(l, r26, 41.2, 300032)
		l.serve(40)
		l.tick(2000)
		l.sys("kernel", "python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0")
		l.sys("kernel", "CPU: 31 PID: 4188 Comm: python3 Tainted: P           OE      6.8.0-49-generic #49-Ubuntu")
		l.sys("kernel", "memory: usage 67108864kB, limit 67108864kB, failcnt 1311")
		l.sys("kernel", "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,oom_memcg=/system.slice/vllm.service,task_memcg=/system.slice/vllm.service,task=python3,pid=4121,uid=1000")
		l.sys("kernel", "Memory cgroup out of memory: Killed process 4121 (python3) total-vm:112233440kB, anon-rss:66012344kB, file-rss:412332kB, shmem-rss:0kB, UID:1000 pgtables:140212kB oom_score_adj:0")
		l.sys("systemd[1]", "vllm.service: A process of this unit has been killed by the OOM killer.")
		l.sys("systemd[1]", "vllm.service: Main process exited, code=killed, status=9/KILL")
		l.sys("systemd[1]", "vllm.service: Failed with result 'oom-kill'.")
		out["journal-host-oom.log"] = l.String()
	}
	{
		l := newLog(y2026, journal, "2025-12-09 10:00:00", 33)
		l.sys("systemd[1]", "Started vllm.service - vLLM OpenAI-compatible server.")
		healthyStart(l, r26, 41.2, 300032)
		l.serve(30)
		l.engineRuntimeDeath([]string{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 301.44 MiB is free."})
		l.sys("systemd[1]", "vllm.service: Deactivated successfully.")
		l.sys("systemd[1]", "vllm.service: Scheduled restart job, restart counter is at 1.")
		l.sys("systemd[1]", "Started vllm.service - vLLM OpenAI-compatible server.")
		healthyStart(l, r26, 41.2, 300032)
		l.serve(60)
		out["journal-restart-then-ready.log"] = l.String()
	}
	return out
}

func main() {
	dir := filepath.Join("policy", "testdata", "logs")
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
