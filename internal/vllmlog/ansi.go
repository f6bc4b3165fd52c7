package vllmlog

import (
	"bytes"
	"strings"
)

const esc = 0x1b

// StripANSI removes terminal escape sequences: vLLM coloured its process
// prefixes until early 2026 even when piped. It removes CSI sequences
// ("\x1b[1;36m"), OSC and the other string sequences (DCS, SOS, PM, APC)
// ended by BEL or ST ("\x1b\\") or left unterminated, nF escapes ("\x1b(B",
// a charset designation: intermediate bytes, then a final byte) and two-byte
// escapes ("\x1bM"), and a stray ESC on its own.
//
// It returns s itself, without allocating, when s holds no ESC byte. The
// result never holds an ESC byte and is never longer than s.
func StripANSI(s string) string {
	i := strings.IndexByte(s, esc)
	if i < 0 {
		return s
	}
	return string(appendStripped(make([]byte, 0, len(s)), s, i))
}

// AppendStripANSI appends b without its escape sequences (as StripANSI) to
// dst: the pump strips into a buffer it reuses.
func AppendStripANSI(dst, b []byte) []byte {
	i := bytes.IndexByte(b, esc)
	if i < 0 {
		return append(dst, b...)
	}
	return appendStripped(dst, b, i)
}

// appendStripped appends s to dst without its escapes; i is the index of the
// first ESC in s.
func appendStripped[T string | []byte](dst []byte, s T, i int) []byte {
	dst = append(dst, s[:i]...)
	for i < len(s) {
		if s[i] != esc {
			j := i + 1
			for j < len(s) && s[j] != esc {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		i += escLen(s[i:])
	}
	return dst
}

// escLen is the length of the escape sequence at the start of s (s[0] is
// ESC). A malformed sequence ends where it stops making sense, so that the
// text after it survives; a string sequence that is never terminated runs
// to the end of s, as a terminal would swallow it.
func escLen[T string | []byte](s T) int {
	if len(s) < 2 {
		return len(s)
	}
	switch c := s[1]; {
	case c == '[': // CSI: parameter and intermediate bytes 0x20–0x3f, then a final byte 0x40–0x7e
		j := 2
		for j < len(s) && s[j] >= 0x20 && s[j] <= 0x3f {
			j++
		}
		if j < len(s) && s[j] >= 0x40 && s[j] <= 0x7e {
			j++
		}
		return j
	case c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_': // OSC, DCS, SOS, PM, APC: up to BEL or ST
		for j := 2; j < len(s); j++ {
			if s[j] == 0x07 {
				return j + 1
			}
			if s[j] == esc {
				if j+1 < len(s) && s[j+1] == '\\' {
					return j + 2
				}
				return j // another escape begins: this one was cut short
			}
		}
		return len(s)
	case c >= 0x20 && c <= 0x2f: // nF: intermediate bytes, then a final byte 0x30–0x7e
		j := 2
		for j < len(s) && s[j] >= 0x20 && s[j] <= 0x2f {
			j++
		}
		if j < len(s) && s[j] >= 0x30 && s[j] <= 0x7e {
			j++
		}
		return j
	case c >= 0x30 && c <= 0x7e: // Fp, Fe, Fs: two bytes
		return 2
	}
	return 1 // a stray ESC: drop it, keep what follows
}
