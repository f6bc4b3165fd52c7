package supervisor

import (
	"fmt"
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

// What comes from outside the run: operators' requests, a reload, the
// stop and kill signals.

// reload: what does not touch the running vLLM applies now; the rest
// (command, env, host, port, workdir, profile, restart policy) waits for
// its next start.
func (m *machine) reload(cfg *config.Config) {
	s := m.s
	live := *cfg
	live.VLLM, live.Profile, live.Restart = s.cfg.VLLM, s.cfg.Profile, s.cfg.Restart
	vllmSame := reflect.DeepEqual(cfg.VLLM, s.cfg.VLLM) && cfg.Profile == s.cfg.Profile && cfg.Restart == s.cfg.Restart
	s.cfg = &live
	if vllmSame {
		m.pending = nil
	} else {
		m.pending = cfg
	}
	s.pendingReload.Store(m.pending != nil)
}

// applyPending: vLLM starts now, on the reloaded config if there is one.
func (m *machine) applyPending() {
	if m.pending == nil {
		return
	}
	s := m.s
	s.cfg, m.pending = m.pending, nil
	s.pendingReload.Store(false)
	s.pol.Reconfigure(s.cfg.Policy())
	if args, err := s.cfg.VLLMArgs(s.extra); err == nil {
		s.args = args
		s.pol.SetKVCacheBytes(args.KVCacheMemoryBytes)
	} else {
		s.pol.SetKVCacheBytes(s.args.KVCacheMemoryBytes)
		s.log.Warn("the reloaded vLLM command line cannot be read; probes keep the old names and keys", zap.Error(err))
	}
	if names := s.cfg.ServedModelNames(s.args); len(names) > 0 {
		s.model = names[0]
	}
	s.log.Info("vLLM starts on the reloaded configuration")
}

// onKill: a second SIGTERM or SIGINT while stopping: no more waiting.
func (m *machine) onKill() {
	if m.sub.stopping() && m.r.child != nil {
		m.disarm(tStopKill)
		m.disarm(tDrain)
		m.r.drainUntil = time.Time{}
		m.s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.r.child.pid(),
			Reason: "asked to stop again"})
		m.r.child.kill()
		m.enter(subStopKill, m.stopReason()+"; asked to stop again: killing vLLM's process tree", nil)
	}
}

// onRequest answers an operator's request: a restart is a column of the
// machine's table; a reload and a profile reset are answered alike in
// every sub-state; a guard that gave up takes none.
func (m *machine) onRequest(r request) {
	s := m.s
	if m.sub == subFailed {
		m.refuse(r)
		return
	}
	switch r.kind {
	case "restart":
		s.log.Info("operator asked for a restart", zap.String("peer", r.peer))
		m.handle(event{kind: evRestart, run: m.runN, req: r, at: m.now, pump: m.pump})
	case "reload":
		m.reload(r.cfg)
		r.reply <- nil
	case "reset_profile":
		s.pol.ResetProfile()
		s.savePolicy()
		rung := s.pol.Current()
		s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionProfileReset, Rung: &rung,
			Reason: "operator " + r.peer + " reset the profile: rung 0 at the next start"})
		r.reply <- nil
	default:
		r.reply <- fmt.Errorf("unknown request %q", r.kind)
	}
}

func (m *machine) refuse(r request) {
	r.reply <- fmt.Errorf("the guard gave up; restart the guard itself (systemctl restart) after fixing the cause")
}

// restartRun: a restart of the running vLLM: it stops as planned (a drain
// first where there is one), then starts again.
func (m *machine) restartRun(r request) {
	r.reply <- nil
	m.r.peer = r.peer
	m.endRun(endRestart)
}

// restartNow: a restart while waiting to start (backoff, the GPU, the
// port): start now.
func (m *machine) restartNow(r request) {
	r.reply <- nil
	m.disarm(tBackoff)
	m.disarm(tFreeMemory)
	m.disarm(tPortRetry)
	m.clearNextStart()
	m.s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: "restarting vLLM on request from " + r.peer})
	m.next()
}
