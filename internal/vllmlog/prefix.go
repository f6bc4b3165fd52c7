package vllmlog

import (
	"strconv"
	"strings"
	"time"
)

// Era is a generation of vLLM's log format.
type Era int

const (
	// EraV0 (before 2025): "INFO 10-14 12:00:00 api_server.py:527] msg";
	// only multiprocessing workers carry a process prefix
	// ("(VllmWorkerProcess pid=5101) "), never coloured.
	EraV0 Era = iota
	// EraV1ANSI (2025): "INFO 10-14 12:00:00 [api_server.py:1805] msg" after
	// a process prefix wrapped in ANSI colours even when piped.
	EraV1ANSI
	// EraV1Plain (2026): as EraV1ANSI, the prefix without colours.
	EraV1Plain
)

// StampLayout is vLLM's time stamp: no year, no milliseconds.
const StampLayout = "01-02 15:04:05"

// Levels are the level names vLLM's logger prints.
var Levels = [...]string{"INFO", "WARNING", "ERROR", "DEBUG", "CRITICAL", "WARN"}

// The colours vLLM put around a V1 process prefix.
const (
	prefixColour = "\x1b[1;36m"
	colourReset  = "\x1b[0;0m"
)

// Proc names a process as its prefix does: Proc("EngineCore_DP0", 42) is
// "EngineCore_DP0 pid=42"; workers add their rank before the pid
// ("VllmWorker rank=3 pid=403").
func Proc(name string, pid int) string { return name + " pid=" + strconv.Itoa(pid) }

// ProcessPrefix is the prefix ("(APIServer pid=1) ") a process puts before
// every line it writes, on either stream; "" when proc is "". EraV1ANSI
// colours it.
func ProcessPrefix(e Era, proc string) string {
	if proc == "" {
		return ""
	}
	if e == EraV1ANSI {
		return prefixColour + "(" + proc + ")" + colourReset + " "
	}
	return "(" + proc + ") "
}

// FormatLine renders one line of vLLM's logger, without the newline:
// the process prefix (see ProcessPrefix), the level, the time stamp, the
// source ("api_server.py:527"; bracketed since 2025) and the message.
func FormatLine(e Era, proc, level string, t time.Time, src, msg string) string {
	var b strings.Builder
	p := ProcessPrefix(e, proc)
	b.Grow(len(p) + len(level) + len(StampLayout) + len(src) + len(msg) + 6)
	b.WriteString(p)
	b.WriteString(level)
	b.WriteByte(' ')
	b.WriteString(t.Format(StampLayout))
	b.WriteByte(' ')
	if e == EraV0 {
		b.WriteString(src)
	} else {
		b.WriteByte('[')
		b.WriteString(src)
	}
	b.WriteString("] ")
	b.WriteString(msg)
	return b.String()
}

// Journal is journalctl's short prefix: "Dec 02 09:31:24 gpu-node-3 vllm[4121]: ".
func Journal(t time.Time, host, ident string) string {
	return t.Format("Jan 02 15:04:05") + " " + host + " " + ident + ": "
}

// rfc3339Nano is the stamp docker and the CRI put before each line.
const rfc3339Nano = "2006-01-02T15:04:05.000000000Z"

// Docker is `docker logs --timestamps`' prefix: "2025-07-22T09:00:00.123456789Z ".
func Docker(t time.Time) string { return t.UTC().Format(rfc3339Nano) + " " }

// CRI is the prefix of a container runtime's log file (what `kubectl logs`
// reads): "2026-01-12T10:00:00.123456789Z stdout F "; partial marks a line
// the runtime cut ("P").
func CRI(t time.Time, stream string, partial bool) string {
	tag := " F "
	if partial {
		tag = " P "
	}
	return t.UTC().Format(rfc3339Nano) + " " + stream + tag
}

// Message returns the message of one line: it strips what wraps it,
// outermost first: a docker/Kubernetes RFC 3339 time stamp (and CRI's
// "stdout F"), a journalctl prefix, vLLM's process prefix and its level
// prefix (in either order), and trailing CR, LF and spaces.
//
// ANSI escapes are stripped too. The common shapes, a plain line or a V1
// line whose process prefix alone is coloured, are cut without allocating:
// the result is a substring of s. Any other line holding an escape is
// stripped into a copy first.
func Message(s string) string {
	orig := s
	s = strings.TrimRight(s, "\r\n ")
	s, _ = CutWrapper(s)
	s = skipCSI(s)
	for range 2 { // the process prefix may precede or follow the level
		s, _, _ = CutProcess(s)
		s, _, _ = CutLevel(s)
	}
	if strings.IndexByte(s, esc) >= 0 {
		return Message(StripANSI(orig))
	}
	return s
}

// skipCSI skips CSI sequences ("\x1b[1;36m") at the start of s.
func skipCSI(s string) string {
	for len(s) > 2 && s[0] == esc && s[1] == '[' {
		s = s[escLen(s):]
	}
	return s
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// CutWrapper removes the prefix an operator's tool put before the line:
// docker's "2025-03-04T10:11:12.123Z ", CRI's "… stdout F " / "… stderr P ",
// journalctl's "Dec 02 09:31:24 host vllm[1234]: " and its short-iso form
// "2025-12-02T09:31:24+0000 host vllm[1234]: ". ok is false, and s is
// returned unchanged, when there is none.
func CutWrapper(s string) (rest string, ok bool) {
	if r := cutRFC3339(s); len(r) != len(s) {
		return r, true
	}
	if r := cutJournal(s); len(r) != len(s) {
		return r, true
	}
	return s, false
}

// cutRFC3339 removes "2025-03-04T10:11:12.123Z " and a following CRI
// "stdout F " / "stderr P ", or the host and ident of journalctl -o short-iso.
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

// CutProcess removes a process prefix ("(APIServer pid=1) ",
// "(VllmWorker rank=0 pid=7) " and kin, with the colour reset after it) and
// returns proc, what is inside the parentheses. One space separates the
// prefix; more is the line's own indentation (traceback source lines),
// which stays.
func CutProcess(s string) (rest, proc string, ok bool) {
	if len(s) < 8 || s[0] != '(' {
		return s, "", false
	}
	end := strings.IndexByte(s, ')')
	if end < 0 || end > 64 || !strings.Contains(s[:end], "pid=") {
		return s, "", false
	}
	return strings.TrimPrefix(skipCSI(s[end+1:]), " "), s[1:end], true
}

// CutLevel removes a level prefix, "INFO 10-14 12:00:00 [file.py:12] " (since
// 2025) or "INFO 10-14 12:00:00 file.py:12] " (before), and returns the
// level. A line that is only a prefix leaves "".
func CutLevel(s string) (rest, level string, ok bool) {
	if len(s) < 10 || s[0] < 'C' || s[0] > 'W' {
		return s, "", false
	}
	for _, l := range Levels {
		if len(s) <= len(l) || s[len(l)] != ' ' || !strings.HasPrefix(s, l) {
			continue
		}
		head := s[:min(len(s), len(l)+101)]
		e := strings.Index(head, "] ")
		if e < 0 {
			if strings.HasSuffix(s, "]") && len(s) <= len(l)+101 {
				return "", l, true
			}
			return s, "", false
		}
		if !isDigit(s[e-1]) {
			return s, "", false
		}
		return s[e+2:], l, true
	}
	return s, "", false
}

// LoggerMessage returns the message of a line printed by vLLM's own logger
// ("INFO 10-14 12:00:00 [api_server.py:1805] msg", after any wrapper and
// process prefix); ok is false for every other line: uvicorn's, a print,
// a traceback's body.
func LoggerMessage(s string) (msg string, ok bool) {
	if strings.IndexByte(s, esc) >= 0 {
		s = StripANSI(s)
	}
	s = strings.TrimRight(s, "\r\n ")
	s, _ = CutWrapper(s)
	s, _, _ = CutProcess(s)
	s, _, ok = CutLevel(s)
	if !ok {
		return "", false
	}
	s, _, _ = CutProcess(s)
	return s, true
}

// SupportedTasks reads vLLM's startup line naming the tasks the model
// serves: "Supported tasks: ['generate']" (newer) or "Supported_tasks:
// ['encode', 'embed']" (older). Only a line of vLLM's own logger whose
// message is that line counts: an access line or a logged request holding
// the same words is the client's text, not vLLM's (nil).
func SupportedTasks(line string) []string {
	msg, ok := LoggerMessage(line)
	if !ok {
		return nil
	}
	rest, ok := strings.CutPrefix(msg, "Supported_tasks:")
	if !ok {
		if rest, ok = strings.CutPrefix(msg, "Supported tasks:"); !ok {
			return nil
		}
	}
	rest = strings.TrimSpace(rest)
	if len(rest) < 2 || rest[0] != '[' || rest[len(rest)-1] != ']' {
		return nil
	}
	var out []string
	for _, part := range strings.Split(rest[1:len(rest)-1], ",") {
		t := strings.TrimSpace(part)
		if len(t) >= 2 && (t[0] == '\'' || t[0] == '"') && t[len(t)-1] == t[0] {
			t = t[1 : len(t)-1]
		}
		if t == "" || strings.ContainsAny(t, " '\"[]") {
			return nil
		}
		out = append(out, t)
	}
	return out
}
