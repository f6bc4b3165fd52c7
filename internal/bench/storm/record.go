package main

import (
	"sort"
	"time"
)

// sample is one availability check: /health answered 200 and a 1-token
// completion worked, at `at` since the run began.
type sample struct {
	at time.Duration
	ok bool
}

// record is what one run observed, in real time since the run began.
type record struct {
	starts      []time.Duration
	ooms        []time.Duration
	kills       int             // the supervisor killed a live vLLM (hang, liveness)
	alerts      []time.Duration // oom_predicted raised (guard only)
	samples     []sample
	reqs        int
	reqFailed   int
	heldAtStart int64  // most GPU memory held by others while a start was under way
	maxNumSeqs  int    // the last --max-num-seqs launched
	terminal    string // the supervisor stopped for good: why
	terminalAt  time.Duration
	phase       string // where a restarting supervisor is (CrashLoopBackOff, BACKOFF…)
}

// end is what the run saw at the end of the scenario (or when its
// supervisor stopped for good).
type end struct {
	serving    bool
	orphans    int
	orphanGPU  int64
	safeMax    int   // fakevllm_true_safe_max_num_seqs, 0 when unknown
	seqCost    int64 // fakevllm_true_seq_cost_bytes, 0 when unknown
	sawMetrics bool
}

// availability is the time-weighted fraction of [from, until] during which
// the samples said ready; each sample holds until the next one, the last
// until measured, and the time after measured counts as down (a supervisor
// that stopped for good ends its run early).
func availability(ss []sample, from, measured, until time.Duration) float64 {
	if until <= from {
		return 0
	}
	var up time.Duration
	for i, s := range ss {
		if !s.ok || s.at >= until {
			continue
		}
		next := min(measured, until)
		if i+1 < len(ss) {
			next = min(ss[i+1].at, until)
		}
		lo := max(s.at, from)
		if next > lo {
			up += next - lo
		}
	}
	return float64(up) / float64(until-from)
}

// firstStable is when the first ready stretch that lasted at least
// `stable` began; a single failed sample inside a stretch (a probe that
// lost the CPU race) does not end it. ok is false when no stretch lasted.
func firstStable(ss []sample, stable, until time.Duration) (time.Duration, bool) {
	sort.SliceStable(ss, func(i, j int) bool { return ss[i].at < ss[j].at })
	begin, in := time.Duration(0), false
	for i, s := range ss {
		switch {
		case s.ok && !in:
			begin, in = s.at, true
		case !s.ok && in:
			isolated := i > 0 && ss[i-1].ok && i+1 < len(ss) && ss[i+1].ok
			if !isolated {
				if s.at-begin >= stable {
					return begin, true
				}
				in = false
			}
		}
	}
	if in && until-begin >= stable {
		return begin, true
	}
	return 0, false
}

// alertLeads pairs each OOM with the first oom_predicted alert raised
// since the start before it: the lead is how long the alert came before
// the OOM; -1 when that OOM had no alert.
func alertLeads(starts, alerts, ooms []time.Duration) []time.Duration {
	var out []time.Duration
	for _, o := range ooms {
		from := time.Duration(-1)
		for _, s := range starts {
			if s <= o {
				from = s
			}
		}
		lead := time.Duration(-1)
		for _, a := range alerts {
			if a >= from && a <= o {
				lead = o - a
				break // the first alert of the episode: the earliest warning
			}
		}
		out = append(out, lead)
	}
	return out
}
