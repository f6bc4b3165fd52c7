package supervisor

import (
	"time"

	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
)

// engineDeadGrace: judgeHang's grace after /health says the engine is dead.
func (s *Supervisor) engineDeadGrace() time.Duration { return engineDeadGrace(s.cfg) }

// shutdownTimeout is vLLM's --shutdown-timeout as its parser reads the
// command line in force (internal/vllmargs: every spelling, a --config
// file, the extra arguments), 0 when absent.
func (s *Supervisor) shutdownTimeout() time.Duration { return s.args.ShutdownTimeout }

// stopTimeout is the effective stop timeout of the command line in force.
func (s *Supervisor) stopTimeout() time.Duration {
	return EffectiveStopTimeout(s.cfg.VLLM.StopTimeout.Duration, s.shutdownTimeout())
}

// EffectiveStopTimeout is max(stop_timeout, --shutdown-timeout + 10 s)
// when vLLM is given a shutdown timeout (0 when not).
func EffectiveStopTimeout(stopTimeout, vllmShutdown time.Duration) time.Duration {
	return heart.EffectiveStopTimeout(stopTimeout, vllmShutdown)
}

func pidOf(c proc) int { // (the executor's)
	if c == nil {
		return 0
	}
	return c.PID()
}
