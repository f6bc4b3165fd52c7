package vllmlog

import (
	"strconv"
	"strings"
)

// Python tracebacks go to stderr; in V1 every one of their lines carries the
// process prefix. These functions take a message (see Message).

// TracebackHeader opens a traceback.
const TracebackHeader = "Traceback (most recent call last):"

// IsTracebackHeader reports whether msg opens a traceback.
func IsTracebackHeader(msg string) bool {
	return strings.HasPrefix(msg, "Traceback (most recent call last)")
}

// IsTracebackBody reports whether msg is a frame line or the source line
// printed under it ("    raise ValueError(…"): both repeat text of the
// exception below them, so they are not evidence themselves.
func IsTracebackBody(msg string) bool {
	return strings.HasPrefix(msg, "    ") || strings.HasPrefix(strings.TrimLeft(msg, " "), `File "`)
}

// ExceptionType returns the type of the exception line that ends a
// traceback ("torch.OutOfMemoryError: CUDA out of memory…" →
// "torch.OutOfMemoryError"). Only names ending in Error or Exception count.
func ExceptionType(msg string) (string, bool) {
	if msg == "" || !(msg[0] >= 'A' && msg[0] <= 'Z' || msg[0] >= 'a' && msg[0] <= 'z') {
		return "", false
	}
	i := 0
	for i < len(msg) && i < 120 {
		c := msg[i]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' {
			i++
			continue
		}
		break
	}
	if i < len(msg) && msg[i] != ':' {
		return "", false
	}
	typ := msg[:i]
	if i+1 < len(msg) && msg[i+1] != ' ' {
		return "", false
	}
	if !strings.HasSuffix(typ, "Error") && !strings.HasSuffix(typ, "Exception") {
		return "", false
	}
	return typ, true
}

// FormatFrame renders a frame line and the source line under it, as Python
// prints them.
func FormatFrame(file string, line int, fn, code string) []string {
	return []string{`  File "` + file + `", line ` + strconv.Itoa(line) + ", in " + fn, "    " + code}
}
