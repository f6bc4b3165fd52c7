package gpumon

import (
	"strings"
	"testing"
	"time"
)

var testAlertCfg = alertConfig{warn: 0.90, critical: 0.97, horizon: 10 * time.Minute}

type step struct {
	f     float64
	tr    trendResult
	quiet bool
}

func steady() trendResult { return trendResult{trend: TrendSteady, stc: -1} }
func climb(stc float64) trendResult {
	return trendResult{trend: TrendClimbing, slope: 1 << 20, stc: stc}
}

// run feeds steps and returns the events as "name+" (raised) / "name-" (cleared).
func run(steps []step) []string {
	var s alertState
	var out []string
	for i, st := range steps {
		for _, a := range s.update(testAlertCfg, 0, st.f, st.tr, st.quiet, t0.Add(time.Duration(i)*time.Second)) {
			sign := "-"
			if a.Active {
				sign = "+"
			}
			out = append(out, a.Name+sign)
		}
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAlertWarnHysteresis(t *testing.T) {
	steps := []step{
		{f: 0.85, tr: steady()},
		{f: 0.90, tr: steady()}, // raise
		{f: 0.895, tr: steady()},
		{f: 0.905, tr: steady()}, // hovering: no second raise
		{f: 0.881, tr: steady()}, // above 0.88: stays raised
		{f: 0.87, tr: steady()},  // clear
		{f: 0.89, tr: steady()},
		{f: 0.91, tr: steady()}, // a new episode
	}
	want := []string{"gpu_memory_warn+", "gpu_memory_warn-", "gpu_memory_warn+"}
	if got := run(steps); !equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestAlertCritical(t *testing.T) {
	steps := []step{
		{f: 0.98, tr: steady()}, // both at once
		{f: 0.96, tr: steady()},
		{f: 0.94, tr: steady()}, // critical clears below 0.95
		{f: 0.50, tr: steady()},
	}
	want := []string{"gpu_memory_warn+", "gpu_memory_critical+", "gpu_memory_critical-", "gpu_memory_warn-"}
	if got := run(steps); !equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestAlertPredicted(t *testing.T) {
	steps := []step{
		{f: 0.50, tr: climb(1200)}, // climbing, but critical beyond the horizon
		{f: 0.60, tr: climb(500)},  // raise
		{f: 0.61, tr: climb(300)},
		{f: 0.61, tr: steady()}, // one calm sample is not enough to clear
		{f: 0.62, tr: climb(280)},
		{f: 0.62, tr: steady()},
		{f: 0.62, tr: steady()},
		{f: 0.62, tr: steady()}, // three in a row: clear
		{f: 0.62, tr: steady()},
		{f: 0.70, tr: climb(100)},  // new episode
		{f: 0.70, tr: climb(1300)}, // beyond 2× horizon: clear at once
	}
	want := []string{"oom_predicted+", "oom_predicted-", "oom_predicted+", "oom_predicted-"}
	if got := run(steps); !equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestAlertPredictedQuietWhileLoading(t *testing.T) {
	steps := []step{
		{f: 0.50, tr: climb(30), quiet: true},
		{f: 0.70, tr: climb(20), quiet: true},
		{f: 0.85, tr: climb(10)}, // loading over, still climbing: raise now
	}
	want := []string{"oom_predicted+"}
	if got := run(steps); !equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestAlertActiveAndMessage(t *testing.T) {
	var s alertState
	evs := s.update(testAlertCfg, 3, 0.95, climb(120), false, t0)
	if len(evs) != 2 {
		t.Fatalf("want warn and oom_predicted, got %+v", evs)
	}
	act := s.active()
	if len(act) != 2 || act[0].Name != AlertWarn || act[1].Name != AlertPredicted {
		t.Fatalf("active = %+v", act)
	}
	if act[1].Device != 3 || act[1].SecondsToCritical != 120 || !act[1].At.Equal(t0) {
		t.Fatalf("active oom_predicted = %+v", act[1])
	}
	if want := "GPU 3 memory at 95.0% (warn at 90.0%)"; evs[0].Message != want {
		t.Fatalf("message %q, want %q", evs[0].Message, want)
	}
	if want := "critical (97.0%) in 2m0s"; !strings.Contains(evs[1].Message, want) {
		t.Fatalf("message %q lacks %q", evs[1].Message, want)
	}
}
