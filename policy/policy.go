package policy

import (
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/vllm-guard/vllm-guard/config"
)

// Clock is the only way the policy learns the time: callers pass theirs in.
type Clock interface{ Now() time.Time }

// Policy holds the decision history of one guard. It is not safe for
// concurrent use: the supervisor's event loop owns it.
type Policy struct {
	cfg    *config.Config
	ladder []Rung
	rung   int
	bo     *backoff.ExponentialBackOff
}

// New returns a policy over cfg, resuming from st (the zero State is rung 0).
func New(cfg *config.Config, st State, clock Clock) *Policy {
	p := &Policy{cfg: cfg, ladder: Ladder(cfg.Profile)}
	p.rung = min(max(st.Rung, 0), len(p.ladder)-1)
	p.bo = backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(cfg.Restart.InitialDelay.Duration),
		backoff.WithMaxInterval(cfg.Restart.MaxDelay.Duration),
		backoff.WithMultiplier(cfg.Restart.Multiplier),
		backoff.WithRandomizationFactor(cfg.Restart.Jitter),
		backoff.WithMaxElapsedTime(0),
		backoff.WithClockProvider(clock),
	)
	return p
}

// State is what survives a restart of the guard (state.json).
type State struct {
	Rung int `json:"rung"`
}

// Ladder computes every rung from rung 0 down to the floors.
func Ladder(p config.Profile) []Rung {
	r := Rung{Index: 0, MaxNumSeqs: p.MaxNumSeqs, GPUMemoryUtilization: p.GPUMemoryUtilization}
	out := []Rung{r}
	for i := 1; i < 64; i++ {
		n := max(int(float64(r.MaxNumSeqs)*p.MaxNumSeqsFactor), p.MinMaxNumSeqs)
		u := max(round2(r.GPUMemoryUtilization-p.GPUMemoryUtilizationStep), p.MinGPUMemoryUtilization)
		if n == r.MaxNumSeqs && u == r.GPUMemoryUtilization {
			break
		}
		r = Rung{Index: i, MaxNumSeqs: n, GPUMemoryUtilization: u}
		out = append(out, r)
	}
	return out
}

func round2(f float64) float64 { return float64(int(f*100+0.5)) / 100 }

// Current is the rung the next start uses.
func (p *Policy) Current() Rung { return p.ladder[p.rung] }

// Rungs returns the whole ladder.
func (p *Policy) Rungs() []Rung { return p.ladder }

// State returns what to persist.
func (p *Policy) State() State { return State{Rung: p.rung} }

// OnStart records a launch.
func (p *Policy) OnStart(now time.Time) {}

// OnReady records that vLLM became ready.
func (p *Policy) OnReady(now time.Time) {}

// OnFailure records a death and decides what to do next.
func (p *Policy) OnFailure(now time.Time, v Verdict) Decision {
	if v.Cause == CauseConfigError {
		return Decision{Action: ActionGiveUp, Rung: p.Current(), ExitCode: 78, Reason: "configuration error: fix it and start again"}
	}
	if v.Cause == CauseOOM && p.rung < len(p.ladder)-1 {
		p.rung++
	}
	return Decision{Action: ActionRestart, Rung: p.Current(), Delay: p.bo.NextBackOff(), Reason: string(v.Cause)}
}

// ResetProfile returns to rung 0 at the next start (`vllm-guard profile reset`).
func (p *Policy) ResetProfile() { p.rung = 0 }
