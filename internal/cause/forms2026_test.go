package cause

import (
	"bytes"
	"strings"
	"testing"
)

// Issue 41 item 7: vLLM as it logs in 2026. The lines are written here
// from vLLM 0.32.0's source (the messages it raises and logs, its
// formatter's prefixes), in the shapes users' reports show (issues named
// at the rules).
func TestForms2026(t *testing.T) {
	const (
		nested = "(APIServer pid=716) (EngineCore_DP0 pid=1101) ERROR 01-29 10:27:47 [core.py:710] "
		worker = "(Worker_DP0_TP4_EP4 pid=512) ERROR 01-29 10:27:40 [multiproc_executor.py:1063] "
		core   = "(EngineCore pid=298) ERROR 01-29 10:27:41 [core.py:1512] "
		api    = "(APIServer pid=716) ERROR 01-29 10:27:48 [async_llm.py:906] "
	)
	rec := func(prefix string, ls ...string) []string {
		out := make([]string, len(ls))
		for i, l := range ls {
			out[i] = prefix + l
		}
		return out
	}
	engineDead := rec(api, "AsyncLLM output_handler failed.", "Traceback (most recent call last):",
		`  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/async_llm.py", line 880, in output_handler`,
		"    outputs = await engine_core.get_output_async()",
		"vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.")
	shmTimeout := rec(nested, "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
		`  File "/usr/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py", line 440, in get_response`,
		"    status, result = mq.dequeue(timeout=dequeue_timeout)",
		"                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
		`  File "/usr/lib/python3.12/site-packages/vllm/distributed/device_communicators/shm_broadcast.py", line 746, in acquire_read`,
		"    raise TimeoutError",
		"TimeoutError")
	rpc := rec(nested, "",
		"The above exception was the direct cause of the following exception:",
		"",
		"Traceback (most recent call last):",
		`  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 1045, in run_busy_loop`,
		"    self._process_engine_step()",
		`  File "/usr/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py", line 442, in get_response`,
		`    raise TimeoutError(f"RPC call to {method} timed out.") from e`,
		"TimeoutError: RPC call to execute_model timed out.")
	workerOOM := append(rec(worker, "WorkerProc hit an exception.", "Traceback (most recent call last):",
		`  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 3000, in execute_model`,
		"    hidden = self.model(x)",
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 4 has a total capacity of 79.19 GiB of which 1.06 GiB is free."),
		rec(core, "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
			`  File "/usr/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py", line 445, in get_response`,
			"    raise RuntimeError(",
			"RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 2.00 GiB. GPU 4 has a total capacity of 79.19 GiB of which 1.06 GiB is free.', please check the stack trace above for the root cause")...)
	for _, tc := range []struct {
		name  string
		lines []string
		want  Cause
	}{
		{"shared-memory broadcast TimeoutError then the RPC timeout (nested prefixes)", append(append(shmTimeout, rpc...), engineDead...), CauseHang},
		{"the shared-memory queue's bare TimeoutError alone", append(append([]string{}, shmTimeout...), engineDead...), CauseHang},
		{"the shared-memory queue's TimeoutError from its read deadline (timeout_ms, eugr/spark-vllm-docker#348)", append(rec(core, "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
			`  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py", line 647, in timeout_ms`,
			"    raise TimeoutError",
			"TimeoutError"), engineDead...), CauseHang},
		{"a TimeoutError raised outside the shared-memory queue stays a crash", append(rec(core, "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
			`  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/foo.py", line 12, in timeout_ms`,
			"    raise TimeoutError",
			"TimeoutError"), engineDead...), CauseCrash},
		{"a worker's OOM re-raised by the executor", append(workerOOM, engineDead...), CauseOOM},
		{"the executor's re-raise alone", append(workerOOM[5:], engineDead...), CauseOOM},
		{"torch.AcceleratorError under (EngineCore pid=N)", append(rec(core, "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
			`  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 3000, in execute_model`, "    x()",
			"torch.AcceleratorError: CUDA error: an illegal memory access was encountered"), engineDead...), CauseCrash},
		{"free memory below the engine's budget (0.32.0's wording)", rec("(EngineCore_DP0 pid=301) ERROR 01-29 10:00:00 [core.py:1510] ", "EngineCore failed to start.",
			"Traceback (most recent call last):", `  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/utils.py", line 745, in request_memory`, "    raise ValueError(",
			"ValueError: Free memory on device cuda:0 (10.2/79.1 GiB) on startup is less than the engine's budget after excluding external process's weights (0.9, 71.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."), CauseGPUBusy},
		{"a worker proc died unexpectedly", []string{"(EngineCore pid=298) ERROR 01-29 10:27:41 [multiproc_executor.py:316] Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor."}, CauseCrash},
		{"ROCm's bare memory access fault", []string{"(EngineCore pid=298) INFO 01-29 10:27:30 [core.py:100] serving",
			"Memory access fault by GPU node-2 (Agent handle: 0x55d0c2a1e0f0) on address 0x7f3a00000000. Reason: Page not present or supervisor privilege."}, CauseCrash},
		{"Ray's repeated lines", []string{
			"(RayWorkerWrapper pid=4312, ip=10.0.0.2) ERROR 01-29 10:27:40 [worker_base.py:620] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. [repeated 2x across cluster]"}, CauseOOM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Classify(Exit{ExitCode: 1, Phase: PhaseReady, Lines: lines(tc.lines...)})
			if v.Cause != tc.want {
				t.Errorf("live: %s, want %s (%s)", v.Cause, tc.want, v.Summary)
			}
			if tc.want != CauseCrash && len(v.Evidence) == 0 {
				t.Errorf("live: %s without evidence", v.Cause)
			}
			rep, err := Diagnose(bytes.NewReader([]byte(strings.Join(tc.lines, "\n") + "\n")))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Cause != tc.want {
				t.Errorf("diagnose: %s, want %s (%s)", rep.Cause, tc.want, rep.Summary)
			}
		})
	}
}
