package supervisor

import (
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

const squatter = "pid 4242 (vllm serve other-model --port 8000), listening on 0.0.0.0:8000"

func (s *scenario) setHolder(h string) { s.mu.Lock(); s.holder = h; s.mu.Unlock() }

// Another process holds vLLM's port at the guard's first start and keeps
// it (another instance's vLLM, issue 32 item 4): vLLM is not launched; the
// guard waits port_wait, saying who holds the port, then the start ends as
// a configuration error (exit 78, no READY) naming the holder.
func TestMachinePortHeldAtTheFirstStartIsAConfigErrorAfterPortWait(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.VLLM.PortWait = config.Duration{Duration: 30 * time.Second} }, func(t *testing.T, s *scenario) {
		s.holder = squatter
		s.start()
		st := s.sup.Status()
		if st.State != StateBackoff || !strings.Contains(st.Reason, "port 8000 is held by pid 4242") || !strings.Contains(st.Reason, "exit 78") {
			t.Fatalf("state %s (%s): want a wait naming the holder", st.State, st.Reason)
		}
		s.advance(29 * time.Second)
		if st := s.sup.Status(); st.State != StateBackoff || s.l.n() != 0 || len(s.kinds(events.KindExited)) != 0 {
			t.Fatalf("before port_wait: state %s, %d launches, %d failures", st.State, s.l.n(), len(s.kinds(events.KindExited)))
		}
		s.advance(2 * time.Second)
		s.wantExited(exitcode.Config, "the exit")
		s.wantLaunches(0, "vLLM launched onto a held port")
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseConfigError || !strings.Contains(f.Decision.Reason, "pid 4242") ||
			!strings.Contains(f.Decision.Reason, "port 8000 is already in use") || !strings.Contains(f.Verdict.Summary, "port_wait 30s") {
			t.Fatalf("failure %+v", f)
		}
		if st := s.sup.Status(); st.Starts != 1 || !st.ReadySince.IsZero() {
			t.Fatalf("starts %d, ready since %v", st.Starts, st.ReadySince)
		}
	})
}

// port_wait "0s" gives up at once (the behaviour before issue 41).
func TestMachinePortWaitZeroGivesUpAtOnce(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.VLLM.PortWait = config.Duration{} }, func(t *testing.T, s *scenario) {
		s.holder = squatter
		s.start()
		if code := s.exited(); code != exitcode.Config || s.l.n() != 0 {
			t.Fatalf("exit %d after %d launches, want 78 and none", code, s.l.n())
		}
	})
}

// A port held briefly at the first start is waited out: vLLM starts once
// it is free, and is ready.
func TestMachinePortHeldBrieflyAtTheFirstStartIsWaitedOut(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.holder = squatter
		s.start()
		s.advance(5 * time.Second)
		s.wantLaunches(0, "launched onto a held port")
		s.portFreed(5*time.Second, 1)
		s.wantFailures(0, "once ready")
		s.stop()
	})
}

// Issue 41 item 3: a process that grabs vLLM's port during the backoff
// after a crash delays the restart for as long as it holds it (well past
// port_wait: this is a restart, not two instances on one port), status
// names it, and vLLM starts and is ready once it lets go. No exit 78.
func TestMachinePortGrabbedDuringBackoffDelaysTheRestart(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.setHolder(squatter)
		s.l.last().end(exitInfo{Code: 1})
		s.advance(5 * time.Minute)
		st := s.sup.Status()
		if st.State != StateBackoff || !strings.Contains(st.Reason, "held by pid 4242") || !strings.Contains(st.Reason, "as long as it takes") {
			t.Fatalf("state %s (%s): want a wait naming the holder", st.State, st.Reason)
		}
		if s.l.n() != 1 || st.NextStartAt.IsZero() {
			t.Fatalf("%d launches, next start %v", s.l.n(), st.NextStartAt)
		}
		s.portFreed(6*time.Second, 2)
		s.wantFailures(1, "want the one crash")
		s.stop()
	})
}

// A stop while waiting for the port ends the guard at once.
func TestMachineStopWhileWaitingForThePort(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.holder = squatter
		s.start()
		s.advance(time.Second)
		if code := s.stop(); code != exitcode.OK || s.l.n() != 0 {
			t.Fatalf("exit %d, %d launches", code, s.l.n())
		}
	})
}

// An answer on vLLM's port before vLLM printed its server's start is not
// its own (another process listens there): no READY until its line.
func TestMachineAnswerBeforeVLLMsServerLineIsNotReady(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
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

// An answer before the server line counts when it came over a connection
// checked to reach a listener of this run's own tree (a vLLM whose startup
// lines the guard does not know).
func TestMachineAnswerFromItsOwnListenerIsReady(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		s.pr.own.Store(true)
		p.listening.Store(true)
		s.advance(2 * time.Second)
		s.wantState(StateReady)
		s.stop()
	})
}

// bindFails ends the last run as vLLM does when its port is taken while it
// imports: its own refusal, exit 1.
func bindFails(s *scenario) {
	p := s.l.last()
	p.print("stderr:OSError: [Errno 98] Address already in use")
	p.end(exitInfo{Code: 1})
}

// Issue 41 item 3: a process that takes vLLM's port while a restart's vLLM
// imports (after the trial bind) makes that vLLM fail to bind: at a
// restart the guard waits for the port (status naming the holder) instead
// of calling it a configuration error, and starts vLLM once it is free.
func TestMachinePortTakenWhileARestartLoadsIsWaitedOut(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		crash(s)
		s.advance(time.Minute)
		s.wantLaunches(2, "want the restart")
		s.setHolder(squatter)
		bindFails(s)
		s.advance(5 * time.Minute)
		st := s.sup.Status()
		if st.State != StateBackoff || !strings.Contains(st.Reason, "held by pid 4242") || s.l.n() != 2 {
			t.Fatalf("state %s (%s), %d launches: want a wait naming the holder", st.State, st.Reason, s.l.n())
		}
		if f := s.failure(2); f.Decision.Action != policy.ActionRestart || !strings.Contains(f.Decision.Reason, "pid 4242") {
			t.Fatalf("the death on the taken port: %+v", f.Decision)
		}
		s.portFreed(6*time.Second, 3)
		s.stop()
	})
}

// The same at the guard's first start is bounded by port_wait: then the
// guard stops with exit 78 naming the holder, as two instances on one
// port would.
func TestMachinePortTakenWhileTheFirstStartLoadsExits78AfterPortWait(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.VLLM.PortWait = config.Duration{Duration: 10 * time.Second} }, func(t *testing.T, s *scenario) {
		s.start()
		s.setHolder(squatter)
		bindFails(s)
		s.advance(5 * time.Second)
		if st := s.sup.Status(); st.State != StateBackoff || !strings.Contains(st.Reason, "exit 78") {
			t.Fatalf("state %s (%s): want the bounded wait", st.State, st.Reason)
		}
		s.advance(10 * time.Second)
		if code := s.exited(); code != exitcode.Config || s.l.n() != 1 {
			t.Fatalf("exit %d after %d launches, want 78 after the one", code, s.l.n())
		}
	})
}

// portFreed: the holder lets vLLM's port go; after d the machine has
// launched vLLM the n-th time, and it becomes ready.
func (s *scenario) portFreed(d time.Duration, n int) {
	s.t.Helper()
	s.setHolder("")
	s.advance(d)
	s.wantLaunches(n, "once the port is free")
	s.ready()
}

// A process that holds vLLM's port only while a restart's vLLM binds it,
// and lets go before the guard looks, leaves nothing but vLLM's own bind
// refusal: at a restart that is a port to wait for, not a configuration
// error (issue 41: exit 78 and no restart under systemd, where plain vLLM
// would have been retried).
func TestMachineBindRefusedAtARestartIsWaitedOutNotAConfigError(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		crash(s)
		s.advance(time.Minute)
		s.wantLaunches(2, "the restart")
		bindFails(s) // nobody holds the port by the time the guard looks
		s.advance(time.Minute)
		if f := s.failure(2); f.Decision.Action != policy.ActionRestart || f.Verdict.Cause != cause.CauseConfigError {
			t.Fatalf("the death on a port let go: cause %s, %+v; want config_error read, a restart decided", f.Verdict.Cause, f.Decision)
		}
		s.wantLaunches(3, "once the port is free")
		s.ready()
		s.stop()
	})
}
