package heart

import (
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// applyStatus is what the effects make of st, and what they published.
func applyStatus(st status.Status, fx []Effect) (status.Status, []FxPublish) {
	var pub []FxPublish
	for _, f := range fx {
		switch f := f.(type) {
		case FxStatus:
			f.Set(&st)
		case FxPublish:
			pub = append(pub, f)
		}
	}
	return st, pub
}

// A load phase's progress bar is kept in the run's data, shown in the
// status and published while its phase lasts; a phase without one shows
// none; at ready each phase's time goes with FxReady.
func TestLoadProgressIsKeptShownAndPublished(t *testing.T) {
	c := Core{Cfg: testConfig(), Sub: SubStarting, RunN: 1, R: Run{PID: 7, StartedAt: testTime}}
	st := status.Status{State: status.StateStarting}
	bar := status.LoadProgress{Phase: "weights", Unit: "shards", Done: 2, Total: 3, Percent: 67}
	step := func(at time.Duration, ph string, p status.LoadProgress) []FxPublish {
		var fx []Effect
		c, fx = Step(c, Event{Kind: EvProgress, Run: 1, At: testTime.Add(at), Pump: PumpFacts{Phase: ph, Progress: p}})
		var pub []FxPublish
		st, pub = applyStatus(st, fx)
		return pub
	}
	step(time.Second, "weights", status.LoadProgress{})
	if st.Progress != nil || st.Reason != "loading: weights" {
		t.Fatalf("no bar yet: %+v %q", st.Progress, st.Reason)
	}
	pub := step(20*time.Second, "weights", bar)
	if st.Progress == nil || *st.Progress != bar || st.Reason != "loading: weights 2/3 shards (67%)" || c.R.Progress != bar {
		t.Fatalf("2/3: status %+v %q, run %+v", st.Progress, st.Reason, c.R.Progress)
	}
	if len(pub) != 1 || pub[0].E.Progress == nil || *pub[0].E.Progress != bar {
		t.Fatalf("2/3 not published: %+v", pub)
	}
	// The weights' bar stays the pump's last, but the phase moved on.
	step(30*time.Second, "compile", bar)
	if st.Progress != nil || st.Phase != "compile" || c.R.Progress.Total != 0 {
		t.Fatalf("compile: %+v %q %+v", st.Progress, st.Phase, c.R.Progress)
	}
	c.Now = testTime.Add(41 * time.Second)
	want := []PhaseTime{{"weights", 29 * time.Second}, {"compile", 11 * time.Second}}
	got := c.PhaseTimes()
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("phase times %+v, want %+v", got, want)
	}
	// Leaving starting, the load's progress and expectation go.
	st.Progress, st.Expected = &bar, &status.Expected{TimeToReady: time.Minute}
	c.Enter(SubStopTerm, "stop", nil)
	st, _ = applyStatus(st, c.Fx)
	if st.Progress != nil || st.Expected != nil {
		t.Fatalf("stopping still shows the load: %+v %+v", st.Progress, st.Expected)
	}
}
