package metrics

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// The load's series exist only while known: progress while a phase
// reports one, the expected time while starting with an earlier start
// seen; none while ready, none before any start was seen.
func TestLoadSeriesAbsentWhenUnknown(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	st := status.Status{State: status.StateStarting, Phase: "weights", StartedAt: t0,
		Expected: &status.Expected{Basis: "unknown: no earlier start of this model on rung 0 seen"}}
	m := New(Sources{})
	m.Registry().MustRegister(LoadCollector{
		Status: func() status.Status { mu.Lock(); defer mu.Unlock(); return st },
		Now:    func() time.Time { return t0.Add(11 * time.Second) }})
	set := func(f func(*status.Status)) { mu.Lock(); f(&st); mu.Unlock() }
	has := func(body, s string) bool { return strings.Contains(body, "\n"+s) }

	body := scrape(t, m)
	for _, s := range []string{"vllm_guard_load_progress_ratio{", "vllm_guard_expected_seconds_to_ready ", "vllm_guard_expected_time_to_ready_seconds "} {
		if has(body, s) {
			t.Errorf("starting, no bar, no earlier start: %q present:\n%s", s, ours(body))
		}
	}

	set(func(st *status.Status) {
		st.Progress = &status.LoadProgress{Phase: "weights", Unit: "shards", Done: 1, Total: 4, Percent: 25}
		st.Expected = &status.Expected{TimeToReady: 52 * time.Second, From: 3}
	})
	body = scrape(t, m)
	for _, s := range []string{`vllm_guard_load_progress_ratio{phase="weights",unit="shards"} 0.25`, "vllm_guard_expected_seconds_to_ready 41", "vllm_guard_expected_time_to_ready_seconds 52"} {
		if !has(body, s+"\n") {
			t.Errorf("loading 1/4 shards, 52 s expected, 11 s in: %q absent:\n%s", s, ours(body))
		}
	}

	set(func(st *status.Status) { st.State = status.StateReady })
	body = scrape(t, m)
	for _, s := range []string{"vllm_guard_load_progress_ratio{", "vllm_guard_expected_seconds_to_ready ", "vllm_guard_expected_time_to_ready_seconds "} {
		if has(body, s) {
			t.Errorf("ready: %q present:\n%s", s, ours(body))
		}
	}
}
