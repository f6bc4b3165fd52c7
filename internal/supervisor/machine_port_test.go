package supervisor

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// Another process on vLLM's port (another instance's vLLM, issue 32 item
// 4): vLLM is not launched, the start ends as a configuration error (exit
// 78, no READY) naming the holder.
func TestMachinePortHeldIsAConfigErrorWithoutALaunch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, nil)
		s.holder = "pid 4242 (vllm serve other-model --port 8000), listening on 0.0.0.0:8000"
		s.start()
		if code := s.exited(); code != exitcode.Config {
			t.Fatalf("exit %d, want 78", code)
		}
		if s.l.n() != 0 {
			t.Fatalf("vLLM launched %d times onto a held port", s.l.n())
		}
		f := s.failure(1)
		if f.Verdict.Cause != policy.CauseConfigError || !strings.Contains(f.Decision.Reason, "pid 4242") ||
			!strings.Contains(f.Decision.Reason, "port 8000 is already in use") {
			t.Fatalf("failure %+v", f)
		}
		if st := s.sup.Status(); st.Starts != 1 || !st.ReadySince.IsZero() {
			t.Fatalf("starts %d, ready since %v", st.Starts, st.ReadySince)
		}
	})
}

// An answer on vLLM's port before vLLM printed its server's start is not
// its own (another process listens there): no READY until its line.
func TestMachineAnswerBeforeVLLMsServerLineIsNotReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, nil)
		s.start()
		p := s.l.last()
		p.listening.Store(true) // something answers at once
		s.advance(5 * time.Second)
		st := s.sup.Status()
		if st.State != StateStarting || !strings.Contains(st.LastProbe, "before vLLM's own server started") {
			t.Fatalf("state %s, last probe %q: want starting, the answer not taken", st.State, st.LastProbe)
		}
		p.print("INFO 12-03 12:00:00 [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:8000")
		s.advance(time.Second)
		s.wantState(StateReady)
		s.stop()
	})
}

// An answer before the server line counts when the listener on the port
// is a process of this run's own tree (a vLLM whose startup lines the
// guard does not know).
func TestMachineAnswerFromItsOwnListenerIsReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, nil)
		s.start()
		p := s.l.last()
		s.owners = []int{p.pid()}
		p.listening.Store(true)
		s.advance(2 * time.Second)
		s.wantState(StateReady)
		s.stop()
	})
}
