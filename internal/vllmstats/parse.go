// Package vllmstats owns what the guard reads from vLLM's own /metrics:
// the request queue (running, waiting), KV cache usage under both of the
// names vLLM has used for it, preemptions and token counters. Parse reads
// one Prometheus text exposition; Scraper polls a ready vLLM and keeps the
// latest reading. A failed scrape is counted, never fatal: the guard's
// decisions never depend on it.
package vllmstats

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// MaxBody bounds what Parse reads: vLLM's /metrics is tens of KiB, a body
// this large is not vLLM.
const MaxBody = 4 << 20

// Stats is the latest reading of vLLM's /metrics.
type Stats struct {
	Up               bool      `json:"up"`                // the last scrape succeeded and a target is set
	Running          float64   `json:"running"`           // requests being processed (sum over engines)
	Waiting          float64   `json:"waiting"`           // requests queued (sum over engines)
	KVUsage          float64   `json:"kv_usage"`          // 0..1, the fullest engine's KV cache
	Preemptions      float64   `json:"preemptions"`       // counter
	PromptTokens     float64   `json:"prompt_tokens"`     // counter
	GenerationTokens float64   `json:"generation_tokens"` // counter
	TokensKnown      bool      `json:"tokens_known"`      // the token counters are in the exposition
	ScrapedAt        time.Time `json:"scraped_at,omitzero"`
	// AskedAt: when the scrape was sent; the counts are no older (the
	// admission samples pair them with the GPU reading that follows).
	AskedAt   time.Time `json:"-"`
	Scrapes   uint64    `json:"scrapes"`
	Failures  uint64    `json:"failures"`
	LastError string    `json:"last_error,omitempty"`
}

// The series Parse reads. vLLM renamed its KV gauge around v0.11; both are
// accepted and the new one wins when an exposition has both.
const (
	metricRunning     = "vllm:num_requests_running"
	metricWaiting     = "vllm:num_requests_waiting"
	metricKV          = "vllm:kv_cache_usage_perc"
	metricKVOld       = "vllm:gpu_cache_usage_perc"
	metricPreemptions = "vllm:num_preemptions_total"
	metricPrompt      = "vllm:prompt_tokens_total"
	metricGeneration  = "vllm:generation_tokens_total"
)

// Parse reads a Prometheus text exposition of vLLM's /metrics. Counts and
// counters are summed over label sets (several engines or models); KV usage
// is the highest over them, since the fullest cache is the one that
// preempts. Lines Parse does not need are skipped without checking them, so
// a new exposition feature elsewhere cannot break the scrape. The result
// has Up false and no scrape bookkeeping: Scraper fills those.
func Parse(r io.Reader) (Stats, error) {
	var (
		st                                     Stats
		found                                  = map[string]bool{}
		kvNew, kvOld                           = math.Inf(-1), math.Inf(-1)
		lineNo                                 int
		limited                                = &io.LimitedReader{R: r, N: MaxBody + 1}
		sc                                     = bufio.NewScanner(limited)
		running, waiting, preempt, prompt, gen float64
	)
	sc.Buffer(make([]byte, 0, 64<<10), MaxBody+1)
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := cutName(line)
		if !ok {
			continue
		}
		var sum *float64
		switch name {
		case metricRunning:
			sum = &running
		case metricWaiting:
			sum = &waiting
		case metricPreemptions:
			sum = &preempt
		case metricPrompt:
			sum = &prompt
		case metricGeneration:
			sum = &gen
		case metricKV, metricKVOld:
		default:
			continue
		}
		v, err := sampleValue(rest)
		if err != nil {
			return Stats{}, fmt.Errorf("vllmstats: line %d: %s: %w", lineNo, name, err)
		}
		found[name] = true
		switch {
		case sum != nil:
			*sum += v
		case name == metricKV:
			kvNew = max(kvNew, v)
		default:
			kvOld = max(kvOld, v)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return Stats{}, fmt.Errorf("vllmstats: line %d is longer than %d bytes: this is not vLLM's /metrics", lineNo+1, MaxBody)
		}
		return Stats{}, fmt.Errorf("vllmstats: reading /metrics: %w", err)
	}
	if limited.N <= 0 {
		return Stats{}, fmt.Errorf("vllmstats: /metrics body is larger than %d bytes: this is not vLLM's /metrics", MaxBody)
	}
	if !found[metricRunning] && !found[metricWaiting] && !found[metricKV] && !found[metricKVOld] {
		return Stats{}, fmt.Errorf("vllmstats: no vLLM series in %d lines (looked for %s, %s, %s or %s): is the target vLLM's /metrics?",
			lineNo, metricRunning, metricWaiting, metricKV, metricKVOld)
	}
	st.Running, st.Waiting = running, waiting
	st.Preemptions, st.PromptTokens, st.GenerationTokens = preempt, prompt, gen
	st.TokensKnown = found[metricPrompt] || found[metricGeneration]
	switch {
	case found[metricKV]:
		st.KVUsage = kvNew
	case found[metricKVOld]:
		st.KVUsage = kvOld
	}
	// Sums of finite values can still overflow; an infinity would make the
	// status document unencodable.
	for _, f := range []struct {
		name string
		v    float64
	}{{metricRunning, st.Running}, {metricWaiting, st.Waiting}, {"KV usage", st.KVUsage},
		{metricPreemptions, st.Preemptions}, {metricPrompt, st.PromptTokens}, {metricGeneration, st.GenerationTokens}} {
		if math.IsInf(f.v, 0) || math.IsNaN(f.v) {
			return Stats{}, fmt.Errorf("vllmstats: %s sums to %v: values out of range", f.name, f.v)
		}
	}
	return st, nil
}

// Flat reads a Prometheus text exposition into each series' name (labels
// dropped) and its value, the last sample of a name winning: the quick look
// of the tests and benchmarks at the simulator's own series, which carry no
// labels. Lines that are not well-formed samples are skipped.
func Flat(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(&io.LimitedReader{R: r, N: MaxBody + 1})
	sc.Buffer(make([]byte, 0, 64<<10), MaxBody+1)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := cutName(line)
		if !ok {
			continue
		}
		if v, err := sampleValue(rest); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// cutName splits a sample line into its metric name and what follows it
// (labels, value, timestamp).
func cutName(line string) (name, rest string, ok bool) {
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return "", "", false
	}
	return line[:i], line[i:], true
}

// sampleValue reads `{labels} value [timestamp]` or ` value [timestamp]`.
// Label values may hold '}', spaces and escaped quotes, so the label set is
// scanned, not searched.
func sampleValue(rest string) (float64, error) {
	if strings.HasPrefix(rest, "{") {
		end, err := labelsEnd(rest)
		if err != nil {
			return 0, err
		}
		rest = rest[end:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return 0, errors.New("no value after the name")
	}
	if len(fields) > 2 {
		return 0, fmt.Errorf("%d fields after the name, want a value and an optional timestamp", len(fields))
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 0, fmt.Errorf("value %q is not a number", fields[0])
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("value %q is not a finite number", fields[0])
	}
	return v, nil
}

// labelsEnd returns the index just past the '}' closing the label set that
// s starts with.
func labelsEnd(s string) (int, error) {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++ // skip the escaped byte
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i + 1, nil
		}
	}
	if inQuote {
		return 0, errors.New("unterminated label value")
	}
	return 0, errors.New("label set has no closing '}'")
}
