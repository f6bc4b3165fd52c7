package supervisor

import (
	"testing"

	"go.uber.org/zap/zapcore"
)

// Every line of a traceback is an error, each process's on its own, and
// the level of vLLM's prefix counts wherever the process prefix puts it.
func TestVLLMLineLevels(t *testing.T) {
	const (
		I = zapcore.InfoLevel
		W = zapcore.WarnLevel
		E = zapcore.ErrorLevel
	)
	lines := []struct {
		stream, text string
		want         zapcore.Level
	}{
		{"stdout", "INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.11.0", I},
		{"stdout", "(APIServer pid=7) WARNING 12-02 10:00:01 [config.py:2] max_num_seqs is large", W},
		{"stderr", "(APIServer pid=7) ERROR 12-02 10:00:02 [core.py:3] EngineCore failed to start.", E},
		{"stderr", "CRITICAL 12-02 10:00:02 [launcher.py:99] Engine failed, terminating server", E},
		{"stderr", "ERROR 12-02 10:00:02 worker.py:12] (VllmWorkerProcess pid=9) dead", E}, // 2024: level first
		// Two workers' tracebacks interleave; an INFO line of a third
		// process between them is still info.
		{"stderr", "(VllmWorker rank=0 pid=11) Traceback (most recent call last):", E},
		{"stderr", "(VllmWorker rank=1 pid=12) Traceback (most recent call last):", E},
		{"stderr", `(VllmWorker rank=0 pid=11)   File "/usr/lib/python3/vllm/worker.py", line 12, in execute`, E},
		{"stdout", "(APIServer pid=7) INFO 12-02 10:00:03 [loggers.py:1] Avg prompt throughput: 0.0 tokens/s", I},
		{"stderr", "(VllmWorker rank=0 pid=11)     raise torch.OutOfMemoryError(msg)", E},
		{"stderr", "(VllmWorker rank=0 pid=11) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", E},
		{"stderr", "(VllmWorker rank=0 pid=11) plain text after the exception", I},
		{"stderr", `(VllmWorker rank=1 pid=12)   File "x.py", line 3`, E},
		{"stderr", "(VllmWorker rank=1 pid=12) RuntimeError: NCCL error", E},
		// A chained exception: both tracebacks and the line between.
		{"stderr", "Traceback (most recent call last):", E},
		{"stderr", "ValueError: bad", E},
		{"stderr", "During handling of the above exception, another exception occurred:", E},
		{"stderr", "Traceback (most recent call last):", E},
		// A logged line ends a traceback that printed no exception line.
		{"stderr", "INFO 12-02 10:00:04 [launcher.py:2] Shutting down", I},
		{"stderr", "a plain line after it", I},
		{"stderr", "Dec 02 10:00:05 gpu-3 vllm[7]: (APIServer pid=7) ERROR 12-02 10:00:05 [x.py:1] wrapped by journalctl", E},
		{"stdout", "some library's own print", I},
	}
	var l levels
	for i, c := range lines {
		if got := l.of(c.stream, c.text); got != c.want {
			t.Errorf("line %d %q: level %v, want %v", i, c.text, got, c.want)
		}
	}
}
