package vllmlog

import "strings"

// Bar is one state of a tqdm progress bar vLLM prints while it loads
// (docs/standby-facts.md, "Load progress"): the weights' shards with
// vLLM's own bar format,
//
//	Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:41<00:20, 20.50s/it]
//
// and the CUDA graphs' capture with tqdm's default one,
//
//	Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67 [00:01<00:01, 30.77it/s]
//
// Each state is a line of its own (tqdm leads it with "\r"; the splitter
// cuts there).
type Bar struct {
	Phase   string // the load phase it belongs to (PhaseWeights, PhaseGraphs)
	Unit    string // what it counts, in the operator's words: "shards", "tensors", "graphs"
	Done    int
	Total   int
	Percent int // as vLLM printed it (rounded: 2/3 is 67)
}

// bars are the descriptions of vLLM 0.32.0's load bars this reads, with
// their phase and unit. Any other bar (a client's text, a download) is
// not a load's progress.
var bars = []struct{ desc, phase, unit string }{
	{"checkpoint shards", PhaseWeights, "shards"}, // Loading {safetensors,pt,np_cache} checkpoint shards[ (eager)]
	{"Multi-thread loading shards", PhaseWeights, "shards"},
	{"Loading safetensors using Runai Model Streamer", PhaseWeights, "tensors"},
	{"Capturing CUDA graph", PhaseGraphs, "graphs"},
}

// maxBarCount bounds the counts read: no load has more steps.
const maxBarCount = 1 << 30

// LoadBar reads a line as one state of a load's progress bar; ok is false
// for any other line, and for a bar whose counts do not add up (done over
// total, a percentage over 100).
func LoadBar(line string) (b Bar, ok bool) {
	if !strings.Contains(line, "%") {
		return Bar{}, false
	}
	desc, rest, ok := cutPercent(line)
	if !ok {
		return Bar{}, false
	}
	for _, k := range bars {
		if strings.Contains(desc, k.desc) {
			b.Phase, b.Unit = k.phase, k.unit
			break
		}
	}
	if b.Phase == "" {
		return Bar{}, false
	}
	b.Percent, rest, ok = leadingInt(strings.TrimLeft(rest, " "))
	if !ok || b.Percent > 100 {
		return Bar{}, false
	}
	rest, ok = cutCounts(rest)
	if !ok {
		return Bar{}, false
	}
	if b.Done, rest, ok = leadingInt(rest); !ok {
		return Bar{}, false
	}
	if rest, ok = strings.CutPrefix(rest, "/"); !ok {
		return Bar{}, false
	}
	if b.Total, rest, ok = leadingInt(rest); !ok || b.Total == 0 || b.Done > b.Total {
		return Bar{}, false
	}
	if rest != "" && rest[0] != ' ' {
		return Bar{}, false // "1/3k": a scaled count, not steps
	}
	return b, true
}

// cutPercent splits a bar at the ": " before its percentage: the
// description, and what follows.
func cutPercent(line string) (desc, rest string, ok bool) {
	i := strings.LastIndex(line, "% Completed | ")
	if i < 0 {
		i = strings.LastIndex(line, "%|")
	}
	if i < 0 {
		return "", "", false
	}
	j := strings.LastIndex(line[:i], ": ")
	if j < 0 {
		return "", "", false
	}
	return line[:j], line[j+2:], true
}

// cutCounts skips from just after the percentage to the counts: vLLM's
// "% Completed | " or tqdm's "%|bar| ".
func cutCounts(rest string) (string, bool) {
	if r, ok := strings.CutPrefix(rest, "% Completed | "); ok {
		return r, true
	}
	r, ok := strings.CutPrefix(rest, "%|")
	if !ok {
		return "", false
	}
	i := strings.Index(r, "| ")
	if i < 0 {
		return "", false
	}
	return r[i+2:], true
}

// leadingInt reads the decimal number s begins with, as tqdm writes it
// (no leading zeros).
func leadingInt(s string) (n int, rest string, ok bool) {
	if len(s) > 1 && s[0] == '0' && s[1] >= '0' && s[1] <= '9' {
		return 0, s, false
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		n = n*10 + int(s[i]-'0')
		if n > maxBarCount {
			return 0, s, false
		}
		i++
	}
	return n, s[i:], i > 0
}
