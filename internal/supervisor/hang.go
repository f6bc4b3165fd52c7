package supervisor

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

// progress is what the hang judge reads of a run at one event.
type progress struct {
	now       time.Time
	startedAt time.Time
	ready     bool
	// Starting: the last output line and the last growth of the tree's
	// disk I/O, the load phase, and since when every readiness probe got
	// a 4xx (zero: the last did not), with the last such answer and its time.
	lastLine, lastIO time.Time
	phase            string
	refusedSince     time.Time
	refusedLast      time.Time
	refusal          probeResult
	// Ready: consecutive liveness failures and the last one's error.
	failures int
	lastErr  string
	// engineDeadAt: /health said the engine is dead (zero: it did not);
	// serverDoneAt: vLLM's server printed its last line and its port
	// closed, and its process has not exited (zero: not seen).
	engineDeadAt, serverDoneAt time.Time
	// stuck: a stuck verdict that vLLM's /is_paused did not excuse.
	stuck string
}

// judgeHang says why the run is hung at p.now, or "" when it is not.
func judgeHang(p progress, c *config.Config) string {
	if !p.ready {
		return judgeStart(p, c)
	}
	switch {
	case p.stuck != "":
		return p.stuck
	case !p.engineDeadAt.IsZero() && p.now.Sub(p.engineDeadAt) >= engineDeadGrace(c):
		return fmt.Sprintf("/health said vLLM's engine is dead and vLLM did not exit within %s", engineDeadGrace(c))
	case !p.serverDoneAt.IsZero() && p.now.Sub(p.serverDoneAt) >= c.VLLM.StopTimeout.Duration:
		return fmt.Sprintf("vLLM's API server printed %q but its process did not exit within %s (stop_timeout)",
			"Finished server process", c.VLLM.StopTimeout.Duration)
	case p.failures > 0 && p.failures >= c.Liveness.Failures:
		return fmt.Sprintf("%d consecutive liveness failures, last: %s", p.failures, p.lastErr)
	}
	return ""
}

// judgeStart: a start is hung when nothing shows load progress (no
// output, no disk I/O) for stall_timeout, when it is not ready after
// max_start_time, or when vLLM's server has refused the readiness probe
// with a 4xx for refusedProbeLimit (the probe does not fit this vLLM:
// waiting longer changes nothing).
func judgeStart(p progress, c *config.Config) string {
	rc := c.Readiness
	last := p.lastLine
	if p.lastIO.After(last) {
		last = p.lastIO
	}
	if silent := p.now.Sub(last); silent > rc.StallTimeout.Duration {
		return fmt.Sprintf("no load progress (no output, no disk I/O) for %s while starting (stall_timeout %s), last phase %q",
			silent.Round(time.Second), rc.StallTimeout.Duration, p.phase)
	}
	if limit := rc.MaxStartTime.Duration; limit > 0 && p.now.Sub(p.startedAt) > limit {
		return fmt.Sprintf("not ready after max_start_time %s", limit)
	}
	if !p.refusedSince.IsZero() && p.refusedLast.Sub(p.refusedSince) >= refusedProbeLimit {
		r := p.refusal
		return fmt.Sprintf("vLLM's server is up but has refused the readiness probe for %s (%s: %s); "+
			"the probe does not fit this vLLM: check the served name, the API key and the task, or set [readiness] probe = \"health\"",
			refusedProbeLimit, r.step, r.err)
	}
	return ""
}

// engineDeadGrace is how long the guard waits, after /health says vLLM's
// engine is dead, for vLLM to exit by itself (its watchdog runs every 5 s,
// and it prints the root cause) before it kills it as hung: one liveness
// interval, between 1 and 10 seconds.
func engineDeadGrace(c *config.Config) time.Duration {
	return min(10*time.Second, max(time.Second, c.Liveness.Interval.Duration))
}

// progress is the run's progress facts at the event being handled.
func (m *core) progress() progress {
	r := &m.r
	return progress{now: m.now, startedAt: r.startedAt, ready: r.ready, lastLine: r.lastLine, lastIO: r.lastIO, phase: m.pump.phase,
		refusedSince: r.refusedSince, refusedLast: r.refusedLast, refusal: r.refusal, failures: r.failures, lastErr: r.lastErr,
		engineDeadAt: r.engineDeadAt, serverDoneAt: r.serverDoneAt, stuck: r.stuck}
}

// judge asks the hang judge about the run and, when it is hung, ends it
// (a kill). True when it did.
func (m *core) judge() bool {
	why := judgeHang(m.progress(), m.cfg)
	if why == "" {
		return false
	}
	m.hung(why)
	return true
}
