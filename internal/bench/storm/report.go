package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Result is one row of the table: a scenario under a supervisor, every
// time in scenario seconds.
type Result struct {
	Scenario            string   `json:"scenario"`
	Supervisor          string   `json:"supervisor"`
	Starts              int      `json:"starts"`
	OOMs                int      `json:"ooms"`
	Kills               int      `json:"kills"`
	FirstStableReadyS   *float64 `json:"first_stable_ready_s"` // null: never stable
	Availability        float64  `json:"availability"`         // after the nominal load, 0..1
	Requests            int      `json:"requests"`
	RequestsFailed      int      `json:"requests_failed"`
	OrphansAtEnd        int      `json:"orphans_at_end"`
	OrphanGiBAtEnd      float64  `json:"orphan_gib_at_end"`
	HeldAtStartGiB      float64  `json:"held_at_start_gib"` // most GPU memory others held while a start ran
	FinalState          string   `json:"final_state"`
	MaxNumSeqs          int      `json:"max_num_seqs"`           // in force at the end
	TrueSafeMaxNumSeqs  int      `json:"true_safe_max_num_seqs"` // the simulator's truth at the end, 0 unknown
	ConcurrencyRetained *float64 `json:"concurrency_retained"`   // max_num_seqs / true safe max; null unknown
	HalvingRetained     *float64 `json:"halving_retained"`       // the same for the halving ladder alone after as many OOMs (guard rows)
	OOMPredictedLeadS   *float64 `json:"oom_predicted_lead_s"`   // shortest lead of oom_predicted before an OOM; -1 an OOM had none; null no OOM
	ScenarioS           float64  `json:"scenario_s"`
}

// Report is the whole benchmark: what bench/storm/results.json holds.
type Report struct {
	Date      string     `json:"date"`
	Command   string     `json:"command"`
	Scale     float64    `json:"scale"`
	Scenarios []Scenario `json:"-"`
	Results   []Result   `json:"results"`
	Goals     []Goal     `json:"goals"`
	WallS     float64    `json:"wall_s"`
}

func gib(b int64) float64 { return math.Round(float64(b)/(1<<30)*10) / 10 }

func ptr(v float64) *float64 { return &v }

// summarize turns a run's record into its row. measured is how long the
// run ran (real), length the scenario's full length (real).
func summarize(sc Scenario, sup string, s Scale, rec record, e end, measured, length time.Duration) Result {
	secs := func(d time.Duration) float64 { return math.Round(s.Back(d).Seconds()) }
	res := Result{Scenario: sc.Name, Supervisor: sup, Starts: len(rec.starts), OOMs: len(rec.ooms), Kills: rec.kills,
		Requests: rec.reqs, RequestsFailed: rec.reqFailed, OrphansAtEnd: e.orphans, OrphanGiBAtEnd: gib(e.orphanGPU),
		HeldAtStartGiB: gib(rec.heldAtStart), MaxNumSeqs: rec.maxNumSeqs, ScenarioS: secs(length)}
	// A supervisor that stopped for good early stays down for the rest.
	res.Availability = math.Round(availability(rec.samples, s.D(sc.Load), measured, length)*1000) / 1000
	if at, ok := firstStable(rec.samples, s.D(stableFor), measured); ok {
		res.FirstStableReadyS = ptr(secs(at))
	}
	switch {
	case e.serving:
		res.FinalState = "serving"
	case rec.terminal != "":
		res.FinalState = rec.terminal
	case len(rec.starts) >= 3:
		res.FinalState = "storming"
		if rec.phase == "CrashLoopBackOff" || rec.phase == "BACKOFF" {
			res.FinalState += " (" + rec.phase + ")"
		}
	default:
		res.FinalState = "starting"
	}
	if e.serving && e.sawMetrics && e.safeMax > 0 {
		// The truth at the margin the guard keeps: the simulator's safe
		// maximum (which fills the device) less the sequences that fit in
		// [profile] headroom × total.
		safe := e.safeMax
		if e.seqCost > 0 {
			safe = max(0, e.safeMax-int(math.Ceil(guardHeadroom*deviceTotal/float64(e.seqCost))))
		}
		if safe > 0 {
			res.TrueSafeMaxNumSeqs = safe
			res.ConcurrencyRetained = ptr(math.Round(float64(rec.maxNumSeqs)/float64(safe)*100) / 100)
			if sup == supGuard {
				// What the halving ladder alone would run after as many OOMs.
				halving := baseMaxNumSeqs
				for range len(rec.ooms) {
					halving = max(halving/2, 16)
				}
				res.HalvingRetained = ptr(math.Round(float64(min(halving, baseMaxNumSeqs))/float64(safe)*100) / 100)
			}
		}
	}
	if sup == supGuard && len(rec.ooms) > 0 {
		shortest := math.Inf(1)
		for _, l := range alertLeads(rec.starts, rec.alerts, rec.ooms) {
			v := -1.0
			if l >= 0 {
				v = secs(l)
			}
			shortest = min(shortest, v)
		}
		res.OOMPredictedLeadS = ptr(shortest)
	}
	return res
}

// Goal is one of issue 7's goals, checked against the table.
type Goal struct {
	Scenario string `json:"scenario"`
	Goal     string `json:"goal"`
	Met      bool   `json:"met"`
	Detail   string `json:"detail"`
}

func find(rs []Result, scenario, sup string) (Result, bool) {
	for _, r := range rs {
		if r.Scenario == scenario && r.Supervisor == sup {
			return r, true
		}
	}
	return Result{}, false
}

// goals checks issue 7's goals for the guard (and the baselines' contrast).
func goals(rs []Result) []Goal {
	var out []Goal
	add := func(sc, goal string, met bool, detail string) {
		out = append(out, Goal{Scenario: sc, Goal: goal, Met: met, Detail: detail})
	}
	baselines := supervisors[1:]
	if g, ok := find(rs, "oversubscription", supGuard); ok {
		add(g.Scenario, "guard: 1 OOM, then stable, availability >= 90 %",
			g.OOMs == 1 && g.FinalState == "serving" && g.FirstStableReadyS != nil && g.Availability >= 0.9,
			fmt.Sprintf("%d OOM, %s, availability %s", g.OOMs, g.FinalState, pct(g.Availability)))
		var worse []string
		for _, b := range baselines {
			if r, ok := find(rs, g.Scenario, b); ok && (r.OOMs > 1 || r.FinalState != "serving") {
				worse = append(worse, fmt.Sprintf("%s %d OOM %s", b, r.OOMs, r.FinalState))
			}
		}
		add(g.Scenario, "baselines keep OOMing or stay down", len(worse) == len(baselines), strings.Join(worse, "; "))
		if g.ConcurrencyRetained != nil {
			detail := fmt.Sprintf("%d of a true safe %d", g.MaxNumSeqs, g.TrueSafeMaxNumSeqs)
			if g.HalvingRetained != nil {
				detail += fmt.Sprintf("; the halving ladder alone: %s", pct(*g.HalvingRetained))
			}
			add(g.Scenario, "guard: concurrency retained >= 90 % of the true safe maximum", *g.ConcurrencyRetained >= 0.9, detail)
		}
	}
	if g, ok := find(rs, "slow-load", supGuard); ok {
		add(g.Scenario, "guard: 0 kills, serving", g.Kills == 0 && g.FinalState == "serving",
			fmt.Sprintf("%d kills, %s", g.Kills, g.FinalState))
	}
	if k, ok := find(rs, "slow-load", supKubelet); ok {
		add(k.Scenario, "kubelet: CrashLoopBackOff, never ready", strings.HasPrefix(k.FinalState, "storming") && k.FirstStableReadyS == nil,
			fmt.Sprintf("%d starts, %d kills, %s", k.Starts, k.Kills, k.FinalState))
	}
	if g, ok := find(rs, "orphan", supGuard); ok {
		add(g.Scenario, "guard: 0 GiB held by others at its next start, 0 orphans",
			g.HeldAtStartGiB == 0 && g.OrphansAtEnd == 0 && g.Starts >= 2,
			fmt.Sprintf("%.1f GiB held at a start, %d starts, %d orphans", g.HeldAtStartGiB, g.Starts, g.OrphansAtEnd))
	}
	if g, ok := find(rs, "leak", supGuard); ok {
		met := g.OOMPredictedLeadS != nil && *g.OOMPredictedLeadS >= 60
		detail := "no OOM happened"
		if g.OOMPredictedLeadS != nil {
			detail = fmt.Sprintf("shortest oom_predicted lead %s over %d OOM", leadText(g.OOMPredictedLeadS), g.OOMs)
		}
		add(g.Scenario, "guard: oom_predicted >= 60 s before each OOM", met, detail)
	}
	if g, ok := find(rs, "bad-flag", supGuard); ok {
		add(g.Scenario, "guard: exit 78 after 1 start", g.FinalState == "gave up (exit 78)" && g.Starts == 1,
			fmt.Sprintf("%d start, %s", g.Starts, g.FinalState))
		var retried []string
		for _, b := range baselines {
			if r, ok := find(rs, g.Scenario, b); ok && r.Starts > 1 {
				retried = append(retried, fmt.Sprintf("%s %d starts", b, r.Starts))
			}
		}
		add(g.Scenario, "baselines retry", len(retried) == len(baselines), strings.Join(retried, "; "))
	}
	return out
}

func pct(f float64) string { return fmt.Sprintf("%.1f %%", f*100) }

func secsText(p *float64) string {
	if p == nil {
		return "never"
	}
	return (time.Duration(*p) * time.Second).String()
}

func leadText(p *float64) string {
	switch {
	case p == nil:
		return "n/a"
	case *p < 0:
		return "none"
	}
	return (time.Duration(*p) * time.Second).String()
}

// markdown writes the report as docs/measured.md shows it.
func (rep Report) markdown(w io.Writer) {
	fmt.Fprintf(w, "## Restart storms: the same failing vLLM under each supervisor\n\n")
	fmt.Fprintf(w, "Date: %s. Command: `%s`. Scale %g: one scenario minute runs in %s here; every time below is in scenario time. Wall time %.0f s.\n\n",
		rep.Date, rep.Command, rep.Scale, Scale(rep.Scale).D(time.Minute), rep.WallS)
	for _, sc := range rep.Scenarios {
		fmt.Fprintf(w, "- **%s** (%s): %s\n", sc.Name, sc.Length, sc.Title)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | supervisor | starts | OOMs | kills | first stable ready | availability | failed requests | orphans at end | GiB held by orphans | GiB held by others at a start | final state | concurrency retained | oom_predicted lead |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|")
	for _, r := range rep.Results {
		conc := "n/a"
		if r.ConcurrencyRetained != nil {
			conc = fmt.Sprintf("%.0f %% (%d/%d)", *r.ConcurrencyRetained*100, r.MaxNumSeqs, r.TrueSafeMaxNumSeqs)
			if r.HalvingRetained != nil {
				conc += fmt.Sprintf("; halving: %.0f %%", *r.HalvingRetained*100)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %s | %s | %d / %d | %d | %.1f | %.1f | %s | %s | %s |\n",
			r.Scenario, r.Supervisor, r.Starts, r.OOMs, r.Kills, secsText(r.FirstStableReadyS), pct(r.Availability),
			r.RequestsFailed, r.Requests, r.OrphansAtEnd, r.OrphanGiBAtEnd, r.HeldAtStartGiB, r.FinalState, conc, leadText(r.OOMPredictedLeadS))
	}
	if len(rep.Goals) > 0 {
		fmt.Fprintln(w, "\nGoals (issue 7):")
		fmt.Fprintln(w)
		for _, g := range rep.Goals {
			mark := "MET"
			if !g.Met {
				mark = "NOT MET"
			}
			fmt.Fprintf(w, "- %s, %s: **%s** (%s)\n", g.Scenario, g.Goal, mark, g.Detail)
		}
	}
}

// json writes the report as results.json.
func (rep Report) json(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// order sorts the rows: scenarios as listed, supervisors as listed.
func order(rs []Result, scs []Scenario) {
	idx := func(list []string, v string) int { return slices.Index(list, v) }
	names := make([]string, len(scs))
	for i, sc := range scs {
		names[i] = sc.Name
	}
	slices.SortStableFunc(rs, func(a, b Result) int {
		if d := idx(names, a.Scenario) - idx(names, b.Scenario); d != 0 {
			return d
		}
		return idx(supervisors, a.Supervisor) - idx(supervisors, b.Supervisor)
	})
}
