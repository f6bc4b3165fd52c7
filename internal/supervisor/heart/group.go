package heart

import (
	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// A member of a vLLM across hosts ([group]; internal/group runs the
// epochs): its vLLM starts only on the group's go (the leader's guard
// once every host's tree is gone; a follower's once the leader's vLLM
// started), and the end of the group's epoch kills its tree whatever its
// sub-state. Both words come alike in every sub-state (no column).

// GroupWait is the start that waits for the group's go.
type GroupWait struct {
	Rung policy.Rung
	GPUs []cause.GPUDevice
	Go   bool // the go came (it may come before the start reaches it)
}

// WaitGroup holds a start until the group's go: it says the tree is gone
// and enters wait_group. False: no group, or the go came; start.
func (m *Core) WaitGroup(rung policy.Rung, gpus []cause.GPUDevice, heldBy string) bool {
	if !m.Cfg.Group.Enabled || heldBy != "" {
		return false
	}
	if m.Gw.Go {
		m.Gw = GroupWait{}
		return false
	}
	m.Gw = GroupWait{Rung: rung, GPUs: gpus}
	m.Enter(SubWaitGroup, "waiting for the group: this host's vLLM starts when the group's leader says so", nil)
	m.Do(FxGroupGone{})
	return true
}

// OnGroup: the group's go starts a start that waits for it (or is kept
// for the next); the epoch's end takes any go back and kills a running
// tree (a failure: the policy decides the next start, which waits for the
// go again).
func (m *Core) OnGroup(e Event) {
	if e.Kind == EvGroupGo {
		m.Gw.Go = true
		if m.Sub == SubWaitGroup && !m.StopAsked {
			m.Start(m.Gw.Rung, m.Gw.GPUs, "")
		}
		return
	}
	m.Gw.Go = false
	if m.Sub.Running() && m.R.End == EndNone {
		m.Hung("the group's epoch ended: " + e.Group)
	}
}
