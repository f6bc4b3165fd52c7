package supervisor

import (
	"fmt"
	"reflect"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

// What comes from outside the run: operators' requests, a reload, the
// stop and kill signals.

// reload: what does not touch the running vLLM applies now; the rest
// (command, env, host, port, workdir, profile, restart policy) waits for
// its next start.
func (m *core) reload(cfg *config.Config) {
	live := *cfg
	live.VLLM, live.Profile, live.Restart = m.cfg.VLLM, m.cfg.Profile, m.cfg.Restart
	vllmSame := reflect.DeepEqual(cfg.VLLM, m.cfg.VLLM) && cfg.Profile == m.cfg.Profile && cfg.Restart == m.cfg.Restart
	m.cfg = &live
	if vllmSame {
		m.pending = nil
	} else {
		m.pending = cfg
	}
	m.do(fxReload{&live, m.pending != nil})
}

// applyPending: vLLM starts now, on the reloaded config if there is one.
func (m *core) applyPending() {
	if m.pending == nil {
		return
	}
	m.cfg, m.pending = m.pending, nil
	m.do(fxApplyConfig{m.cfg}) // the policy, vLLM's command line as the probes read it
}

// onKill: a second SIGTERM or SIGINT while stopping: no more waiting.
func (m *core) onKill() {
	if m.sub.stopping() && !m.r.gone {
		m.disarm(tStopKill)
		m.disarm(tDrain)
		m.r.drainUntil = time.Time{}
		m.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.r.pid,
			Reason: "asked to stop again"})
		m.do(fxKill{})
		m.enter(subStopKill, m.stopReason()+"; asked to stop again: killing vLLM's process tree", nil)
	}
}

// onRequest answers an operator's reload or profile reset, alike in every
// sub-state (a restart is a column of the table); a guard that gave up
// takes none.
func (m *core) onRequest(r request) {
	if m.sub == subFailed {
		m.refuse(r)
		return
	}
	switch r.kind {
	case "reload":
		m.reload(r.cfg)
		m.do(fxReply{r.reply, nil})
	case "reset_profile":
		m.do(fxResetProfile{r.peer}) // the policy back to rung 0, saved and said
		m.do(fxReply{r.reply, nil})
	default:
		m.do(fxReply{r.reply, fmt.Errorf("unknown request %q", r.kind)})
	}
}

func (m *core) refuse(r request) {
	m.do(fxReply{r.reply, fmt.Errorf("the guard gave up; restart the guard itself (systemctl restart) after fixing the cause")})
}

// restartRun: a restart of the running vLLM: it stops as planned (a drain
// first where there is one), then starts again.
func (m *core) restartRun(r request) {
	m.do(fxReply{r.reply, nil})
	m.r.peer = r.peer
	m.endRun(endRestart)
}

// restartNow: a restart while waiting to start (backoff, the GPU, the
// port): start now.
func (m *core) restartNow(r request) {
	m.do(fxReply{r.reply, nil})
	m.disarm(tBackoff)
	m.disarm(tFreeMemory)
	m.disarm(tPortRetry)
	m.clearNextStart()
	m.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: "restarting vLLM on request from " + r.peer})
	m.next()
}
