package vllmlog

import "strings"

// Load phases, as status shows them.
const (
	PhaseWeights = "weights"
	PhaseCompile = "compile"
	PhaseKVCache = "kv_cache"
	PhaseGraphs  = "graphs"
	PhaseServer  = "server"
)

// phaseMarks are the lines that mark each load phase, latest phase first,
// so a line that names two (rare) counts for the later one.
var phaseMarks = []struct {
	phase string
	marks []string
}{
	{PhaseServer, []string{"Starting vLLM API server", "Starting vLLM server", "Available routes are", "Started server process", "Waiting for application startup", "Application startup complete"}},
	{PhaseGraphs, []string{"Capturing CUDA graphs", "Capturing cudagraphs", "Graph capturing finished", "init engine (profile"}},
	{PhaseKVCache, []string{"Available KV cache memory", "GPU KV cache size", "# GPU blocks", "Maximum concurrency for", "memory profiling"}},
	// Not "torch.compile" alone: vLLM 0.32.0 says "Enforce eager set,
	// disabling torch.compile, CUDAGraphs ..." before it loads anything.
	{PhaseCompile, []string{"Dynamo bytecode transform", "torch.compile takes", "Compiling a graph", "Warming up model for the compilation"}},
	{PhaseWeights, []string{"Starting to load model", "Loading safetensors checkpoint shards", "Loading weights took", "Model loading took", "Loading model weights took", "Loading pt checkpoint shards"}},
}

// LoadPhase returns the load phase a line of output marks ("" for none).
// vLLM goes through weights, compile, kv_cache, graphs and server, in order.
func LoadPhase(line string) string {
	for _, p := range phaseMarks {
		for _, m := range p.marks {
			if strings.Contains(line, m) {
				return p.phase
			}
		}
	}
	return ""
}

// StartupComplete is uvicorn's line after which the port listens.
const StartupComplete = "Application startup complete"

// IsStartupComplete reports whether a line is uvicorn's "Application
// startup complete.": the port listens right after it.
func IsStartupComplete(line string) bool { return strings.Contains(line, StartupComplete) }
