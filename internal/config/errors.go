package config

import (
	"fmt"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/redact"
)

// Error is one problem in a configuration file: where it is and what to
// write instead. Line is 0 when the problem has no single line (the file is
// missing, or a default value clashes with nothing written in the file).
type Error struct {
	File string // the path as given to Load
	Line int    // 1-based; 0 when unknown
	Key  string // "[restart] max_delay"; "" for problems with the whole file
	Msg  string // what is wrong and what is allowed
	Err  error  // the underlying error, if any (errors.Is(err, fs.ErrNotExist) works)
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
	} else {
		b.WriteString("config")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	// A message may quote the value: a webhook URL with its credentials, a
	// command with an API key. Errors go to terminals, CI logs, the journal.
	return redact.String(b.String())
}

func (e *Error) Unwrap() error { return e.Err }

// Errors is every problem found in one file, in file order. Load returns it
// when there is more than one, so an operator fixes them all in one pass.
// errors.As(err, &*Error) finds the first.
type Errors []*Error

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// keyName formats a key path the way an operator reads it: "[restart]
// max_delay", "[vllm] env.CUDA_VISIBLE_DEVICES", or "[proxy]" for a table.
func keyName(path []string) string {
	if len(path) == 0 {
		return ""
	}
	parts := make([]string, len(path))
	for i, p := range path {
		parts[i] = quoteKeyPiece(p)
	}
	if len(parts) == 1 {
		return "[" + parts[0] + "]"
	}
	return "[" + parts[0] + "] " + strings.Join(parts[1:], ".")
}

func quoteKeyPiece(p string) string {
	if p == "" {
		return `""`
	}
	for _, r := range p {
		if !isBareRune(r) {
			return tomlQuote(p)
		}
	}
	return p
}

func isBareRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-'
}
