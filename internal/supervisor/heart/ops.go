package heart

import (
	"fmt"
	"reflect"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

// What comes from outside the run: operators' requests, a reload, the
// stop and kill signals.

// Reload: what does not touch the running vLLM applies now; the rest
// (command, env, host, port, workdir, profile, restart policy) waits for
// its next start.
func (m *Core) Reload(cfg *config.Config) {
	live := *cfg
	live.VLLM, live.Profile, live.Restart = m.Cfg.VLLM, m.Cfg.Profile, m.Cfg.Restart
	vllmSame := reflect.DeepEqual(cfg.VLLM, m.Cfg.VLLM) && cfg.Profile == m.Cfg.Profile && cfg.Restart == m.Cfg.Restart
	m.Cfg = &live
	if vllmSame {
		m.Pending = nil
	} else {
		m.Pending = cfg
	}
	m.Do(FxReload{&live, m.Pending != nil})
}

// ApplyPending: vLLM starts now, on the reloaded config if there is one.
func (m *Core) ApplyPending() {
	if m.Pending == nil {
		return
	}
	m.Cfg, m.Pending = m.Pending, nil
	m.Do(FxApplyConfig{m.Cfg}) // the policy, vLLM's command line as the probes read it
}

// OnKill: a second SIGTERM or SIGINT while stopping: no more waiting.
func (m *Core) OnKill() {
	if m.Sub.Stopping() && !m.R.Gone {
		m.Disarm(TStopKill)
		m.Disarm(TDrain)
		m.R.DrainUntil = time.Time{}
		m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.R.PID,
			Reason: "asked to stop again"})
		m.Do(FxKill{})
		m.Enter(SubStopKill, m.StopReason()+"; asked to stop again: killing vLLM's process tree", nil)
	}
}

// OnRequest answers an operator's reload or profile reset, alike in every
// sub-state (a restart is a column of the table); a guard that gave up
// takes none.
func (m *Core) OnRequest(r Request) {
	if m.Sub == SubFailed {
		m.Refuse(r)
		return
	}
	switch r.Kind {
	case "reload":
		m.Reload(r.Cfg)
		m.Do(FxReply{r.Reply, nil})
	case "reset_profile":
		m.Do(FxResetProfile{r.Peer}) // the policy back to rung 0, saved and said
		m.Do(FxReply{r.Reply, nil})
	default:
		m.Do(FxReply{r.Reply, fmt.Errorf("unknown request %q", r.Kind)})
	}
}

func (m *Core) Refuse(r Request) {
	m.Do(FxReply{r.Reply, fmt.Errorf("the guard gave up; restart the guard itself (systemctl restart) after fixing the cause")})
}

// RestartRun: a restart of the running vLLM: it stops as planned (a drain
// first where there is one), then starts again.
func (m *Core) RestartRun(r Request) {
	m.Do(FxReply{r.Reply, nil})
	m.R.Peer, m.R.Why = r.Peer, r.Why
	m.EndRun(EndRestart)
}

// RestartNow: a restart while waiting to start (backoff, the GPU, the
// port): start now.
func (m *Core) RestartNow(r Request) {
	m.Do(FxReply{r.Reply, nil})
	m.Disarm(TBackoff)
	m.Disarm(TFreeMemory)
	m.Disarm(TPortRetry)
	m.ClearNextStart()
	m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: RestartText(r.Peer, r.Why)})
	m.Next()
}

// RestartText is what a restart's decision says: why the guard restarts
// vLLM itself (its weight cache daemon died), or who asked.
func RestartText(peer, why string) string {
	if why != "" {
		return "restarting vLLM: " + why
	}
	return "restarting vLLM on request from " + peer
}
