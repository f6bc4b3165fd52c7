package heart

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
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
	// Led: the go brought a rung, Leader: the start takes it, whatever the
	// policy said before the go (a follower's: the leader's rung; the
	// leader's: its ladder's answer to a member's end).
	Led    bool
	Leader policy.Rung
}

// WaitGroup holds a start until the group's go: it says the tree is gone
// and enters wait_group. False: no group, or the go came; start, on the
// rung returned (a follower's: the leader's).
func (m *Core) WaitGroup(rung policy.Rung, gpus []cause.GPUDevice, heldBy string) (policy.Rung, bool) {
	if !m.Cfg.Group.Enabled || heldBy != "" {
		return rung, false
	}
	if m.Gw.Go {
		if m.Gw.Led {
			rung = m.Gw.Leader
		}
		m.Gw = GroupWait{}
		return rung, false
	}
	m.Gw = GroupWait{Rung: rung, GPUs: gpus}
	m.Enter(SubWaitGroup, "waiting for the group: this host's vLLM starts when the group's leader says so", nil)
	m.Do(FxGroupGone{})
	return rung, true
}

// GroupFollower: this host's vLLM is a follower's of a group: the
// leader's guard decides its next start.
func (m *Core) GroupFollower() bool { return m.Cfg.Group.Enabled && m.Cfg.Group.Rank != 0 }

// FollowerDecision is a follower's decision after any end of its run: no
// backoff and no give-up of its own (the leader's policy counts the
// group's end once, and decides the rung, the backoff and the give-up);
// it waits for the leader's next epoch, on the leader's rung. A GPU of its
// own that failed stays its own policy's (a host to drain).
func (m *Core) FollowerDecision(v cause.Verdict) (policy.Decision, bool) {
	if !m.GroupFollower() || v.Cause == cause.CauseGPUFault {
		return policy.Decision{}, false
	}
	return policy.Decision{Action: policy.ActionRestart, Rung: m.Facts.Rung,
		Reason: "the group's leader decides the next start (its rung, backoff and give-up, once for the group): waiting for its next epoch"}, true
}

// OnGroup: the group's go starts a start that waits for it (or is kept
// for the next); the epoch's end takes any go back and kills a running
// tree (a failure: the policy decides the next start, which waits for the
// go again). A leader's go may bring its ladder's answer to a member's
// end (Decision): a new rung, said, or a give-up.
func (m *Core) OnGroup(e Event) {
	if e.Kind == EvGroupGo {
		if m.afterMember(e) {
			return
		}
		m.Gw.Go = true
		if e.Led {
			m.Gw.Led, m.Gw.Leader = true, e.Rung
		}
		if m.Sub == SubWaitGroup && !m.StopAsked {
			m.Start(m.Gw.Rung, m.Gw.GPUs, "")
		}
		return
	}
	m.Gw.Go = false
	if m.Sub.Running() && m.R.End == EndNone {
		g := e.GroupEnd
		m.R.Group = &g
		m.Hung(fmt.Sprintf("the group's epoch %d ended: %s", g.Epoch, g.Why))
	}
}

// afterMember: the leader's ladder answered the end a member's guard
// named (e.Verdict): the decision is said, and a give-up ends here; true
// when the go is not taken.
func (m *Core) afterMember(e Event) bool {
	d := e.Decision
	if d.Reason == "" {
		return false
	}
	if d.Action != policy.ActionGiveUp {
		m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Rung: &d.Rung, Reason: d.Reason})
		m.Log().Warn("the group's ladder reacts to a member's end", zap.String("cause", string(e.Verdict.Cause)), zap.String("reason", d.Reason))
		return false
	}
	between := m.Sub >= SubCheckGPU && m.Sub <= SubWaitGroup || m.Sub == SubReleasing || m.Sub == SubBackoff
	if !between || m.StopAsked {
		return false
	}
	for _, t := range []TimerKind{TRelease, TBackoff, TFreeMemory, TPortRetry} {
		m.Disarm(t)
	}
	m.Gw = GroupWait{}
	m.GiveUp(Failure{Time: m.Now, Verdict: e.Verdict, Decision: d, RungBefore: m.Facts.Rung})
	return true
}
