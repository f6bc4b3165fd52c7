package config

import "fmt"

// BurntSushi/toml spends time and memory quadratic in how deep a key sits:
// 80 KB of nested inline tables took over 60 s and 11 GB, a 40 KB dotted
// key 35 s and 5 GB, and a SIGHUP reload of such a file grows the running
// guard the same way (issue 32 item 5). vllm-guard's own keys sit at most
// three deep ([vllm] env.NAME), so prescan refuses, before the decoder sees
// the file, brackets nested deeper than maxNesting and keys of more than
// maxKeyParts dotted parts. It is one linear pass over the bytes that skips
// strings and comments, so a bracket or a dot inside a quoted argument
// never counts.
const (
	maxNesting  = 32
	maxKeyParts = 32
)

// prescan returns an *Error at the first line that nests too deep, or nil.
// It never refuses a file the decoder would accept for a reason other than
// these two bounds; malformed strings are left for the decoder to report.
func prescan(path string, src []byte) error {
	line := 1
	depth := 0 // open { and [, table headers included
	dots := 0  // dots since the last token that starts a new key
	n := len(src)
	for i := 0; i < n; i++ {
		switch c := src[i]; c {
		case '\n':
			line++
			dots = 0
		case '#':
			for i+1 < n && src[i+1] != '\n' {
				i++
			}
		case '"', '\'':
			var nl int
			i, nl = skipString(src, i)
			line += nl
		case '{', '[':
			depth++
			dots = 0
			if depth > maxNesting {
				return &Error{File: path, Line: line, Msg: fmt.Sprintf("inline tables and arrays nest more than %d deep here; no vllm-guard setting nests deeper than 3 ([vllm] env.NAME): write the tables as [section] headers with plain keys", maxNesting)}
			}
		case '}', ']':
			if depth > 0 {
				depth--
			}
			dots = 0
		case '=', ',':
			dots = 0
		case '.':
			dots++
			// A value holds at most one dot (1.5, a time's fraction), so
			// only a dotted key comes near the bound.
			if dots >= maxKeyParts {
				return &Error{File: path, Line: line, Msg: fmt.Sprintf("a key here has more than %d dotted parts; no vllm-guard setting has more than 3 ([vllm] env.NAME): write the key as a [section] header and a plain key", maxKeyParts)}
			}
		}
	}
	return nil
}

// skipString skips the string that opens at src[i] (" or ', single or
// triple) and returns the index of its last byte and the newlines it held.
// An unterminated single-line string ends before its line's newline, so
// the line count stays right for the decoder's own error.
func skipString(src []byte, i int) (end, newlines int) {
	q := src[i]
	n := len(src)
	if i+2 < n && src[i+1] == q && src[i+2] == q {
		j := i + 3
		for j < n {
			switch {
			case src[j] == '\\' && q == '"':
				if j+1 < n && src[j+1] == '\n' {
					newlines++
				}
				j += 2
				continue
			case src[j] == '\n':
				newlines++
			case src[j] == q && j+2 < n && src[j+1] == q && src[j+2] == q:
				j += 3
				// Up to two more quotes belong to the content: """a"""""
				for k := 0; k < 2 && j < n && src[j] == q; k++ {
					j++
				}
				return j - 1, newlines
			}
			j++
		}
		return n - 1, newlines
	}
	if i+1 < n && src[i+1] == q {
		return i + 1, 0 // "" or ''
	}
	j := i + 1
	for j < n && src[j] != q && src[j] != '\n' {
		if src[j] == '\\' && q == '"' && j+1 < n && src[j+1] != '\n' {
			j++
		}
		j++
	}
	if j < n && src[j] == '\n' {
		return j - 1, 0
	}
	return min(j, n-1), 0
}
