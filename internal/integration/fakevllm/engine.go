package main

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// rank is one holder of the model's memory: the engine itself (TP=1) or
// a tensor-parallel worker on its own device.
type rank struct {
	gpu     *gpuView
	pid     int
	publish func(int64) error
}

// engine is the EngineCore process: it loads the model, holds the GPU
// memory and dies of the memory failures. It has no parent-death signal:
// when the API process is SIGKILLed it lives on as a real orphan until
// FAKEVLLM_ORPHAN_TTL after its stdin closed.
type engine struct {
	args   *serveArgs
	env    *simEnv
	faults faults
	log    *logger
	gpu    *gpuView
	mm     memModel
	pid    int

	toAPIMu sync.Mutex
	toAPI   *os.File

	exitMu  sync.Mutex
	exiting atomic.Bool
	// drainShutdown: the API process is draining (vLLM 0.32.0, v1 era)
	// and told the engine so; its SIGTERM then ends with the executor line.
	drainShutdown atomic.Bool
	loaded        atomic.Bool
	workersMu     sync.Mutex
	workers       []*tpWorker
	ranks         []rank
	maxLen        int // max_model_len after auto-fit
	usedMu        sync.Mutex
	used          int64
	lastMem       string
	started       time.Time
	sleep         engineSleep // sleep mode (sleep.go); only the serve loop touches it
	ipc           ipcState    // --load-format ipc_cache (ipccache.go)
	savePlan      func()      // the startup plan to save after the graphs (startupplan.go)
}

func runEngine(argv []string) int {
	env, err := loadEnv(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	args, err := parseServeArgsFor(argv, env.Era)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakevllm engine: bad arguments from the API process: %v\n", err)
		return 2
	}
	// The API process already checked the marker; these are the live faults.
	f, err := parseFaults(os.Getenv(engineFaultsEnv))
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakevllm engine: %s: %v\n", engineFaultsEnv, err)
		return 2
	}
	stats := &writeStats{}
	e := &engine{
		args:    args,
		env:     env,
		faults:  f,
		pid:     os.Getpid(),
		toAPI:   os.NewFile(3, "engine-to-api"),
		started: time.Now(),
	}
	e.log = newLogger(env.Era, "EngineCore_0", e.pid,
		&streamWriter{w: os.Stdout, stats: stats}, &streamWriter{w: os.Stderr, stats: stats})
	return e.run()
}

func (e *engine) run() int {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM)
	// The API process owns Ctrl-C; it stops the engine with SIGTERM.
	signal.Ignore(syscall.SIGINT)
	go func() {
		for range sig {
			if e.faults.has(fIgnoreSIGTERM) {
				e.env.fired()
				continue
			}
			// The EngineCore handles SIGTERM by shutting down at once; the
			// API process, if it did not send it, sees an engine death.
			if e.drainShutdown.Load() {
				// vLLM 0.32.0's drain ends with the executor's teardown line.
				e.log.info("multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=0")
			}
			e.send(formatMsg("dead", "reason", "sigterm"))
			e.exit(0)
		}
	}()
	fromAPI := make(chan msg, 64)
	go e.readAPI(fromAPI)

	e.startupLines()
	gpu, err := openGPU(e.env)
	if err != nil {
		e.startupFailure(engineStartupTrace(e.env.Era, framesInitDevice, "RuntimeError: "+err.Error()))
	}
	e.gpu = gpu
	e.maxLen = e.args.MaxModelLen
	if tp := e.args.TensorParallel; tp > 1 {
		if err := e.startWorkers(); err != nil {
			e.startupFailure(engineStartupTrace(e.env.Era, framesInitDevice, err.Error()))
		}
		for _, w := range e.workers { // startWorkers returned: the list no longer changes
			w := w
			e.ranks = append(e.ranks, rank{gpu: w.gpu, pid: w.pid(), publish: func(b int64) error {
				w.send(formatMsg("mem", "used", b))
				return nil
			}})
		}
	} else {
		e.ranks = []rank{{gpu: gpu, pid: e.pid, publish: func(b int64) error { return gpu.setUsage(e.pid, b) }}}
	}
	e.mm = memModel{
		Total: gpu.dev.Total, Reserved: gpu.dev.Reserved, Util: e.args.GPUMemUtil,
		KVBytes: e.args.KVCacheMemoryBytes, Weights: e.env.Weights / int64(e.args.TensorParallel), SeqCost: e.env.SeqCost,
		TokenCost: e.env.TokenCost, LeakPerSec: e.env.LeakPerSec, MaxNumSeqs: e.args.MaxNumSeqs,
		BytesPerKV: e.env.KVBytesPerTok,
	}
	if e.args.LoadFormat == "ipc_cache" {
		e.ipcInit()
	}
	e.checkFreeMemory()
	e.loadWeights()
	if e.faults.has(fHangLoading) {
		e.env.fired()
		for {
			// Alive, silent, never ready: only a signal ends this.
			time.Sleep(time.Hour)
		}
	}
	e.compile()
	kvTokens := e.profileKV()
	e.captureGraphs()
	if e.savePlan != nil {
		e.savePlan()
	}
	e.log.info(e.src("core.py:214", "llm_engine.py:459"), "init engine (profile, create kv cache, warmup model) took %.2f seconds", time.Since(e.started).Seconds())
	e.send(formatMsg("loaded", "kv_tokens", kvTokens, "max_model_len", e.maxLen))
	e.loaded.Store(true)
	e.serve(fromAPI)
	return 0
}

// src picks the source location of a log call for the era.
func (e *engine) src(v1, v0 string) string {
	if e.env.Era == eraV0 {
		return v0
	}
	return v1
}

func (e *engine) startupLines() {
	a := e.args
	if e.env.Era == eraV0 {
		e.log.info("llm_engine.py:237", "Initializing an LLM engine (v%s) with config: model=%s, speculative_config=None, tokenizer=%s, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, override_neuron_config=None, rope_scaling=None, rope_theta=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=%d, download_dir=None, load_format=LoadFormat.AUTO, tensor_parallel_size=%d, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=%s, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=%s, num_scheduler_steps=1, enable_prefix_caching=False, use_async_output_proc=True",
			versionOf(e.env.Era), pyStr(a.Model), pyStr(a.Model), a.MaxModelLen, a.TensorParallel, pyBool(a.EnforceEager), a.ServedName)
		return
	}
	e.log.info("core.py:74", "Initializing a V1 LLM engine (v%s) with config: model=%s, speculative_config=None, tokenizer=%s, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=%d, download_dir=None, load_format=auto, tensor_parallel_size=%d, pipeline_parallel_size=1, data_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=%s, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=%s, enable_prefix_caching=True, chunked_prefill_enabled=True, max_num_seqs=%d",
		versionOf(e.env.Era), pyStr(a.Model), pyStr(a.Model), a.MaxModelLen, a.TensorParallel, pyBool(a.EnforceEager), a.ServedName, a.MaxNumSeqs)
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// checkFreeMemory is vLLM's worker init check: the free memory must cover
// utilization × total, else another process (often an orphan of the last
// run) holds the GPU.
func (e *engine) checkFreeMemory() {
	for _, r := range e.ranks {
		e.checkFreeMemoryOn(r)
	}
}

func (e *engine) checkFreeMemoryOn(r rank) {
	others := e.othersUsedOn(r)
	free := r.gpu.dev.Total - r.gpu.dev.Reserved - others
	want := int64(e.args.GPUMemUtil * float64(r.gpu.dev.Total))
	if e.mm.External > 0 {
		// The daemon's weights are part of the budget (ipccache.go).
		e.checkFreeMemoryExternal(free, want)
		return
	}
	if free >= want {
		return
	}
	exc := fmt.Sprintf("ValueError: Free memory on device (%s/%s GiB) on startup is less than desired GPU memory utilization (%s, %s GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
		gibStr(free), gibStr(r.gpu.dev.Total), pyFloat(e.args.GPUMemUtil), gibStr(want))
	e.startupFailure(engineStartupTrace(e.env.Era, framesInitDevice, exc))
}

// othersUsed is the memory of every other process on the device. Without
// shared state only the sibling API process is known.
func (e *engine) othersUsed() int64 { return e.othersUsedOn(e.ranks[0]) }

// othersUsedOn is the memory of every process on r's device but r's.
func (e *engine) othersUsedOn(r rank) int64 {
	if r.gpu.dir == "" {
		if r.gpu == e.ranks[0].gpu {
			return e.env.APIMem
		}
		return 0
	}
	return r.gpu.othersUsed(r.pid)
}

func (e *engine) loadWeights() {
	e.log.info(e.src("gpu_model_runner.py:1953", "model_runner.py:1056"), "Starting to load model %s...", e.args.Model)
	if e.env.Era != eraV0 {
		e.log.info("gpu_model_runner.py:1985", "Loading model from scratch...")
	}
	if e.ipc.on && e.ipcLoad() {
		return
	}
	if e.env.DownloadFor > 0 {
		e.download()
	}
	if e.faults.has(fNCCLOOMStart) {
		e.env.fired()
		e.ncclWarn()
		e.startupFailure(engineStartupTrace(e.env.Era, framesNCCLInit, ncclOOMException))
	}
	e.allocStartup(e.mm.Weights)
	shards := int((e.mm.Weights + 5*gib - 1) / (5 * gib))
	shards = max(1, min(shards, 64))
	start := time.Now()
	bar := e.log.shards(shards)
	d := e.env.LoadWeights
	steps := shards
	if e.faults.has(fCrashOnStart) {
		d, steps = d/2, shards/2
	}
	shown := 0
	runPhase(d, steps, e.env.ProgressEvery, func(step int) {
		switch {
		case step < 0:
			bar.idle(shown)
		case step > 0:
			shown = step
			if shown < shards {
				bar.step(shown)
			}
		}
	})
	if e.faults.has(fCrashOnStart) {
		e.env.fired()
		bar.close(shown)
		e.startupFailure(engineStartupTrace(e.env.Era, framesLoadModel, "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"))
	}
	if e.env.Era == eraV1Plain {
		bar.step(shards)
	}
	bar.close(shards)
	took := time.Since(start)
	if e.env.Era == eraV0 {
		e.log.info("model_runner.py:1067", "Loading model weights took %.4f GB", float64(e.mm.Weights)/float64(gib))
		return
	}
	e.log.info("default_loader.py:262", "Loading weights took %.2f seconds", took.Seconds())
	e.log.info("gpu_model_runner.py:2007", "Model loading took %.4f GiB and %.6f seconds", float64(e.mm.Weights)/float64(gib), took.Seconds()+0.01)
}

func (e *engine) compile() {
	if e.env.Era == eraV0 || e.args.EnforceEager {
		return
	}
	start := time.Now()
	runPhase(e.env.Compile, 0, e.env.ProgressEvery, func(step int) {
		if step < 0 && !e.env.SilentCompile {
			e.log.info("backends.py:215", "Compiling a graph for dynamic shape takes %.2f s", time.Since(start).Seconds())
		}
	})
	took := time.Since(start).Seconds()
	e.log.info("backends.py:548", "Dynamo bytecode transform time: %.2f s", took*0.4)
	e.log.info("monitor.py:34", "torch.compile takes %.2f s in total", took)
}

// profileKV sizes the KV cache and fails the way vLLM does when it cannot.
func (e *engine) profileKV() int64 {
	start := time.Now()
	free := e.freeAtInit()
	planned := e.env.Era == eraV1Plain && e.applyStartupPlan(free)
	if !planned {
		runPhase(e.env.KVProfile, 0, e.env.ProgressEvery, func(step int) {
			if step < 0 {
				e.log.info(e.src("gpu_worker.py:263", "worker.py:262"), "Profiling memory usage: %.1f s elapsed", time.Since(start).Seconds())
			}
		})
	}
	avail := e.mm.kvAvailable()
	if !planned && e.env.Era == eraV1Plain && e.env.StartupPlan {
		// vLLM saves it after the graph capture (compile_or_warm_up_model).
		e.savePlan = func() { e.saveStartupPlan(free, avail) }
	}
	if e.args.MaxModelLenAuto {
		e.autoFit(avail)
	}
	if e.env.Era == eraV0 {
		e.log.info("worker.py:232", "Memory profiling takes %.2f seconds\nthe current vLLM instance can use total_gpu_memory (%sGiB) x gpu_memory_utilization (%.2f) = %sGiB\nmodel weights take %sGiB; non_torch_memory takes 0.19GiB; PyTorch activation peak memory takes %sGiB; the rest of the memory reserved for KV Cache is %sGiB.",
			time.Since(start).Seconds(), gibStr(e.mm.Total), e.args.GPUMemUtil, gibStr(e.mm.requested()), gibStr(e.mm.Weights),
			gibStr(int64(e.args.MaxNumSeqs)*e.mm.SeqCost), gibStr(avail))
	} else if !planned {
		e.log.info("gpu_worker.py:276", "Available KV cache memory: %s GiB", gibStr(avail))
	}
	if avail <= 0 {
		e.startupFailure(engineStartupTrace(e.env.Era, framesKVCache, "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."))
	}
	tokens := e.mm.kvTokens()
	if tokens < int64(e.maxLen) {
		var exc string
		if e.env.Era == eraV0 {
			exc = fmt.Sprintf("ValueError: The model's max seq len (%d) is larger than the maximum number of tokens that can be stored in KV cache (%d). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", e.args.MaxModelLen, tokens)
		} else {
			need := int64(e.args.MaxModelLen) * e.mm.BytesPerKV
			exc = fmt.Sprintf("ValueError: To serve at least one request with the models's max seq len (%d), (%s GiB KV cache is needed, which is larger than the available KV cache memory (%s GiB). Based on the available memory, the estimated maximum model length is %d. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
				e.args.MaxModelLen, gibStr(need), gibStr(avail), tokens)
		}
		e.startupFailure(engineStartupTrace(e.env.Era, framesKVCache, exc))
	}
	e.allocStartup(e.mm.budget() - e.mm.External)
	if e.env.Era == eraV0 {
		e.log.info("executor_base.py:110", "# GPU blocks: %d, # CPU blocks: %d", tokens/16, 4*gib/(16*e.mm.BytesPerKV))
		e.log.info("executor_base.py:115", "Maximum concurrency for %d tokens per request: %.2fx", e.maxLen, float64(tokens)/float64(e.maxLen))
	} else {
		e.log.info("kv_cache_utils.py:864", "GPU KV cache size: %s tokens", withThousands(tokens))
		e.log.info("kv_cache_utils.py:868", "Maximum concurrency for %s tokens per request: %.2fx", withThousands(int64(e.maxLen)), float64(tokens)/float64(e.maxLen))
	}
	return tokens
}

func (e *engine) captureGraphs() {
	total, desc := 67, "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
	if e.env.Era == eraV0 {
		total, desc = 35, "Capturing CUDA graph shapes"
	}
	oom := e.faults.has(fOOMOnStart)
	if e.args.EnforceEager && !oom {
		return
	}
	d := e.env.Graphs
	if oom {
		d /= 2
	}
	start := time.Now()
	if e.env.Era == eraV0 {
		e.log.info("model_runner.py:1402", "Capturing cudagraphs for decoding. This may lead to unexpected consequences if the model is not static. To run the model in eager mode, set 'enforce_eager=True' or use '--enforce-eager' in the CLI.")
	}
	n := 0
	e.log.bar(tqdmBar(desc, 0, total, 0), false)
	runPhase(d, 4, e.env.ProgressEvery, func(step int) {
		if step > 0 {
			n = total * step / 4
		}
		e.log.bar(tqdmBar(desc, n, total, time.Since(start)), n == total && !oom)
	})
	if oom {
		e.env.fired()
		e.log.bar(tqdmBar(desc, n, total, time.Since(start)), true)
		exc := fmt.Sprintf("RuntimeError: CUDA out of memory occurred when warming up sampler with %d dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.", e.args.MaxNumSeqs)
		e.startupFailure(engineStartupTrace(e.env.Era, framesSampler, exc))
	}
	if e.env.Era == eraV0 {
		e.log.info("model_runner.py:1530", "Graph capturing finished in %d secs.", int(time.Since(start).Seconds()+0.5))
		return
	}
	e.log.info("gpu_model_runner.py:2708", "Graph capturing finished in %d secs, took 0.49 GiB", int(time.Since(start).Seconds()+0.5))
}

// runPhase spends d doing `steps` evenly spaced steps (f(1..steps)) and,
// between them, calls f(-1) whenever `every` passed without a call, as
// vLLM's tqdm bars and periodic lines do. On a stalled machine the idle
// call still comes before the phase ends. Only the simulator sleeps: a
// phase's length is the thing being simulated.
func runPhase(d time.Duration, steps int, every time.Duration, f func(step int)) {
	start := time.Now()
	last := start
	next := 1
	for {
		now := time.Now()
		if now.Sub(last) >= every {
			f(-1)
			last = time.Now()
			continue
		}
		el := now.Sub(start)
		if next <= steps && el >= d*time.Duration(next)/time.Duration(steps) {
			f(next)
			next++
			last = time.Now()
			continue
		}
		if next > steps && el >= d {
			return
		}
		wake := start.Add(d)
		if next <= steps {
			wake = start.Add(d * time.Duration(next) / time.Duration(steps))
		}
		if idle := last.Add(every); idle.Before(wake) {
			wake = idle
		}
		time.Sleep(time.Until(wake))
	}
}

// readAPI reads the API process's lines on stdin. EOF means the API
// process is gone (or closing): the engine lives on as an orphan for
// FAKEVLLM_ORPHAN_TTL, then exits so that tests never leak it forever.
func (e *engine) readAPI(out chan<- msg) {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		m, err := parseMsg(sc.Text())
		if err != nil {
			continue
		}
		out <- m
	}
	close(out)
	time.AfterFunc(e.env.OrphanTTL, func() { e.exit(0) })
}

// serve tracks the load the API reports and the memory it costs, until
// the memory no longer fits (OOM) or a fault kills the engine.
func (e *engine) serve(fromAPI <-chan msg) {
	tick := time.NewTicker(e.env.Tick)
	defer tick.Stop()
	var readyAt time.Time
	var crash, ncclOOM <-chan time.Time
	running, prompt := 0, 0
	for {
		select {
		case m, ok := <-fromAPI:
			if !ok {
				fromAPI = nil
				continue
			}
			switch m.Kind {
			case "ready":
				readyAt = time.Now()
				if d, ok := e.faults.after(fCrashAfter); ok {
					crash = time.After(d)
				}
				if d, ok := e.faults.after(fNCCLOOMAfter); ok {
					ncclOOM = time.After(d)
				}
			case "shutdown":
				// vLLM 0.32.0's drain: the API server passes the signal on
				// to the EngineCore, which logs it and keeps stepping.
				e.log.info("core.py:1454", "[shutdown] EngineCore: trigger received signal=%s", m.Fields["signal"])
				e.drainShutdown.Store(true)
			case "sleep":
				e.sleepNow(m)
			case "wake":
				e.wakeNow(m)
			case "load":
				r, err1 := m.int("running")
				p, err2 := m.int("prompt_tokens")
				if err1 == nil && err2 == nil {
					running, prompt = int(r), int(p)
				}
			}
		case <-tick.C:
		case <-ncclOOM:
			e.env.fired()
			e.ncclWarn()
			e.log.stderrLines(engineRuntimeTrace(e.env.Era, ncclOOMException)...)
			e.send(formatMsg("dead", "reason", "oom"))
			e.exit(1)
		case <-crash:
			e.env.fired()
			e.log.error(e.src("multiproc_executor.py:153", "multiproc_worker_utils.py:123"), "Worker proc VllmWorker-0 died unexpectedly, shutting down executor.")
			e.log.stderrLines(engineRuntimeTrace(e.env.Era, "RuntimeError: Worker failed with error 'Worker proc VllmWorker-0 died unexpectedly', please check the stack trace above for the root cause")...)
			e.send(formatMsg("dead", "reason", "crash"))
			e.exit(1)
		}
		var since time.Duration
		if !readyAt.IsZero() {
			since = time.Since(readyAt)
		}
		e.step(running, prompt, since)
	}
}

// step recomputes the engine's memory, publishes it, and dies of OOM when
// the device would exceed its total.
func (e *engine) step(running, prompt int, since time.Duration) {
	if e.sleep.level > 0 {
		return // asleep: the pool's memory is given back, nothing runs
	}
	e.watchDaemon()
	want := e.mm.serving(running, prompt, since)
	e.usedMu.Lock()
	cur := e.used
	e.usedMu.Unlock()
	for _, r := range e.ranks {
		if o := e.othersUsedOn(r); r.gpu.dev.Reserved+o+want > r.gpu.dev.Total {
			e.oom(want, cur, o)
		}
	}
	others := e.othersUsed()
	e.setUsed(want)
	device := e.mm.Reserved + others + want
	safe := e.mm.safeMaxNumSeqs(others, prompt, since)
	line := formatMsg("mem", "device_used", device, "engine_used", want, "safe_seqs", safe)
	if line != e.lastMem {
		e.lastMem = line
		e.send(line)
	}
}

func (e *engine) oom(want, cur, others int64) {
	tried := want - cur
	if tried <= 0 {
		tried = e.mm.SeqCost
	}
	free := max(0, e.mm.Total-e.mm.Reserved-others-cur)
	exc := fmt.Sprintf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU 0 has a total capacity of %s of which %s is free. Including non-PyTorch memory, this process has %s memory in use. Of the allocated memory %s is allocated by PyTorch, and %s is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
		torchSize(tried), torchSize(e.mm.Total), torchSize(free), torchSize(cur), torchSize(cur*97/100), torchSize(cur*2/100))
	e.log.stderrLines(engineRuntimeTrace(e.env.Era, exc)...)
	e.send(formatMsg("dead", "reason", "oom"))
	e.exit(1)
}

// allocStartup takes memory during loading; when it does not fit, torch
// fails the allocation and the engine fails to start.
func (e *engine) allocStartup(want int64) {
	for _, r := range e.ranks {
		e.allocStartupOn(r, want)
	}
	e.setUsed(want)
}

func (e *engine) allocStartupOn(r rank, want int64) {
	others := e.othersUsedOn(r)
	if r.gpu.dev.Reserved+others+want > r.gpu.dev.Total {
		cur := e.used
		free := max(0, e.mm.Total-e.mm.Reserved-others-cur)
		exc := fmt.Sprintf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU 0 has a total capacity of %s of which %s is free. Including non-PyTorch memory, this process has %s memory in use.",
			torchSize(want-cur), torchSize(e.mm.Total), torchSize(free), torchSize(cur))
		e.startupFailure(engineStartupTrace(e.env.Era, framesKVCache, exc))
	}
}

func (e *engine) setUsed(b int64) {
	e.usedMu.Lock()
	defer e.usedMu.Unlock()
	if b == e.used {
		return
	}
	e.used = b
	for _, r := range e.ranks {
		if err := r.publish(b); err != nil {
			e.log.warn("gpu_worker.py:1", "fakevllm: cannot publish GPU usage in %s: %v", r.gpu.dir, err)
		}
	}
}

// startupFailure prints vLLM's "EngineCore failed to start." with the root
// cause traceback and exits 1; the API process prints its wrapper.
func (e *engine) startupFailure(trace []string) {
	if e.env.Era == eraV0 {
		e.log.stderrLines(trace...)
	} else {
		e.log.error("core.py:718", "EngineCore failed to start.")
		e.log.stderrLines(trace...)
	}
	e.send(formatMsg("dead", "reason", "startup"))
	e.exit(1)
}

func (e *engine) send(line string) {
	e.toAPIMu.Lock()
	defer e.toAPIMu.Unlock()
	// A write to a vanished API process fails with EPIPE: it is an orphan now.
	e.toAPI.WriteString(line)
}

// exit frees the engine's memory (its procs file goes) and exits. Only the
// first caller proceeds; the others block until the process is gone.
func (e *engine) exit(code int) {
	e.exitMu.Lock()
	e.exiting.Store(true)
	e.stopWorkers()
	if e.gpu != nil {
		e.gpu.clearUsage(e.pid)
	}
	os.Exit(code)
}

// download is the silent first download of the weights from the hub:
// vLLM disables its progress bars, so nothing is printed while the
// process writes to the cache folder at FAKEVLLM_DOWNLOAD_MIBPS for
// FAKEVLLM_DOWNLOAD. The file wraps at 256 MiB (truncated, so that every
// write dirties new pages and /proc/PID/io write_bytes keeps growing).
func (e *engine) download() {
	dir := filepath.Join(e.env.DownloadDir, "models--"+strings.ReplaceAll(e.args.Model, "/", "--"), "blobs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.startupFailure(engineStartupTrace(e.env.Era, framesLoadModel, fmt.Sprintf("OSError: [Errno 13] cannot create %s: %v", dir, err)))
	}
	f, err := os.Create(filepath.Join(dir, "model-00001-of-00004.safetensors.incomplete"))
	if err != nil {
		e.startupFailure(engineStartupTrace(e.env.Era, framesLoadModel, fmt.Sprintf("OSError: %v", err)))
	}
	defer f.Close()
	chunk := make([]byte, 256*kib)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	start := time.Now()
	var written, inFile int64
	for time.Since(start) < e.env.DownloadFor {
		due := int64(float64(e.env.DownloadRate) * time.Since(start).Seconds())
		for written < due {
			if inFile >= 256*mib {
				f.Truncate(0)
				f.Seek(0, 0)
				inFile = 0
			}
			n, err := f.Write(chunk)
			if err != nil {
				break
			}
			written += int64(n)
			inFile += int64(n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ncclOOMException is torch's NCCL error when a CUDA allocation inside
// NCCL fails ("Cuda failure 2 'out of memory'": cudaErrorMemoryAllocation).
const ncclOOMException = "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 2 'out of memory'"

// ncclWarn is NCCL's own warning line: written by C code straight to
// stdout, so without vLLM's process prefix.
func (e *engine) ncclWarn() {
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	line := fmt.Sprintf("%s:%d:%d [0] include/alloc.h:103 NCCL WARN Cuda failure 2 'out of memory'\n", host, e.pid, e.pid+7)
	os.Stdout.WriteString(line)
}

// autoFit is --max-model-len auto: the longest context the KV cache
// holds, up to the model's own; none at all is vLLM's auto-fit error.
func (e *engine) autoFit(avail int64) {
	tokens := int64(0)
	if avail > 0 {
		tokens = avail / e.mm.BytesPerKV
	}
	derived := int64(e.args.MaxModelLen)
	switch {
	case tokens <= 0:
		e.startupFailure(engineStartupTrace(e.env.Era, framesKVCache, "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. Try increasing `gpu_memory_utilization`."))
	case tokens >= derived:
		e.log.info("kv_cache_utils.py:1187", "Auto-fit max_model_len: full model context length %d fits in available GPU memory", derived)
	default:
		e.maxLen = int(tokens)
		e.log.info("kv_cache_utils.py:1196", "Auto-fit max_model_len: reduced from %d to %d to fit in available GPU memory (%s GiB available for KV cache)", derived, tokens, gibStr(avail))
	}
}

// runGrandchild is the grandchild fault: a descendant that left the
// process group (setsid) and holds 1 GiB until FAKEVLLM_ORPHAN_TTL.
func runGrandchild(argv []string) int {
	env, err := loadEnv(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	gpu, err := openGPU(env)
	if err != nil {
		return 1
	}
	pid := os.Getpid()
	if err := gpu.setUsage(pid, gib); err != nil {
		fmt.Fprintf(os.Stderr, "fakevllm grandchild: publish usage: %v\n", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case <-time.After(env.OrphanTTL):
	}
	gpu.clearUsage(pid)
	return 0
}
