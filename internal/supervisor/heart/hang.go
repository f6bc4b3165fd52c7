package heart

import (
	"fmt"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
)

// The one judge of hangs. The machine notes a run's progress facts as
// events bring them (output, disk I/O, probe answers, /health's word on
// the engine, the server's last line, a stuck verdict /is_paused did not
// excuse); judgeHang reads them at the event's time and says "hung,
// because …" or nothing. The kill is elsewhere (hung → endRun).

// Progress is what the hang judge reads of a run at one event.
type Progress struct {
	Now       time.Time
	StartedAt time.Time
	Ready     bool
	// Starting: the last output line and the last growth of the tree's
	// disk I/O, the load phase, and since when every readiness probe got
	// a 4xx (zero: the last did not), with the last such answer and its time.
	LastLine, LastIO time.Time
	Phase            string
	RefusedSince     time.Time
	RefusedLast      time.Time
	Refusal          ProbeResult
	// Ready: consecutive liveness failures and the last one's error.
	Failures int
	LastErr  string
	// EngineDeadAt: /health said the engine is dead (zero: it did not);
	// serverDoneAt: vLLM's server printed its last line and its port
	// closed, and its process has not exited (zero: not seen).
	EngineDeadAt, ServerDoneAt time.Time
	// Stuck: a stuck verdict that vLLM's /is_paused did not excuse.
	Stuck string
}

// JudgeHang says why the run is hung at p.now, or "" when it is not.
func JudgeHang(p Progress, c *config.Config) string {
	if !p.Ready {
		return JudgeStart(p, c)
	}
	switch {
	case p.Stuck != "":
		return p.Stuck
	case !p.EngineDeadAt.IsZero() && p.Now.Sub(p.EngineDeadAt) >= EngineDeadGrace(c):
		return fmt.Sprintf("/health said vLLM's engine is dead and vLLM did not exit within %s", EngineDeadGrace(c))
	case !p.ServerDoneAt.IsZero() && p.Now.Sub(p.ServerDoneAt) >= c.VLLM.StopTimeout.Duration:
		return fmt.Sprintf("vLLM's API server printed %q but its process did not exit within %s (stop_timeout)",
			"Finished server process", c.VLLM.StopTimeout.Duration)
	case p.Failures > 0 && p.Failures >= c.Liveness.Failures:
		return fmt.Sprintf("%d consecutive liveness failures, last: %s", p.Failures, p.LastErr)
	}
	return ""
}

// JudgeStart: a start is hung when nothing shows load progress (no
// output, no disk I/O) for stall_timeout, when it is not ready after
// max_start_time, or when vLLM's server has refused the readiness probe
// with a 4xx for refusedProbeLimit (the probe does not fit this vLLM:
// waiting longer changes nothing).
func JudgeStart(p Progress, c *config.Config) string {
	rc := c.Readiness
	last := p.LastLine
	if p.LastIO.After(last) {
		last = p.LastIO
	}
	if silent := p.Now.Sub(last); silent > rc.StallTimeout.Duration {
		return fmt.Sprintf("no load progress (no output, no disk I/O) for %s while starting (stall_timeout %s), last phase %q",
			silent.Round(time.Second), rc.StallTimeout.Duration, p.Phase)
	}
	if limit := rc.MaxStartTime.Duration; limit > 0 && p.Now.Sub(p.StartedAt) > limit {
		return fmt.Sprintf("not ready after max_start_time %s", limit)
	}
	if !p.RefusedSince.IsZero() && p.RefusedLast.Sub(p.RefusedSince) >= RefusedProbeLimit {
		r := p.Refusal
		return fmt.Sprintf("vLLM's server is up but has refused the readiness probe for %s (%s: %s); "+
			"the probe does not fit this vLLM: check the served name, the API key and the task, or set [readiness] probe = \"health\"",
			RefusedProbeLimit, r.Step, r.Err)
	}
	return ""
}

// EngineDeadGrace is how long the guard waits, after /health says vLLM's
// engine is dead, for vLLM to exit by itself (its watchdog runs every 5 s,
// and it prints the root cause: an OOM's traceback decides the rung) before
// it kills it as hung: twice the watchdog's period. On the real vLLM under
// a load average of 10 the API server exited 5.2 s after its EngineCore
// was SIGKILLed; a 1 s grace called that a hang.
func EngineDeadGrace(*config.Config) time.Duration { return 10 * time.Second }

// Progress is the run's progress facts at the event being handled.
func (m *Core) Progress() Progress {
	r := &m.R
	return Progress{Now: m.Now, StartedAt: r.StartedAt, Ready: r.Ready, LastLine: r.LastLine, LastIO: r.LastIO, Phase: m.Pump.Phase,
		RefusedSince: r.RefusedSince, RefusedLast: r.RefusedLast, Refusal: r.Refusal, Failures: r.Failures, LastErr: r.LastErr,
		EngineDeadAt: r.EngineDeadAt, ServerDoneAt: r.ServerDoneAt, Stuck: r.Stuck}
}

// Judge asks the hang judge about the run and, when it is hung, ends it
// (a kill). True when it did.
func (m *Core) Judge() bool {
	why := JudgeHang(m.Progress(), m.Cfg)
	if why == "" {
		return false
	}
	m.Hung(why)
	return true
}
