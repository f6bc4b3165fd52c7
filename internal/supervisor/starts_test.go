package supervisor

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

func (s *scenario) saveStarts(h starttimes.History) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.savedStarts = append(s.savedStarts, h)
	return nil
}

// While vLLM loads, the status carries the shard bar's progress and the
// time to ready expected from the earlier start; at ready both go, and
// the start (with its phases' times) is added to the record and saved.
func TestMachineLoadProgressAndExpectedTimeToReady(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.starts = starttimes.NewBook(starttimes.History{}.Add(starttimes.Start{Model: "m", Rung: 0, TimeToReady: 41 * time.Second}))
		s.start()
		st := s.sup.Status()
		if st.Expected == nil || st.Expected.TimeToReady != 41*time.Second || st.Expected.From != 1 ||
			st.Expected.Basis != "1 earlier start of this model on rung 0" {
			t.Fatalf("starting: expected %+v, want 41 s from 1 earlier start", st.Expected)
		}
		if left, ok := st.ReadyIn(st.StartedAt.Add(11 * time.Second)); !ok || left != 30*time.Second {
			t.Fatalf("ready in %s %v after 11 s, want 30 s", left, ok)
		}
		p := s.l.last()
		p.print("stderr:Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:41<00:20, 20.50s/it]")
		s.advance(time.Second)
		want := status.LoadProgress{Phase: "weights", Unit: "shards", Done: 2, Total: 3, Percent: 67}
		if st := s.sup.Status(); st.Progress == nil || *st.Progress != want || st.Reason != "loading: weights 2/3 shards (67%)" {
			t.Fatalf("after the bar: %+v %q", st.Progress, st.Reason)
		}
		var published bool
		for _, e := range s.kinds(events.KindProgress) {
			published = published || e.Progress != nil && *e.Progress == want
		}
		if !published {
			t.Fatal("the bar's progress was not published")
		}
		s.advance(9 * time.Second)
		s.ready()
		synctest.Wait()
		if st := s.sup.Status(); st.Progress != nil || st.Expected != nil {
			t.Fatalf("ready still shows the load: %+v %+v", st.Progress, st.Expected)
		}
		h := s.starts.History()
		if len(h.Starts) != 2 || h.Starts[1].Model != "m" || h.Starts[1].TimeToReady < 10*time.Second || len(h.Starts[1].Phases) == 0 {
			t.Fatalf("the record after ready: %+v", h)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if n := len(s.savedStarts); n != 1 || len(s.savedStarts[0].Starts) != 2 {
			t.Fatalf("saved %d times (%+v), want once with 2 starts", n, s.savedStarts)
		}
	})
}

// Before the first start of the model on its rung, none is expected.
func TestMachineNoExpectedTimeBeforeAStart(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.starts = starttimes.NewBook(starttimes.History{}.Add(starttimes.Start{Model: "other", TimeToReady: time.Second}))
		s.start()
		if st := s.sup.Status(); st.Expected == nil || st.Expected.From != 0 || st.Expected.Basis != "unknown: no earlier start of this model on rung 0 seen" {
			t.Fatalf("expected %+v with no earlier start of this model, want unknown", st.Expected)
		}
		if _, ok := s.sup.Status().ReadyIn(time.Now()); ok {
			t.Fatal("ReadyIn known with no earlier start")
		}
	})
}
