package supervisor

import (
	"strings"

	"go.uber.org/zap/zapcore"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// levels gives each of vLLM's lines the level the guard re-emits it at,
// so that `journalctl -p err` (and any log search by level) finds vLLM's
// errors: the level of vLLM's own prefix, wherever its process prefix and
// an operator's wrapper put it ("(APIServer pid=7) ERROR 12-02 …"), and
// error for every line of a Python traceback, from "Traceback (most recent
// call last):" to the exception line that ends it, each process's
// traceback followed on its own (tensor-parallel workers interleave).
type levels struct {
	open map[string]bool // stream and process → inside a traceback
}

// maxTracebacks bounds the processes followed at once; a vLLM with more
// interleaving tracebacks than this has its oldest forgotten.
const maxTracebacks = 64

func (l *levels) of(stream, line string) zapcore.Level {
	rest, _ := vllmlog.CutWrapper(line)
	rest, proc, _ := vllmlog.CutProcess(rest)
	rest, level, hasLevel := vllmlog.CutLevel(rest)
	if !hasLevel && proc == "" {
		// Before 2025 the level came first and the process after it.
		rest, proc, _ = vllmlog.CutProcess(rest)
	}
	key := stream + "\x00" + proc
	switch {
	case vllmlog.IsTracebackHeader(rest):
		if l.open == nil || len(l.open) >= maxTracebacks {
			l.open = map[string]bool{}
		}
		l.open[key] = true
		return zapcore.ErrorLevel
	case strings.HasPrefix(rest, "During handling of the above exception") || strings.HasPrefix(rest, "The above exception was the direct cause"):
		return zapcore.ErrorLevel // between two tracebacks of one chain
	case l.open[key] && hasLevel:
		// A logged line ends a traceback that never printed its exception.
		delete(l.open, key)
	case l.open[key]:
		if _, ok := vllmlog.ExceptionType(rest); ok && !vllmlog.IsTracebackBody(rest) {
			delete(l.open, key)
		}
		return zapcore.ErrorLevel
	}
	switch level {
	case "ERROR", "CRITICAL":
		return zapcore.ErrorLevel
	case "WARNING":
		return zapcore.WarnLevel
	}
	return zapcore.InfoLevel
}
