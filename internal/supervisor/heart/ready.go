package heart

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// While ready: the heartbeat, stuck detection, restore and the cost model.

// BeatRunning: each second while starting, the GPU's word (NVML) is
// looked at and the tree re-read.
func (m *Core) BeatRunning() bool {
	if m.CheckGPUFault() {
		return true
	}
	m.Do(FxRefresh{})
	return false
}

// BeatReady: each second while ready, also stuck detection (not while
// a dead engine's or a finished server's exit is waited for: that wait
// gives the verdict), and a stable stretch on a lower rung may call for
// a restore.
func (m *Core) BeatReady() {
	if m.BeatRunning() || m.Sub == SubReady && m.CheckStuck() {
		return
	}
	m.RestoreDue()
}

// OnRestoreDue: the policy said whether a restore is due, and to which
// rung.
func (m *Core) OnRestoreDue(r policy.Rung, due bool) {
	if !due {
		return
	}
	m.Log().Info("stable on a lower rung: restarting one rung up", zap.Int("to_rung", r.Index),
		zap.Int("max_num_seqs", r.MaxNumSeqs), zap.Float64("peak_gpu_fraction", m.R.Peak))
	m.EndRun(EndRestore)
}

// ProbeLive probes liveness, and again after an interval.
func (m *Core) ProbeLive() {
	lc := m.Cfg.Liveness
	m.Probe(ProbeHealth, "", lc.Timeout.Duration)
	m.Arm(TLive, lc.Interval.Duration)
}

// EndProbing stops what watches a run: its timers and in-flight probes.
func (m *Core) EndProbing() {
	for _, k := range []TimerKind{TPoll, TLive, TCost, TDying, TExiting, TFastRetry} {
		m.Disarm(k)
	}
	m.Do(FxEndProbing{})
}

// MinPrefillRate is the slowest prefill the stuck check allows for, in
// prompt tokens a second (a small model on a CPU build prefills a few
// hundred): vLLM counts prompt tokens only when a prefill completes, so a
// long one shows no counter moving until it is done.
const MinPrefillRate = 100.0

// CheckStuck: /health only checks an error flag, so a wedged engine still
// answers 200. vLLM is stuck when it has work in flight and none of its
// token counters advances for stuck_timeout, plus the time the largest
// prompt awaiting its first byte may take to prefill. Work in flight is
// vLLM's running requests, or the requests the guard's proxy sent that have
// no answer yet (vLLM publishes its gauges only after an engine step, so
// an engine that hangs in its first step after idle still shows 0
// running). Without its metrics, a 1-token request bounded by
// stuck_timeout is sent every stuck_timeout. A busy vLLM that makes
// progress, an idle one, or one an operator paused (/is_paused, asked
// before the verdict) is never stuck.
func (m *Core) CheckStuck() bool {
	limit := m.Cfg.Liveness.StuckTimeout.Duration
	if limit <= 0 || !m.Ports.Tokens || m.R.StuckVerdict != "" {
		return false
	}
	now := m.Now
	running, tokens, ok := m.Facts.Running, m.Facts.Tokens, m.Facts.TokensOK
	if !ok {
		if !m.R.Probing && now.Sub(m.R.StuckAsked) >= limit {
			m.R.StuckAsked, m.R.StuckProbe = now, true
			level := m.Cfg.Readiness.Probe
			m.Probe(ProbeReady, level, limit)
		}
		return false
	}
	awaiting, prompt := m.Facts.Awaiting, m.Facts.Prompt
	if (running <= 0 && awaiting <= 0) || tokens != m.R.StuckTokens || m.R.StuckSince.IsZero() {
		m.R.StuckTokens, m.R.StuckSince, m.R.PausedSaid = tokens, now, false
		return false
	}
	prefill := time.Duration(prompt / MinPrefillRate * float64(time.Second))
	still := now.Sub(m.R.StuckSince)
	if still < limit+prefill {
		return false
	}
	m.AskPaused(fmt.Sprintf("stuck: %g requests running, %d sent through the guard's proxy with no answer, and no token counter advanced for %s "+
		"(prompt+generation tokens at %g; stuck_timeout %s, plus %s for a prefill of the largest prompt awaiting an answer, %.0f tokens)",
		running, awaiting, still.Round(time.Second), tokens, limit, prefill.Round(time.Second), prompt))
	return false
}

// AskPaused asks vLLM whether an operator paused it before calling it
// stuck: a paused vLLM holds its requests on purpose. The verdict is
// given (or dropped) when the answer comes, in onPausedAnswer.
func (m *Core) AskPaused(verdict string) {
	if m.R.Probing {
		return // a probe is in flight: ask at the next heartbeat
	}
	m.R.StuckVerdict = verdict
	m.Enter(SubAskingPaused, "", nil)
	m.Probe(ProbePaused, "", m.Cfg.Liveness.Timeout.Duration)
}

// OnPausedAnswer gives the stuck verdict unless vLLM said it is paused;
// then the stuck clock starts again, and the next check asks again.
func (m *Core) OnPausedAnswer(r ProbeResult) {
	verdict := m.R.StuckVerdict
	m.R.StuckVerdict = ""
	if r.Paused {
		if !m.R.PausedSaid {
			m.R.PausedSaid = true
			m.Log().Info("vLLM holds requests without progress, but an operator paused it (/is_paused): not stuck; waiting for /resume")
		}
		m.R.StuckSince, m.R.StuckAsked = m.Now, m.Now
		m.Enter(SubReady, "", nil)
		return
	}
	m.R.Stuck = verdict
	m.Judge()
}

// RestoreDue tracks the peak GPU fraction since ready and asks the policy
// whether to step one rung up (onRestoreDue goes on). A group's follower
// never does: the leader's restore restarts the group on its rung.
func (m *Core) RestoreDue() {
	if m.Cfg.Profile.RestoreAfter.Duration <= 0 || m.GroupFollower() {
		return
	}
	for _, f := range m.Facts.Fraction {
		m.R.Peak = max(m.R.Peak, f)
	}
	idle := m.Facts.LoadOK && m.Facts.LoadRunning == 0 && m.Facts.LoadWaiting == 0
	m.Do(FxAskRestore{m.R.Peak, idle})
}

// ObserveCost feeds the cost model one (running sequences, memory) pair.
func (m *Core) ObserveCost() {
	if !m.Ports.GPU || !m.Ports.Load {
		return
	}
	f := m.Facts
	if !f.LoadOK || !f.SampleOK || !f.SampledAt.After(m.R.CostAt) {
		return // no reading, or the one already observed: each GPU reading counts once
	}
	m.R.CostAt = f.SampledAt
	m.R.CostObs++
	m.Do(FxObserveCost{Running: f.LoadRunning, Used: f.Used, Total: f.Total, Describe: m.R.CostObs%10 == 1})
}
