package policy

import (
	"fmt"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

// Rung is one step of the degrade ladder. Rung 0 is [profile] as written.
type Rung struct {
	Index                int     `json:"index"`
	MaxNumSeqs           int     `json:"max_num_seqs"`
	GPUMemoryUtilization float64 `json:"gpu_memory_utilization"`
	// KVCacheMemoryBytes is --kv-cache-memory-bytes for this rung when the
	// operator sizes vLLM's KV cache in bytes (0: vLLM sizes it from the
	// utilization). See KVBytesFor.
	KVCacheMemoryBytes uint64 `json:"kv_cache_memory_bytes,omitempty"`
}

// Action is what the guard does next.
type Action string

const (
	ActionRestart Action = "restart" // after Delay, on Rung
	ActionGiveUp  Action = "give_up" // stop trying; ExitCode says how the guard exits
)

// Decision is the policy's answer after a failure.
type Decision struct {
	Action   Action        `json:"action"`
	Rung     Rung          `json:"rung"`
	Delay    time.Duration `json:"delay"`             // backoff before the next start
	ExitCode int           `json:"exit_code"`         // for ActionGiveUp: 78 config, 1 crash loop
	Reason   string        `json:"reason"`            // operator's words: why this step
	AtFloor  bool          `json:"at_floor,omitzero"` // the ladder's floor is reached
}

// onGPUFault decides after a gpu_fault: never restart into a GPU that
// needs a reset; restart once on the same rung after a survivable one; a
// second within give_up_window needs a reset too.
func (p *Policy) onGPUFault(now time.Time, v cause.Verdict) Decision {
	g := v.GPU
	if g == nil {
		g = &cause.GPUFault{Device: -1, Meaning: "a GPU hardware error"}
	}
	n, window := 0, p.cfg.Restart.GiveUpWindow
	for _, f := range p.failures {
		if f.Cause == cause.CauseGPUFault && !f.Time.Before(p.loopSince) && (window <= 0 || now.Sub(f.Time) < window) {
			n++
		}
	}
	if g.Reset {
		return p.giveUp(exitcode.GPUFault, "GPU fault, not restarted into: "+g.What())
	}
	if n >= 2 {
		r := *g
		r.Reset = true
		return p.giveUp(exitcode.GPUFault, fmt.Sprintf("second GPU fault within %s, treated as needing a reset: %s", window, r.What()))
	}
	if c, window := p.countFailures(now); p.cfg.Restart.GiveUpAfter > 0 && c >= p.cfg.Restart.GiveUpAfter {
		return p.giveUp(exitcode.Failed, fmt.Sprintf("crash loop: %d failed starts within %s (last cause gpu_fault: %s); giving up, fix the cause and restart the guard",
			c, window, g.What()))
	}
	d := Decision{Action: ActionRestart, Rung: p.Current(), Delay: p.nextDelay(),
		Reason: fmt.Sprintf("GPU fault that a restart survives (%s): restarting on the same rung; a second within %s is treated as needing a reset", g.What(), window)}
	return d
}
