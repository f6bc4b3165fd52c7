package supervisor

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// What vLLM needs running first (the weight cache daemon: BeforeLaunch)
// is waited for before every launch, however long it takes, and the loop
// keeps turning meanwhile (a stop is answered at once).
func TestMachineLaunchWaitsForWhatVLLMNeedsFirst(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		ready := make(chan struct{})
		waits := 0
		s.before = func(ctx context.Context) error {
			waits++
			select {
			case <-ready:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		s.start()
		s.advance(time.Hour)
		if s.l.n() != 0 || waits != 1 {
			t.Fatalf("%d launches, %d waits before the daemon is ready: want none, one", s.l.n(), waits)
		}
		close(ready)
		synctest.Wait()
		if s.l.n() != 1 {
			t.Fatalf("%d launches once the daemon is ready, want 1", s.l.n())
		}
		s.ready()
		s.l.last().end(exitInfo{Code: -1, Signal: "SIGKILL"})
		s.advance(time.Minute)
		if s.l.n() != 2 || waits != 2 {
			t.Fatalf("after vLLM's death: %d launches, %d waits; want the restart to wait again", s.l.n(), waits)
		}
		s.stop()
	})
}

// A restart the guard asks for itself (its weight cache daemon died) is a
// restart with its reason: vLLM stops as planned and starts again, no
// failure is counted, and the decision says why.
func TestMachineRestartForAReason(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		first := s.l.last()
		if err := s.sup.RestartFor(context.Background(), "its weight cache daemon died (exit code 247)"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if first.stops.Load() != 1 || s.l.n() != 2 {
			t.Fatalf("%d SIGTERMs, %d launches", first.stops.Load(), s.l.n())
		}
		s.ready()
		if st := s.sup.Status(); len(st.Restarts) != 0 || len(s.kinds(events.KindExited)) != 0 {
			t.Fatalf("counted as a failure: %+v", st)
		}
		d := s.kinds(events.KindDecision)
		if len(d) != 1 || d[0].Decision != events.DecisionRestart || d[0].Reason != "restarting vLLM: its weight cache daemon died (exit code 247)" {
			t.Fatalf("decisions %+v", d)
		}
		for _, e := range s.kinds(events.KindState) {
			if e.State == string(StateStopping) && !strings.HasPrefix(e.Reason, "restarting: its weight cache daemon died") {
				t.Fatalf("stopping for %q", e.Reason)
			}
		}
		s.stop()
	})
}
