package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestSummarizeScalesBackAndNamesTheFinalState(t *testing.T) {
	s := Scale(0.05)
	sc := Scenario{Name: "oversubscription", Load: time.Minute, Length: 20 * time.Minute}
	var ss []sample
	for at := time.Duration(0); at < s.D(sc.Length); at += 100 * ms {
		ss = append(ss, sample{at: at, ok: at >= s.D(time.Minute)})
	}
	rec := record{starts: []time.Duration{0, 5 * time.Second}, ooms: []time.Duration{4 * time.Second},
		alerts: []time.Duration{3 * time.Second}, samples: ss, reqs: 100, reqFailed: 7, maxNumSeqs: 128,
		heldAtStart: 3 << 30}
	res := summarize(sc, supGuard, s, rec, end{serving: true, safeMax: 256, sawMetrics: true}, s.D(sc.Length), s.D(sc.Length))
	if res.Starts != 2 || res.OOMs != 1 || res.Requests != 100 || res.RequestsFailed != 7 || res.HeldAtStartGiB != 3 {
		t.Fatalf("counts: %+v", res)
	}
	if res.FirstStableReadyS == nil || *res.FirstStableReadyS != 60 {
		t.Fatalf("first stable ready %v, want 60 s of scenario time", res.FirstStableReadyS)
	}
	if res.Availability < 0.99 || res.FinalState != "serving" {
		t.Fatalf("availability %v state %q", res.Availability, res.FinalState)
	}
	if res.ConcurrencyRetained == nil || *res.ConcurrencyRetained != 0.5 {
		t.Fatalf("concurrency retained %v, want 0.5 (128 of 256)", res.ConcurrencyRetained)
	}
	if res.OOMPredictedLeadS == nil || *res.OOMPredictedLeadS != 20 {
		t.Fatalf("lead %v, want 20 s (1 s real at 0.05)", res.OOMPredictedLeadS)
	}

	down := summarize(sc, supSystemd, s, record{starts: []time.Duration{0}, terminal: "down (code 0 is success for Restart=on-failure)"}, end{}, time.Second, s.D(sc.Length))
	if down.FinalState != "down (code 0 is success for Restart=on-failure)" || down.ConcurrencyRetained != nil || down.OOMPredictedLeadS != nil {
		t.Fatalf("down run: %+v", down)
	}
	storm := summarize(sc, supKubelet, s, record{starts: make([]time.Duration, 4), phase: "CrashLoopBackOff"}, end{}, time.Second, s.D(sc.Length))
	if storm.FinalState != "storming (CrashLoopBackOff)" {
		t.Fatalf("restarting run: %q", storm.FinalState)
	}
}

func TestGoalsAndTheTable(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	rs := []Result{
		{Scenario: "oversubscription", Supervisor: supGuard, Starts: 2, OOMs: 1, Availability: 0.93, FirstStableReadyS: f(214), FinalState: "serving", MaxNumSeqs: 128, TrueSafeMaxNumSeqs: 244, ConcurrencyRetained: f(0.52)},
		{Scenario: "oversubscription", Supervisor: supSystemd, Starts: 1, OOMs: 1, FinalState: "down (code 0 is success for Restart=on-failure)"},
		{Scenario: "oversubscription", Supervisor: supKubelet, Starts: 7, OOMs: 6, FinalState: "storming"},
		{Scenario: "leak", Supervisor: supGuard, Starts: 3, OOMs: 2, FinalState: "serving", OOMPredictedLeadS: f(-1)},
		{Scenario: "bad-flag", Supervisor: supGuard, Starts: 1, FinalState: "gave up (exit 78)"},
	}
	gs := goals(rs)
	met := map[string]bool{}
	for _, g := range gs {
		met[g.Scenario+": "+g.Goal] = g.Met
	}
	if !met["oversubscription: guard: 1 OOM, then stable, availability >= 90 %"] {
		t.Errorf("over-subscription goal not met: %+v", gs)
	}
	if met["oversubscription: baselines keep OOMing or stay down"] {
		t.Errorf("baselines goal met with two of four baselines measured: %+v", gs)
	}
	if met["leak: guard: oom_predicted >= 60 s before each OOM"] {
		t.Errorf("leak goal met though an OOM had no alert")
	}
	if !met["bad-flag: guard: exit 78 after 1 start"] {
		t.Errorf("bad-flag goal: %+v", gs)
	}

	rep := Report{Date: "2026-01-01 00:00 UTC", Command: "make bench-storm", Scale: 0.05, Results: rs, Goals: gs,
		Scenarios: []Scenario{{Name: "oversubscription", Title: "t", Length: 20 * time.Minute}}}
	var md bytes.Buffer
	rep.markdown(&md)
	out := md.String()
	for _, want := range []string{"make bench-storm", "Scale 0.05", "one scenario minute runs in 3s",
		"| oversubscription | vllm-guard | 2 | 1 | 0 | 3m34s | 93.0 % | 0 / 0 | 0 | 0.0 | 0.0 | serving | 52 % (128/244) | n/a |",
		"| leak | vllm-guard | 3 | 2 | 0 | never | 0.0 % | 0 / 0 | 0 | 0.0 | 0.0 | serving | n/a | none |",
		"**NOT MET**"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n| "); n != len(rs)+1 {
		t.Errorf("%d table lines, want header + %d rows", n, len(rs))
	}
	var js bytes.Buffer
	if err := rep.json(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Results) != len(rs) || back.Results[3].OOMPredictedLeadS == nil {
		t.Fatalf("JSON round trip: %v %+v", err, back)
	}
	if !strings.Contains(js.String(), `"first_stable_ready_s": null`) {
		t.Errorf("never-stable must be null in JSON:\n%s", js.String())
	}
}

func TestOrderFollowsScenarioAndSupervisorLists(t *testing.T) {
	scs := []Scenario{{Name: "b"}, {Name: "a"}}
	rs := []Result{{Scenario: "a", Supervisor: supGuard}, {Scenario: "b", Supervisor: supKubelet}, {Scenario: "b", Supervisor: supGuard}}
	order(rs, scs)
	if rs[0].Scenario != "b" || rs[0].Supervisor != supGuard || rs[1].Supervisor != supKubelet || rs[2].Scenario != "a" {
		t.Fatalf("order %+v", rs)
	}
}
