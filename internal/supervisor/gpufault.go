package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

// GPU faults: the GPU's own word (NVML) read before a start (a GPU that
// needs a reset is not started on), while vLLM runs (a fault after which
// the driver tore the contexts down ends the run now) and after it ended
// (the classifier's first evidence).

// GPUHealth is what the supervisor needs of the GPU's hardware health;
// nil: no such view (no NVML). Every method returns at once.
type GPUHealth interface {
	// GPUs is every watched GPU's hardware state, with the XID events
	// since since; nil when NVML cannot tell. fresh: read the counters now
	// rather than take the last sample's.
	GPUs(since time.Time, fresh bool) []cause.GPUDevice
}

// gpuBlocked: before a start, a GPU lost, asking for a reset or with a row
// remap pending or failed (why, cause.StartBlock's words) is not started
// on; the state is waiting_gpu with why, looked at again every sample (a
// reset clears it).
func (m *machine) gpuBlocked(why string) {
	reason := "not starting vLLM on a GPU that needs a reset: " + why
	if st := m.s.Status(); st.State != StateWaitingGPU || st.Reason != reason {
		m.s.log.Error("not starting vLLM: a GPU needs a reset", zap.String("why", why))
	}
	m.enter(subWaitGPU, reason, nil)
	m.arm(tFreeMemory, m.s.cfg.GPU.SampleInterval.Duration)
}

// gpuEvidence is NVML's word on the run as last sampled (nil without
// NVML): the heartbeat's look while vLLM runs.
func (m *machine) gpuEvidence() *cause.GPUEvidence {
	if m.s.health == nil {
		return nil
	}
	return m.gpuEvidenceFrom(m.s.health.GPUs(m.r.startedAt, false))
}

// gpuEvidenceFrom pairs a reading (made off the loop after a death) with the
// GPUs' state at the launch; nil when NVML could not tell.
func (m *machine) gpuEvidenceFrom(after []cause.GPUDevice) *cause.GPUEvidence {
	if after == nil {
		return nil
	}
	return &cause.GPUEvidence{Before: m.r.gpuBefore, After: after}
}

// checkGPUFault ends the run at once when the GPU said something after
// which vLLM cannot go on (an XID that tears the contexts down or needs a
// reset, a lost GPU): vLLM may not notice for a long time, or hang in the
// driver. Its tree is killed; the failure is then classified from the
// same evidence. True when it ended the run.
func (m *machine) checkGPUFault() bool {
	if m.s.health == nil || !m.sub.running() {
		return false
	}
	ev := m.gpuEvidence()
	if ev == nil {
		return false
	}
	what, ends := cause.LiveFault(*ev)
	if !ends {
		return false
	}
	m.s.log.Error("the GPU failed under vLLM: killing its process tree", zap.String("gpu", what))
	m.s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.r.child.pid(),
		Reason: fmt.Sprintf("GPU fault while vLLM ran: %s", what)})
	m.r.gpuKilled = true
	m.endRun(endExited) // a kill: gpuKilled
	return true
}
