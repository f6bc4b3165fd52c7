package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"time"
)

// Report is the whole benchmark: the table and results.json.
type Report struct {
	Date           string   `json:"date"`
	Command        string   `json:"command"`
	Clients        int      `json:"clients"`
	MaxTokens      int      `json:"max_tokens"`
	Sampled        bool     `json:"sampled"`
	StreamInterval int      `json:"stream_interval"`
	TokenInterval  string   `json:"token_interval"`
	WallS          float64  `json:"wall_s"`
	Results        []Result `json:"results"`
	Goals          []Goal   `json:"goals"`
}

// Goal is the goal for the guard, checked.
type Goal struct {
	What     string `json:"what"`
	Met      bool   `json:"met"`
	Measured string `json:"measured"`
}

// Result is one (scenario, front).
type Result struct {
	Scenario string  `json:"scenario"`
	Front    string  `json:"front"`
	Seconds  float64 `json:"seconds"`
	Readies  int     `json:"vllm_readies"`
	// Deaths are what each of the scenario's deaths touched; Total every
	// request of the run (those no death touched included).
	Deaths []Counts `json:"deaths"`
	// LaterDeaths: vLLM died again after the scenario's deaths, while the
	// load settled (vLLM direct with a leak keeps dying).
	LaterDeaths int    `json:"later_deaths,omitempty"`
	Total       Counts `json:"total"`
	BaselineMs  int64  `json:"untouched_p50_ms"`
	Error       string `json:"error,omitempty"`
	// Examples: a few requests that went wrong, for the reader.
	Examples []string `json:"examples,omitempty"`
}

// Counts are what a death (or a whole run) did to requests.
type Counts struct {
	Requests int `json:"requests"`
	Failed   int `json:"failed"`      // no answer, or a status other than 200
	Cut      int `json:"streams_cut"` // 200, but no data: [DONE], or an error event
	Repeated int `json:"tokens_repeated"`
	Missing  int `json:"tokens_missing"` // in streams that ended with [DONE] and no error
	// Inconsistent (sampled runs): whole answers whose text is not their
	// ids detokenized, with more ids than max_tokens, or whose usage or
	// finish_reason does not match their ids.
	Inconsistent   int   `json:"answers_inconsistent"`
	AddedP50Ms     int64 `json:"added_latency_p50_ms"`
	AddedP99Ms     int64 `json:"added_latency_p99_ms"`
	FailedStatuses []int `json:"failed_statuses,omitempty"`
}

type verdict struct {
	failed, cut       bool
	repeated, missing int
	inconsistent      string // why, for a sampled answer
	dur               time.Duration
}

func judge(r record, ref oracle) verdict {
	v := verdict{dur: r.end.Sub(r.start)}
	if r.status != http.StatusOK {
		v.failed = true
		return v
	}
	v.cut = !r.done || r.errEvent || r.err != ""
	if sampled {
		if !v.cut {
			v.inconsistent = ref.consistent(r)
		}
		return v
	}
	c := compareTokens(r.text, ref.answers[r.req], v.cut)
	v.repeated = c.Repeated
	if !v.cut {
		v.missing = c.Missing
	}
	return v
}

// analyse attributes the records to the deaths and counts.
func analyse(res *Result, recs []record, deaths []time.Time, want int, ref oracle) {
	if len(deaths) > want {
		res.LaterDeaths = len(deaths) - want
		deaths = deaths[:want]
	}
	touchedBy := func(r record, d time.Time) bool { return r.start.Before(d) && r.end.After(d.Add(-touchWindow)) }
	var untouched []time.Duration
	vs := make([]verdict, len(recs))
	for i, r := range recs {
		vs[i] = judge(r, ref)
		touched := false
		for _, d := range deaths {
			touched = touched || touchedBy(r, d)
		}
		if !touched && !vs[i].failed && !vs[i].cut {
			untouched = append(untouched, vs[i].dur)
		}
	}
	base := percentile(untouched, 50)
	res.BaselineMs = base.Milliseconds()
	// after: only requests that ended after it count in the added latency
	// (a touched request that ended just before vLLM's exit was not
	// delayed by the death).
	count := func(in func(record) bool, after time.Time) Counts {
		var c Counts
		var added []time.Duration
		for i, r := range recs {
			if !in(r) {
				continue
			}
			v := vs[i]
			c.Requests++
			switch {
			case v.failed:
				c.Failed++
				if !slices.Contains(c.FailedStatuses, r.status) {
					c.FailedStatuses = append(c.FailedStatuses, r.status)
				}
			case v.cut:
				c.Cut++
			case r.end.After(after):
				added = append(added, v.dur-base)
			}
			c.Repeated += v.repeated
			c.Missing += v.missing
			if v.inconsistent != "" {
				c.Inconsistent++
			}
		}
		c.AddedP50Ms = percentile(added, 50).Milliseconds()
		c.AddedP99Ms = percentile(added, 99).Milliseconds()
		return c
	}
	for _, d := range deaths {
		res.Deaths = append(res.Deaths, count(func(r record) bool { return touchedBy(r, d) }, d))
	}
	res.Total = count(func(record) bool { return true }, time.Time{})
	for i, r := range recs {
		if len(res.Examples) == 3 {
			break
		}
		v := vs[i]
		if v.failed || v.cut || v.repeated > 0 || v.missing > 0 || v.inconsistent != "" {
			res.Examples = append(res.Examples, fmt.Sprintf("%s: status %d, [DONE] %v, error event %v, err %q, %d repeated, %d missing, inconsistent %q; got %q, want %q",
				r.req.path(), r.status, r.done, r.errEvent, r.err, v.repeated, v.missing, v.inconsistent, r.text, ref.answers[r.req]))
		}
	}
}

// percentile is the p-th percentile (nearest rank) of ds, 0 when empty.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

func goals(rs []Result) []Goal {
	var gs []Goal
	for _, r := range rs {
		if r.Front != "guard" {
			continue
		}
		g := Goal{What: r.Scenario + ", the guard: 0 requests failed, 0 streams cut, 0 tokens repeated or missing, 0 answers inconsistent"}
		t := r.Total
		g.Met = r.Error == "" && t.Failed == 0 && t.Cut == 0 && t.Repeated == 0 && t.Missing == 0 && t.Inconsistent == 0
		g.Measured = fmt.Sprintf("%d requests (%d deaths): %d failed, %d cut, %d tokens repeated, %d missing, %d inconsistent",
			t.Requests, len(r.Deaths), t.Failed, t.Cut, t.Repeated, t.Missing, t.Inconsistent)
		if r.Error != "" {
			g.Measured += "; " + r.Error
		}
		gs = append(gs, g)
	}
	return gs
}

func (rep Report) markdown(w io.Writer) {
	kind, check := "greedy", "tokens checked against each request's uninterrupted answer"
	if rep.Sampled {
		kind, check = "sampled", "each whole answer checked for consistency: its text the detokenized ids, at most max_tokens, usage and finish_reason true"
	}
	fmt.Fprintf(w, "%d concurrent %s streams (completions and chat in turn, %d tokens each, one per %s, %d ids a chunk); %s.\n\n",
		rep.Clients, kind, rep.MaxTokens, rep.TokenInterval, max(rep.StreamInterval, 1), check)
	fmt.Fprintln(w, "| scenario | front | death | requests touched | failed | streams cut | tokens repeated | tokens missing | answers inconsistent | added latency p50 / p99 |")
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rep.Results {
		if r.Error != "" && len(r.Deaths) == 0 {
			fmt.Fprintf(w, "| %s | %s | — | error: %s | | | | | | |\n", r.Scenario, r.Front, r.Error)
			continue
		}
		for i, c := range r.Deaths {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %s |\n", r.Scenario, r.Front, i+1, c.Requests, c.Failed, c.Cut, c.Repeated, c.Missing, c.Inconsistent, latency(c))
		}
		t := r.Total
		fmt.Fprintf(w, "| %s | %s | whole run (%.0f s%s) | %d | %d | %d | %d | %d | %d | |\n", r.Scenario, r.Front, r.Seconds, later(r), t.Requests, t.Failed, t.Cut, t.Repeated, t.Missing, t.Inconsistent)
	}
	fmt.Fprintf(w, "\nRun on %s, `%s`, wall time %.0f s.\n\n", rep.Date, rep.Command, rep.WallS)
	for _, g := range rep.Goals {
		mark := "met"
		if !g.Met {
			mark = "MISSED"
		}
		fmt.Fprintf(w, "- %s: **%s** (%s)\n", g.What, mark, g.Measured)
	}
}

func latency(c Counts) string {
	if c.AddedP50Ms == 0 && c.AddedP99Ms == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f s / %.2f s", float64(c.AddedP50Ms)/1000, float64(c.AddedP99Ms)/1000)
}

func later(r Result) string {
	if r.LaterDeaths == 0 {
		return ""
	}
	return fmt.Sprintf(", %d more deaths", r.LaterDeaths)
}
