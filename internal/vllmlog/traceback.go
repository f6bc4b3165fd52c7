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

// Frame is one frame line of a traceback: `  File "x.py", line 12, in f`.
type Frame struct {
	File string
	Line int
	Func string // "" when the line names none
}

// ParseFrame parses a frame line.
func ParseFrame(msg string) (Frame, bool) {
	s := strings.TrimLeft(msg, " ")
	if !strings.HasPrefix(s, `File "`) {
		return Frame{}, false
	}
	s = s[len(`File "`):]
	q := strings.Index(s, `", line `)
	if q < 0 {
		return Frame{}, false
	}
	f := Frame{File: s[:q]}
	s = s[q+len(`", line `):]
	j := 0
	for j < len(s) && isDigit(s[j]) {
		j++
	}
	if j == 0 || j > 9 {
		return Frame{}, false
	}
	f.Line, _ = strconv.Atoi(s[:j])
	s = s[j:]
	switch {
	case s == "":
	case strings.HasPrefix(s, ", in ") && len(s) > len(", in "):
		f.Func = s[len(", in "):]
	default:
		return Frame{}, false
	}
	return f, true
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
