package heart

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

// GPU faults: the GPU's own word (NVML) read before a start (a GPU that
// needs a reset is not started on), while vLLM runs (a fault after which
// the driver tore the contexts down ends the run now) and after it ended
// (the classifier's first evidence).

// GPUBlocked: before a start, a GPU lost, asking for a reset or with a row
// remap pending or failed (why, cause.StartBlock's words) is not started
// on; the state is waiting_gpu with why, looked at again every sample (a
// reset clears it).
func (m *Core) GPUBlocked(why string) {
	reason := "not starting vLLM on a GPU that needs a reset: " + why
	if m.Facts.State != StateWaitingGPU || m.Facts.Reason != reason {
		m.Log().Error("not starting vLLM: a GPU needs a reset", zap.String("why", why))
	}
	m.Enter(SubWaitGPU, reason, nil)
	m.Arm(TFreeMemory, m.Cfg.GPU.SampleInterval.Duration)
}

// GPUEvidenceFrom pairs a reading (made off the loop after a death) with the
// GPUs' state at the launch; nil when NVML could not tell.
func (m *Core) GPUEvidenceFrom(after []cause.GPUDevice) *cause.GPUEvidence {
	if after == nil {
		return nil
	}
	return &cause.GPUEvidence{Before: m.R.GPUBefore, After: after}
}

// CheckGPUFault ends the run at once when the GPU said something after
// which vLLM cannot go on (an XID that tears the contexts down or needs a
// reset, a lost GPU): vLLM may not notice for a long time, or hang in the
// driver. Its tree is killed; the failure is then classified from the
// same evidence. True when it ended the run.
func (m *Core) CheckGPUFault() bool {
	if !m.Ports.Health || !m.Sub.Running() {
		return false
	}
	ev := m.GPUEvidenceFrom(m.Facts.GPUs) // NVML's word as last sampled, read by the loop at the heartbeat
	if ev == nil {
		return false
	}
	what, ends := cause.LiveFault(*ev)
	if !ends {
		return false
	}
	m.Log().Error("the GPU failed under vLLM: killing its process tree", zap.String("gpu", what))
	m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.R.PID,
		Reason: fmt.Sprintf("GPU fault while vLLM ran: %s", what)})
	m.R.GPUKilled = true
	m.EndRun(EndExited) // a kill: gpuKilled
	return true
}
