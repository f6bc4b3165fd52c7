package vllmlog

import "testing"

func TestLoadPhase(t *testing.T) {
	for text, want := range map[string]string{
		"(EngineCore_0 pid=1) INFO 10-14 12:00:00 [gpu_model_runner.py:1] Starting to load model Qwen/Qwen2.5-7B...":                              PhaseWeights,
		"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]":                                                    PhaseWeights,
		"INFO 10-14 12:00:00 model_runner.py:1067] Loading model weights took 14.9888 GB":                                                         PhaseWeights,
		"INFO 10-14 12:00:00 [backends.py:1] Dynamo bytecode transform time: 5.55 s":                                                              PhaseCompile,
		"INFO 10-14 12:00:00 [monitor.py:34] torch.compile takes 7.14 s in total":                                                                 PhaseCompile,
		"(EngineCore pid=1) WARNING 12-03 06:43:10 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup.": "",
		"(Worker pid=2) INFO 12-03 06:11:45 [cpu_model_runner.py:87] Warming up model for the compilation...":                                     PhaseCompile,
		"INFO 10-14 12:00:00 [gpu_worker.py:1] Available KV cache memory: 16.23 GiB":                                                              PhaseKVCache,
		"INFO 10-14 12:00:00 distributed_gpu_executor.py:57] # GPU blocks: 1478, # CPU blocks: 2048":                                              PhaseKVCache,
		"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%":                                                                           PhaseGraphs,
		"INFO 10-14 12:00:00 [core.py:1] init engine (profile, create kv cache, warmup model) took 25.99 seconds":                                 PhaseGraphs,
		"(APIServer pid=1) INFO 10-14 12:00:00 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000":                               PhaseServer,
		"(APIServer pid=1) INFO 10-14 12:00:00 [api_server.py:1] Starting vLLM server on http://0.0.0.0:8000":                                     PhaseServer,
		"INFO:     Application startup complete.":                                                                                                 PhaseServer,
		"INFO 10-14 12:00:00 [metrics.py:1] Avg prompt throughput: 0.0 tokens/s":                                                                  "",
	} {
		if got := LoadPhase(text); got != want {
			t.Errorf("%q: phase %q, want %q", text, got, want)
		}
	}
	if !IsStartupComplete("(APIServer pid=1) INFO:     Application startup complete.") || IsStartupComplete("INFO:     Waiting for application startup.") {
		t.Error("IsStartupComplete")
	}
}

func TestServerFinished(t *testing.T) {
	for _, c := range []struct {
		line string
		pid  int
		ok   bool
	}{
		{"INFO:     Finished server process [599]", 599, true},
		{"INFO:     Finished server process [599]\r", 599, true},
		{"INFO:     Shutting down", 0, false},
		{"INFO:     Finished server process []", 0, false},
		{"INFO:     Finished server process [59x]", 0, false},
		{"(APIServer pid=599) INFO 12-04 04:35:26 [logger.py:1] Received request: prompt: 'INFO:     Finished server process [599]'", 0, false},
		{"prompt INFO:     Finished server process [599]", 0, false},
	} {
		pid, ok := ServerFinished(c.line)
		if pid != c.pid || ok != c.ok {
			t.Errorf("%q: %d %v, want %d %v", c.line, pid, ok, c.pid, c.ok)
		}
	}
}
