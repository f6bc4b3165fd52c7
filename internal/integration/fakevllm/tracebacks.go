package main

import "github.com/vllm-guard/vllm-guard/internal/vllmlog"

// Python tracebacks as vLLM prints them. They are what the guard's
// classifier reads, so the last line (the exception) must be verbatim.

const pyLib = "/usr/local/lib/python3.12/dist-packages"

type frame struct {
	file     string
	line     int
	fn, code string
}

func vf(rel string, line int, fn, code string) frame {
	return frame{file: pyLib + "/" + rel, line: line, fn: fn, code: code}
}

func traceback(header string, frames []frame, exc string) []string {
	var out []string
	if header != "" {
		out = append(out, header)
	}
	out = append(out, vllmlog.TracebackHeader)
	for _, f := range frames {
		out = append(out, vllmlog.FormatFrame(f.file, f.line, f.fn, f.code)...)
	}
	return append(out, exc)
}

var engineProcFrames = []frame{
	{file: "/usr/lib/python3.12/multiprocessing/process.py", line: 314, fn: "_bootstrap", code: "self.run()"},
	{file: "/usr/lib/python3.12/multiprocessing/process.py", line: 108, fn: "run", code: "self._target(*self._args, **self._kwargs)"},
}

// engineStartupTrace is an EngineCore dying while it starts.
func engineStartupTrace(e era, tail []frame, exc string) []string {
	frames := append([]frame{}, engineProcFrames...)
	header := "Process EngineCore_0:"
	if e == eraV0 {
		header = "Process SpawnProcess-1:"
		frames = append(frames,
			vf("vllm/engine/multiprocessing/engine.py", 390, "run_mp_engine", "raise e"),
			vf("vllm/engine/multiprocessing/engine.py", 379, "run_mp_engine", "engine = MQLLMEngine.from_engine_args(engine_args=engine_args,"))
	} else {
		frames = append(frames,
			vf("vllm/v1/engine/core.py", 722, "run_engine_core", "raise e"),
			vf("vllm/v1/engine/core.py", 709, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
			vf("vllm/v1/engine/core.py", 505, "__init__", "super().__init__(vllm_config, executor_class, log_stats,"))
	}
	return traceback(header, append(frames, tail...), exc)
}

var framesInitDevice = []frame{
	vf("vllm/v1/engine/core.py", 82, "__init__", "self.model_executor = executor_class(vllm_config)"),
	vf("vllm/executor/executor_base.py", 54, "__init__", "self._init_executor()"),
	vf("vllm/executor/uniproc_executor.py", 48, "_init_executor", `self.collective_rpc("init_device")`),
	vf("vllm/v1/worker/gpu_worker.py", 186, "init_device", "raise ValueError("),
}

var framesLoadModel = []frame{
	vf("vllm/v1/engine/core.py", 82, "__init__", "self.model_executor = executor_class(vllm_config)"),
	vf("vllm/executor/uniproc_executor.py", 49, "_init_executor", `self.collective_rpc("load_model")`),
	vf("vllm/v1/worker/gpu_model_runner.py", 2003, "load_model", "self.model = model_loader.load_model("),
	vf("vllm/distributed/device_communicators/pynccl.py", 99, "__init__", "self.comm: ncclComm_t = self.nccl.ncclCommInitRank("),
	vf("vllm/distributed/device_communicators/pynccl_wrapper.py", 277, "NCCL_CHECK", "raise RuntimeError(f\"NCCL error: {error_str}\")"),
}

var framesNCCLInit = []frame{
	vf("vllm/v1/engine/core.py", 82, "__init__", "self.model_executor = executor_class(vllm_config)"),
	vf("vllm/v1/worker/gpu_worker.py", 201, "init_device", "init_worker_distributed_environment(self.vllm_config, self.rank,"),
	vf("vllm/distributed/parallel_state.py", 1082, "init_distributed_environment", "torch.distributed.all_reduce(dummy, group=_WORLD.device_group)"),
	vf("torch/distributed/distributed_c10d.py", 2806, "all_reduce", "work = group.allreduce([tensor], opts)"),
}

var framesKVCache = []frame{
	vf("vllm/v1/engine/core.py", 91, "__init__", "self._initialize_kv_caches(vllm_config)"),
	vf("vllm/v1/engine/core.py", 190, "_initialize_kv_caches", "get_kv_cache_config(vllm_config, kv_cache_spec_one_worker,"),
	vf("vllm/v1/core/kv_cache_utils.py", 1035, "get_kv_cache_config", "check_enough_kv_cache_memory(vllm_config, kv_cache_spec, available_memory)"),
	vf("vllm/v1/core/kv_cache_utils.py", 613, "check_enough_kv_cache_memory", "raise ValueError("),
}

var framesSampler = []frame{
	vf("vllm/v1/engine/core.py", 91, "__init__", "self._initialize_kv_caches(vllm_config)"),
	vf("vllm/v1/engine/core.py", 205, "_initialize_kv_caches", "self.model_executor.initialize_from_config(kv_cache_configs)"),
	vf("vllm/v1/worker/gpu_worker.py", 317, "compile_or_warm_up_model", "self.model_runner._dummy_sampler_run("),
	vf("vllm/v1/worker/gpu_model_runner.py", 2540, "_dummy_sampler_run", "raise RuntimeError("),
}

// engineRuntimeTrace is the busy loop dying while serving.
func engineRuntimeTrace(e era, exc string) []string {
	if e == eraV0 {
		return traceback("", []frame{
			vf("vllm/engine/multiprocessing/engine.py", 245, "run_engine_loop", "request_outputs = self.engine_step()"),
			vf("vllm/engine/llm_engine.py", 1386, "step", "outputs = self.model_executor.execute_model("),
			vf("vllm/worker/model_runner.py", 1654, "execute_model", "hidden_or_intermediate_states = model_executable("),
			vf("torch/nn/modules/module.py", 1736, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
		}, exc)
	}
	return traceback("", []frame{
		vf("vllm/v1/engine/core.py", 701, "run_engine_core", "engine_core.run_busy_loop()"),
		vf("vllm/v1/engine/core.py", 728, "run_busy_loop", "self._process_engine_step()"),
		vf("vllm/v1/engine/core.py", 754, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
		vf("vllm/v1/worker/gpu_model_runner.py", 1600, "execute_model", "model_output = self.model("),
		vf("torch/nn/modules/module.py", 1773, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
	}, exc)
}

// apiInitFailedTrace is the API server giving up when the engine failed to start.
func apiInitFailedTrace(e era) []string {
	head := []frame{
		{file: "/usr/local/bin/vllm", line: 10, fn: "<module>", code: "sys.exit(main())"},
		vf("vllm/entrypoints/cli/main.py", 54, "main", "args.dispatch_function(args)"),
		vf("vllm/entrypoints/cli/serve.py", 57, "cmd", "uvloop.run(run_server(args))"),
	}
	if e == eraV0 {
		return traceback("", append(head,
			vf("vllm/entrypoints/openai/api_server.py", 230, "build_async_engine_client_from_engine_args", "raise RuntimeError("),
		), "RuntimeError: Engine process failed to start. See stack trace for the root cause.")
	}
	return traceback("", append(head,
		vf("vllm/v1/engine/core_client.py", 447, "__init__", "with launch_core_engines(vllm_config, executor_class,"),
		vf("vllm/v1/engine/utils.py", 810, "wait_for_engine_startup", `raise RuntimeError("Engine core initialization failed. "`),
	), "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
}

// apiEngineDeadTrace is the output handler noticing the dead engine.
func apiEngineDeadTrace() []string {
	return traceback("", []frame{
		vf("vllm/v1/engine/async_llm.py", 439, "output_handler", "outputs = await engine_core.get_output_async()"),
		vf("vllm/v1/engine/core_client.py", 846, "get_output_async", "raise self._format_exception(outputs) from None"),
	}, "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.")
}

// apiStartupTrace is an exception in the API process before any engine.
func apiStartupTrace(tail []frame, exc string) []string {
	return traceback("", append([]frame{
		{file: "/usr/local/bin/vllm", line: 10, fn: "<module>", code: "sys.exit(main())"},
		vf("vllm/entrypoints/cli/main.py", 54, "main", "args.dispatch_function(args)"),
		vf("vllm/entrypoints/cli/serve.py", 57, "cmd", "uvloop.run(run_server(args))"),
	}, tail...), exc)
}

var framesConfig = []frame{
	vf("vllm/entrypoints/openai/api_server.py", 1846, "run_server", "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
	vf("vllm/engine/arg_utils.py", 1039, "create_engine_config", "model_config = self.create_model_config()"),
	vf("vllm/config/__init__.py", 3597, "__post_init__", "raise ValueError("),
}

var framesSchedulerConfig = []frame{
	vf("vllm/entrypoints/launchers/api_server/entry.py", 83, "build_async_engine_client_from_engine_args", "vllm_config = engine_args.create_engine_config(usage_context=usage_context)"),
	vf("vllm/engine/arg_utils.py", 2617, "create_engine_config", "scheduler_config = SchedulerConfig("),
	{file: pyLib + "/pydantic/_internal/_dataclasses.py", line: 121, fn: "__init__", code: "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)"},
}

var framesModelMissing = []frame{
	vf("vllm/engine/arg_utils.py", 1039, "create_engine_config", "model_config = self.create_model_config()"),
	vf("vllm/transformers_utils/config.py", 369, "get_config", "config_dict, _ = PretrainedConfig.get_config_dict("),
	vf("transformers/utils/hub.py", 470, "cached_files", "raise OSError("),
}

var framesBind = []frame{
	vf("vllm/entrypoints/openai/api_server.py", 1837, "run_server", "sock = setup_server(args)"),
	vf("vllm/entrypoints/openai/api_server.py", 1805, "setup_server", "sock = create_server_socket(sock_addr)"),
	vf("vllm/entrypoints/openai/api_server.py", 1751, "create_server_socket", "sock.bind(addr)"),
}
