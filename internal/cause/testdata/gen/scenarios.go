// The scenarios: each a vLLM run of one era ending one way (healthy, each
// cause), written with the log writer in main.go.

package main

import (
	"fmt"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

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
	{
		// The same illegal memory access with the kernel's Xid line pasted
		// beside it: the GPU's (gpu_fault), not a software crash.
		l := newLog(v0, plain, "2024-12-02 03:11:00", 61)
		l.noiseBefore()
		healthyStart(l, r0, 0, 23648)
		l.serve(40)
		l.raw("", "[Mon Dec  2 03:40:12 2024] NVRM: Xid (PCI:0000:3b:00): 31, pid=41822, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1a_c0000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ")
		l.err("", "async_llm_engine.py", 63, "Engine background task failed")
		l.raw("", traceback([][]string{
			frame("vllm/worker/model_runner.py", 1703, "execute_model", "hidden_or_intermediate_states = model_executable("),
			frame("vllm/attention/backends/flash_attn.py", 719, "forward", "flash_attn_varlen_func("),
		}, "RuntimeError: CUDA error: an illegal memory access was encountered", "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.", "For debugging consider passing CUDA_LAUNCH_BLOCKING=1", "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")...)
		l.err("", "client.py", 250, "RuntimeError('Engine loop has died')")
		l.shutdownTail()
		l.noiseAfter()
		out["v0-2024-illegal-memory-xid31.log"] = l.String()
	}
	{
		// An uncorrectable ECC error while serving (V1): gpu_fault.
		l := newLog(v1ansi, plain, "2025-08-14 02:00:00", 62)
		l.noiseBefore()
		healthyStart(l, qwen, 16.23, 425424)
		l.serve(60)
		l.raw(l.core, traceback([][]string{
			frame("vllm/v1/engine/core.py", 701, "run_engine_core", "engine_core.run_busy_loop()"),
			frame("vllm/v1/worker/gpu_model_runner.py", 1523, "execute_model", "model_output = self.model("),
		}, "RuntimeError: CUDA error: uncorrectable ECC error encountered", "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.", "For debugging consider passing CUDA_LAUNCH_BLOCKING=1", "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")...)
		l.engineRuntimeDeath([]string{"vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."})
		l.noiseAfter()
		out["v1-2025-ecc-uncorrectable.log"] = l.String()
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
