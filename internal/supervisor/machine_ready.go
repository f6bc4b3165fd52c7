package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// While ready: the heartbeat, stuck detection, restore and the cost model.

// beatRunning: each second while starting, the GPU's word (NVML) is
// looked at and the tree re-read.
func (m *core) beatRunning() bool {
	if m.checkGPUFault() {
		return true
	}
	m.do(fxRefresh{})
	return false
}

// beatReady: each second while ready, also stuck detection (not while
// a dead engine's or a finished server's exit is waited for: that wait
// gives the verdict), and a stable stretch on a lower rung may call for
// a restore.
func (m *core) beatReady() {
	if m.beatRunning() || m.sub == subReady && m.checkStuck() {
		return
	}
	m.restoreDue()
}

// onRestoreDue: the policy said whether a restore is due, and to which
// rung.
func (m *core) onRestoreDue(r policy.Rung, due bool) {
	if !due {
		return
	}
	m.log().Info("stable on a lower rung: restarting one rung up", zap.Int("to_rung", r.Index),
		zap.Int("max_num_seqs", r.MaxNumSeqs), zap.Float64("peak_gpu_fraction", m.r.peak))
	m.endRun(endRestore)
}

// probeLive probes liveness, and again after an interval.
func (m *core) probeLive() {
	lc := m.cfg.Liveness
	m.probe(probeHealth, "", lc.Timeout.Duration)
	m.arm(tLive, lc.Interval.Duration)
}

// endProbing stops what watches a run: its timers and in-flight probes.
func (m *core) endProbing() {
	for _, k := range []timerKind{tPoll, tLive, tCost, tDying, tExiting, tFastRetry} {
		m.disarm(k)
	}
	m.do(fxEndProbing{})
}

// minPrefillRate is the slowest prefill the stuck check allows for, in
// prompt tokens a second (a small model on a CPU build prefills a few
// hundred): vLLM counts prompt tokens only when a prefill completes, so a
// long one shows no counter moving until it is done.
const minPrefillRate = 100.0

// checkStuck: /health only checks an error flag, so a wedged engine still
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
func (m *core) checkStuck() bool {
	limit := m.cfg.Liveness.StuckTimeout.Duration
	if limit <= 0 || !m.ports.tokens || m.r.stuckVerdict != "" {
		return false
	}
	now := m.now
	running, tokens, ok := m.facts.running, m.facts.tokens, m.facts.tokensOK
	if !ok {
		if !m.r.probing && now.Sub(m.r.stuckAsked) >= limit {
			m.r.stuckAsked, m.r.stuckProbe = now, true
			level := m.cfg.Readiness.Probe
			m.probe(probeReady, level, limit)
		}
		return false
	}
	awaiting, prompt := m.facts.awaiting, m.facts.prompt
	if (running <= 0 && awaiting <= 0) || tokens != m.r.stuckTokens || m.r.stuckSince.IsZero() {
		m.r.stuckTokens, m.r.stuckSince, m.r.pausedSaid = tokens, now, false
		return false
	}
	prefill := time.Duration(prompt / minPrefillRate * float64(time.Second))
	still := now.Sub(m.r.stuckSince)
	if still < limit+prefill {
		return false
	}
	m.askPaused(fmt.Sprintf("stuck: %g requests running, %d sent through the guard's proxy with no answer, and no token counter advanced for %s "+
		"(prompt+generation tokens at %g; stuck_timeout %s, plus %s for a prefill of the largest prompt awaiting an answer, %.0f tokens)",
		running, awaiting, still.Round(time.Second), tokens, limit, prefill.Round(time.Second), prompt))
	return false
}

// askPaused asks vLLM whether an operator paused it before calling it
// stuck: a paused vLLM holds its requests on purpose. The verdict is
// given (or dropped) when the answer comes, in onPausedAnswer.
func (m *core) askPaused(verdict string) {
	if m.r.probing {
		return // a probe is in flight: ask at the next heartbeat
	}
	m.r.stuckVerdict = verdict
	m.enter(subAskingPaused, "", nil)
	m.probe(probePaused, "", m.cfg.Liveness.Timeout.Duration)
}

// onPausedAnswer gives the stuck verdict unless vLLM said it is paused;
// then the stuck clock starts again, and the next check asks again.
func (m *core) onPausedAnswer(r probeResult) {
	verdict := m.r.stuckVerdict
	m.r.stuckVerdict = ""
	if r.paused {
		if !m.r.pausedSaid {
			m.r.pausedSaid = true
			m.log().Info("vLLM holds requests without progress, but an operator paused it (/is_paused): not stuck; waiting for /resume")
		}
		m.r.stuckSince, m.r.stuckAsked = m.now, m.now
		m.enter(subReady, "", nil)
		return
	}
	m.r.stuck = verdict
	m.judge()
}

// restoreDue tracks the peak GPU fraction since ready and asks the policy
// whether to step one rung up (onRestoreDue goes on).
func (m *core) restoreDue() {
	if m.cfg.Profile.RestoreAfter.Duration <= 0 {
		return
	}
	for _, f := range m.facts.fraction {
		m.r.peak = max(m.r.peak, f)
	}
	idle := m.facts.loadOK && m.facts.loadRunning == 0 && m.facts.loadWaiting == 0
	m.do(fxAskRestore{m.r.peak, idle})
}

// observeCost feeds the cost model one (running sequences, memory) pair.
func (m *core) observeCost() {
	if !m.ports.gpu || !m.ports.load {
		return
	}
	f := m.facts
	if !f.loadOK || !f.sampleOK || !f.sampledAt.After(m.r.costAt) {
		return // no reading, or the one already observed: each GPU reading counts once
	}
	m.r.costAt = f.sampledAt
	m.r.costObs++
	m.do(fxObserveCost{running: f.loadRunning, used: f.used, total: f.total, describe: m.r.costObs%10 == 1})
}

// engineDeadGrace: judgeHang's grace after /health says the engine is dead.
func (s *Supervisor) engineDeadGrace() time.Duration { return engineDeadGrace(s.cfg) }
