package policy

import "strings"

// StripANSI removes ANSI escape sequences (CSI such as colours, and OSC).
// It returns s itself, without allocating, when s holds no ESC byte.
func StripANSI(s string) string {
	i := strings.IndexByte(s, 0x1b)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i >= 0 {
		b.WriteString(s[:i])
		s = s[i+1:]
		switch {
		case len(s) > 0 && s[0] == '[': // CSI: parameters, then one final byte 0x40–0x7e
			j := 1
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			s = s[min(j+1, len(s)):]
		case len(s) > 0 && s[0] == ']': // OSC: up to BEL or ESC \
			j := 1
			for j < len(s) && s[j] != 0x07 && s[j] != 0x1b {
				j++
			}
			if j < len(s) && s[j] == 0x07 {
				j++
			} else if j+1 < len(s) && s[j] == 0x1b && s[j+1] == '\\' {
				j += 2
			}
			s = s[j:]
		case len(s) > 0: // two-byte escape
			s = s[1:]
		}
		i = strings.IndexByte(s, 0x1b)
	}
	b.WriteString(s)
	return b.String()
}

// messageOf strips what wraps a vLLM log message, outermost first: a
// docker/Kubernetes RFC 3339 timestamp (and CRI's "stdout F"), a journalctl
// prefix ("Dec 02 09:31:24 host vllm[1234]: "), vLLM's process prefix
// ("(EngineCore_DP0 pid=42) ") and its level prefix ("INFO 10-14 12:00:00
// [file.py:12] " or, before 2025, "INFO 10-14 12:00:00 file.py:12] ").
// It never allocates: the result is a substring of s.
//
// ANSI colour codes are stripped first. The common V1 shape, a coloured
// process prefix and a plain message, is cut without allocating; any other
// line holding an escape is stripped into a copy.
func messageOf(s string) string {
	orig := s
	s = strings.TrimRight(s, "\r\n ")
	s = cutRFC3339(s)
	s = cutJournal(s)
	s = skipCSI(s)
	for range 2 { // the process prefix may precede or follow the level
		s = cutProcess(s)
		s = cutLevel(s)
	}
	if strings.IndexByte(s, 0x1b) >= 0 {
		return messageOf(StripANSI(orig))
	}
	return s
}

// skipCSI skips ANSI CSI sequences ("\x1b[1;36m") at the start of s.
func skipCSI(s string) string {
	for len(s) > 2 && s[0] == 0x1b && s[1] == '[' {
		j := 2
		for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
			j++
		}
		s = s[min(j+1, len(s)):]
	}
	return s
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// cutRFC3339 removes "2025-03-04T10:11:12.123Z " and a following CRI
// "stdout F " / "stderr P ", and the host + ident of journalctl -o short-iso.
func cutRFC3339(s string) string {
	if len(s) < 20 || !isDigit(s[0]) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' {
		return s
	}
	sp := strings.IndexByte(s, ' ')
	if sp < 0 {
		return s
	}
	s = s[sp+1:]
	for _, cri := range [...]string{"stdout F ", "stdout P ", "stderr F ", "stderr P "} {
		if strings.HasPrefix(s, cri) {
			return s[len(cri):]
		}
	}
	return cutHostIdent(s)
}

var months = [...]string{"Jan ", "Feb ", "Mar ", "Apr ", "May ", "Jun ", "Jul ", "Aug ", "Sep ", "Oct ", "Nov ", "Dec "}

// cutJournal removes journalctl's short prefix "Dec 02 09:31:24 host vllm[1234]: ".
func cutJournal(s string) string {
	if len(s) < 17 || s[6] != ' ' || s[9] != ':' || s[12] != ':' || s[15] != ' ' {
		return s
	}
	ok := false
	for _, m := range months {
		if s[:4] == m {
			ok = true
			break
		}
	}
	if !ok {
		return s
	}
	return cutHostIdent(s[16:])
}

// cutHostIdent removes "host ident[pid]: " or "host kernel: ".
func cutHostIdent(s string) string {
	sp := strings.IndexByte(s, ' ')
	if sp <= 0 || strings.IndexByte(s[:sp], ':') >= 0 {
		return s
	}
	rest := s[sp+1:]
	c := strings.Index(rest, ": ")
	if c <= 0 || c > 64 || strings.IndexByte(rest[:c], ' ') >= 0 {
		return s
	}
	return rest[c+2:]
}

// cutProcess removes "(APIServer pid=1) ", "(VllmWorker rank=0 pid=7) " and kin.
func cutProcess(s string) string {
	if len(s) < 8 || s[0] != '(' {
		return s
	}
	end := strings.IndexByte(s, ')')
	if end < 0 || end > 64 || !strings.Contains(s[:end], "pid=") {
		return s
	}
	// One space separates the prefix (after its colour reset, if any); more
	// is the line's own indentation (traceback source lines), which
	// matchLine relies on.
	return strings.TrimPrefix(skipCSI(s[end+1:]), " ")
}

var levels = [...]string{"INFO ", "WARNING ", "ERROR ", "DEBUG ", "CRITICAL ", "WARN "}

// cutLevel removes "INFO 10-14 12:00:00 [file.py:12] " / "INFO 10-14 12:00:00 file.py:12] ".
func cutLevel(s string) string {
	if len(s) < 10 || s[0] < 'C' || s[0] > 'W' {
		return s
	}
	for _, l := range levels {
		if !strings.HasPrefix(s, l) {
			continue
		}
		head := s[:min(len(s), len(l)+100)]
		e := strings.Index(head, "] ")
		if e < 0 {
			if strings.HasSuffix(s, "]") && len(s) <= len(l)+100 {
				return ""
			}
			return s
		}
		if !isDigit(s[e-1]) {
			return s
		}
		return s[e+2:]
	}
	return s
}

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
