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

// ServerFinished reads uvicorn's last line of a server process, "INFO:
// Finished server process [PID]", printed as vLLM's API server exits (after
// its engine died, or a stop): the whole line, as uvicorn writes it, so
// that no text inside another line reads as one. pid is the process's.
func ServerFinished(line string) (pid int, ok bool) {
	rest, ok := strings.CutPrefix(strings.TrimRight(line, " \r\n"), "INFO:")
	if !ok {
		return 0, false
	}
	rest, ok = strings.CutPrefix(strings.TrimLeft(rest, " "), "Finished server process [")
	if !ok {
		return 0, false
	}
	num, ok := strings.CutSuffix(rest, "]")
	if !ok || num == "" || len(num) > 9 {
		return 0, false
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		pid = pid*10 + int(c-'0')
	}
	return pid, true
}
