package supervisor

import (
	"fmt"
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
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

// onStop: the guard was asked to stop (SIGTERM, SIGINT).
func (m *machine) onStop() {
	m.stopAsked = true
	m.s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionStop, Reason: "the guard was asked to stop"})
	switch {
	case m.sub.running():
		m.endRun(endStop)
	case m.sub.stopping(), m.sub == subCleaning:
		if m.r.end != endExited {
			m.r.end = endStop
		}
		// A failure being cleaned up is still recorded; then the guard stops.
	case m.sub == subFailed:
		m.code = exitcode.OK
		m.enter(subGaveUp, "", nil)
	default: // waiting for memory, releasing, backing off
		m.finish(exitcode.OK, "stopped on request")
	}
}

// onRequest answers an operator's request.
func (m *machine) onRequest(r request, sink *logSink) {
	s := m.s
	if m.sub == subFailed {
		r.reply <- fmt.Errorf("the guard gave up; restart the guard itself (systemctl restart) after fixing the cause")
		return
	}
	switch r.kind {
	case "restart":
		s.log.Info("operator asked for a restart", zap.String("peer", r.peer))
		r.reply <- nil
		switch m.sub {
		case subStarting, subReady:
			m.r.peer = r.peer
			m.endRun(endRestart)
		case subBackoff, subCheckGPU, subWaitGPU, subWaitPort:
			m.disarm(tBackoff)
			m.disarm(tFreeMemory)
			m.disarm(tPortRetry)
			s.update(func(st *Status) { st.NextStartAt = time.Time{} })
			s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: "restarting vLLM on request from " + r.peer})
			m.next(sink)
		}
		// Stopping or waiting for the release: a restart is under way.
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
