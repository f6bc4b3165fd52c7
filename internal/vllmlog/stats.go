package vllmlog

import (
	"strconv"
	"strings"
	"time"
)

// Stats is one of the periodic stats lines vLLM's engine logs while it
// serves (every VLLM_LOG_STATS_INTERVAL seconds, 10 by default in V1; every
// 5 s in V0):
//
//	V1 (vllm/v1/metrics/loggers.py, LoggingStatLogger.log):
//	  "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s,
//	   Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%"
//	V0 (vllm/engine/metrics.py, LoggingStatLogger.log):
//	  "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s,
//	   Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%, ..."
//
// A request counted as running while both throughputs stay at zero for
// minutes is an engine that no longer steps, though /health still answers
// 200 (it only checks an error flag).
type Stats struct {
	Prompt     float64 // tokens/s
	Generation float64 // tokens/s
	Running    int     // requests
	Waiting    int     // requests ("Pending" in V0)
}

// ParseStats parses a stats line's message (see Message).
func ParseStats(msg string) (Stats, bool) {
	var s Stats
	var ok bool
	if s.Prompt, ok = floatAfter(msg, "Avg prompt throughput: "); !ok {
		return Stats{}, false
	}
	if s.Generation, ok = floatAfter(msg, "Avg generation throughput: "); !ok {
		return Stats{}, false
	}
	if s.Running, ok = intAfter(msg, "Running: "); !ok {
		return Stats{}, false
	}
	if s.Waiting, ok = intAfter(msg, "Waiting: "); !ok {
		s.Waiting, _ = intAfter(msg, "Pending: ")
	}
	return s, true
}

// floatAfter reads the non-negative decimal number right after key.
func floatAfter(s, key string) (float64, bool) {
	i := strings.Index(s, key)
	if i < 0 {
		return 0, false
	}
	s = s[i+len(key):]
	j := 0
	for j < len(s) && (isDigit(s[j]) || s[j] == '.') {
		j++
	}
	v, err := strconv.ParseFloat(s[:j], 64)
	return v, err == nil && v >= 0
}

// intAfter reads the non-negative integer right after key.
func intAfter(s, key string) (int, bool) {
	i := strings.Index(s, key)
	if i < 0 {
		return 0, false
	}
	s = s[i+len(key):]
	j := 0
	for j < len(s) && j < 9 && isDigit(s[j]) {
		j++
	}
	v, err := strconv.Atoi(s[:j])
	return v, err == nil
}

// Stamp returns the time stamp of vLLM's level prefix ("INFO 10-14
// 12:00:00 …", see StampLayout) behind whatever wraps the line (docker,
// journalctl, the process prefix, ANSI colours). The year is 0: vLLM does
// not print one, so only differences within a log mean anything.
func Stamp(line string) (time.Time, bool) {
	s := StripANSI(strings.TrimRight(line, "\r\n "))
	s, _ = CutWrapper(s)
	for range 2 { // the process prefix may precede or follow the level
		s, _, _ = CutProcess(s)
		for _, l := range Levels {
			if len(s) >= len(l)+1+len(StampLayout) && strings.HasPrefix(s, l) && s[len(l)] == ' ' {
				t, err := time.Parse(StampLayout, s[len(l)+1:len(l)+1+len(StampLayout)])
				return t, err == nil
			}
		}
	}
	return time.Time{}, false
}
