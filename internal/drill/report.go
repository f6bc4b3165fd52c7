package drill

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Verdicts.
const (
	VerdictPass = "PASS"
	VerdictFail = "FAIL"
)

// Report is the drill's result: the table on stdout and --json.
type Report struct {
	URL          string    `json:"url"`
	Model        string    `json:"model"`
	API          string    `json:"api"` // completions | chat
	Stream       bool      `json:"stream"`
	Concurrency  int       `json:"concurrency"`
	PromptTokens int       `json:"prompt_tokens"`
	MaxTokens    int       `json:"max_tokens"`
	Start        time.Time `json:"start"`
	Seconds      float64   `json:"seconds"`

	Requests  int                `json:"requests"`
	Outcomes  map[Outcome]int    `json:"outcomes"`
	Examples  map[Outcome]string `json:"examples,omitempty"` // one detail per failed outcome
	LatencyMS Percentiles        `json:"latency_ms"`         // requests that ended ok
	TTFTMS    Percentiles        `json:"ttft_ms"`            // time to the first token (non-streaming: to the answer's headers)
	Queued    int                `json:"queued"`             // answers the guard's proxy held in its queue first
	Admission bool               `json:"admission_engaged"`
	Guard     *GuardReport       `json:"guard,omitempty"` // nil without --socket
	OOMs      *int               `json:"ooms"`            // null: unknown (no guard to ask)
	Verdict   string             `json:"verdict"`
	Reasons   []string           `json:"reasons"`
}

// Percentiles in milliseconds; zero when there was nothing to measure.
type Percentiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	slices.Sort(ms)
	rank := func(q float64) float64 { return ms[max(0, int(math.Ceil(q*float64(len(ms))))-1)] }
	return Percentiles{Count: len(ms), P50: rank(0.50), P99: rank(0.99), Max: ms[len(ms)-1]}
}

// failed outcomes count against a drill without a guard.
var failed = []Outcome{Outcome503, Outcome5xx, OutcomeConnError, OutcomeStreamCut}

func buildReport(o Options, start, end time.Time, results []result, g *guardWatch) *Report {
	r := &Report{
		URL: o.URL, Model: o.Model, API: "completions", Stream: o.Stream, Concurrency: o.Concurrency,
		PromptTokens: o.PromptTokens, MaxTokens: o.MaxTokens, Start: start, Seconds: end.Sub(start).Seconds(),
		Requests: len(results), Outcomes: map[Outcome]int{}, Examples: map[Outcome]string{}, Reasons: []string{},
	}
	if o.Chat {
		r.API = "chat"
	}
	for _, oc := range Outcomes {
		r.Outcomes[oc] = 0
	}
	var lat, ttft []time.Duration
	for _, x := range results {
		r.Outcomes[x.outcome]++
		if x.queued {
			r.Queued++
		}
		if x.outcome == OutcomeOK {
			lat = append(lat, x.latency)
			if x.ttft > 0 {
				ttft = append(ttft, x.ttft)
			}
		} else if _, ok := r.Examples[x.outcome]; !ok && x.detail != "" {
			r.Examples[x.outcome] = truncate(x.detail, 300)
		}
	}
	r.LatencyMS, r.TTFTMS = percentiles(lat), percentiles(ttft)
	r.Admission = r.Outcomes[Outcome429] > 0 || r.Queued > 0
	if g != nil {
		r.Guard = g.report()
	}
	r.judge()
	return r
}

// judge sets the verdict: with the guard's status, PASS when no OOM
// happened or every OOM was preceded by an alert; without it, PASS when no
// request failed with a 5xx, a connection error or a cut stream.
func (r *Report) judge() {
	fail := func(format string, args ...any) {
		r.Verdict = VerdictFail
		r.Reasons = append(r.Reasons, fmt.Sprintf(format, args...))
	}
	r.Verdict = VerdictPass
	if r.Outcomes[OutcomeOK] == 0 {
		fail("no request succeeded (of %d)", r.Requests)
	}
	if r.Guard != nil && r.Guard.Samples > 0 {
		n := len(r.Guard.OOMs)
		r.OOMs = &n
		unwarned := 0
		for _, o := range r.Guard.OOMs {
			if o.Alert == "" {
				unwarned++
			}
		}
		switch {
		case unwarned > 0:
			fail("%d of %d OOMs came without a memory alert before them", unwarned, n)
		case n > 0:
			r.Reasons = append(r.Reasons, fmt.Sprintf("%d OOMs, each preceded by an alert", n))
		default:
			r.Reasons = append(r.Reasons, "no OOM")
		}
		return
	}
	if r.Guard != nil {
		r.Reasons = append(r.Reasons, "the guard's status could not be read ("+r.Guard.LastSampleError+"): judged on request errors only")
	}
	bad := 0
	var kinds []string
	for _, oc := range failed {
		if n := r.Outcomes[oc]; n > 0 {
			bad += n
			kinds = append(kinds, fmt.Sprintf("%d %s", n, oc))
		}
	}
	if bad > 0 {
		fail("%d requests failed (%s); OOMs unknown without --socket", bad, strings.Join(kinds, ", "))
	} else if r.Verdict == VerdictPass {
		r.Reasons = append(r.Reasons, "no request failed with a 5xx, a connection error or a cut stream; OOMs unknown without --socket")
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// WriteTable prints the report for a person.
func WriteTable(w io.Writer, r *Report) {
	mode := "non-streaming"
	if r.Stream {
		mode = "streaming"
	}
	fmt.Fprintf(w, "vllm-guard drill: %s (model %s), %s %s, %d concurrent, prompt ≈%d tokens, max_tokens %d, %.1f s\n\n",
		r.URL, r.Model, r.API, mode, r.Concurrency, r.PromptTokens, r.MaxTokens, r.Seconds)
	fmt.Fprintf(w, "%-18s %8s %7s\n", "outcome", "requests", "share")
	for _, oc := range Outcomes {
		n := r.Outcomes[oc]
		if n == 0 && oc != OutcomeOK {
			continue
		}
		share := 0.0
		if r.Requests > 0 {
			share = 100 * float64(n) / float64(r.Requests)
		}
		fmt.Fprintf(w, "%-18s %8d %6.1f%%\n", oc, n, share)
	}
	fmt.Fprintf(w, "%-18s %8d\n\n", "total", r.Requests)
	fmt.Fprintf(w, "%-18s p50 %9.1f ms   p99 %9.1f ms\n", "latency (ok)", r.LatencyMS.P50, r.LatencyMS.P99)
	fmt.Fprintf(w, "%-18s p50 %9.1f ms   p99 %9.1f ms\n", "first token", r.TTFTMS.P50, r.TTFTMS.P99)
	adm := "not engaged"
	if r.Admission {
		adm = fmt.Sprintf("engaged: %d answered 429, %d queued first", r.Outcomes[Outcome429], r.Queued)
	}
	fmt.Fprintf(w, "%-18s %s\n", "admission control", adm)
	if g := r.Guard; g != nil {
		fmt.Fprintf(w, "%-18s %d samples (%d failed), states %s\n", "guard", g.Samples, g.SampleErrors, strings.Join(g.States, " → "))
		fmt.Fprintf(w, "%-18s %.1f %%\n", "peak GPU memory", 100*g.PeakGPUFraction)
		if len(g.Alerts) == 0 {
			fmt.Fprintf(w, "%-18s none\n", "alerts")
		}
		for i, a := range g.Alerts {
			label := ""
			if i == 0 {
				label = "alerts"
			}
			lead := "no OOM after it"
			if a.LeadSeconds != nil {
				lead = fmt.Sprintf("%.1f s before the OOM", *a.LeadSeconds)
			}
			fmt.Fprintf(w, "%-18s %-20s at %s, %s\n", label, a.Name, a.Since.Format("15:04:05.000"), lead)
		}
	}
	if r.OOMs == nil {
		fmt.Fprintf(w, "%-18s unknown (no --socket: the guard was not asked)\n", "OOMs")
	} else {
		fmt.Fprintf(w, "%-18s %d\n", "OOMs", *r.OOMs)
		for _, o := range r.Guard.OOMs {
			warn := "NO ALERT BEFORE IT"
			if o.Alert != "" {
				warn = fmt.Sprintf("warned by %s %.1f s before", o.Alert, *o.LeadSeconds)
			}
			fmt.Fprintf(w, "%-18s at %s, %s\n", "", o.Time.Format("15:04:05.000"), warn)
		}
	}
	for _, oc := range Outcomes {
		if ex, ok := r.Examples[oc]; ok {
			fmt.Fprintf(w, "%-18s %s: %s\n", "example", oc, ex)
		}
	}
	fmt.Fprintf(w, "\nverdict: %s — %s\n", r.Verdict, strings.Join(r.Reasons, "; "))
}
