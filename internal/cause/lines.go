package cause

// vLLM's log format (ANSI, prefixes, tracebacks) lives in internal/vllmlog.

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// clip shortens s to at most n bytes (on a rune boundary) for one-line summaries.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
