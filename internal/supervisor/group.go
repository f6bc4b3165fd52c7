package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
)

// Group is a member of a vLLM across hosts ([group]), as the supervisor
// sees it (internal/guard runs it over internal/group): what the
// supervisor tells it of this host's vLLM, from its loop (each call
// returns at once), and what it reads of it.
type Group interface {
	Launched(r policy.Rung) // this host's vLLM launched
	Ready()                 // it passed the readiness gate
	Ended()                 // its run ended: an exit (of any code), a death, a kill
	// Gone: its tree is gone, its next start waits for the go; ended is
	// the cause this guard gave the run's end when it ended by itself (""
	// when the group's end killed it, or no run since).
	Gone(ended cause.Cause)
	GaveUp() // the guard gave up on this host's vLLM (its policy)
	// Follower: this host's vLLM is headless (it serves no HTTP): its
	// readiness is the group's, GroupReady.
	Follower() bool
	GroupReady() bool
}

// GroupGo: the group lets this host's vLLM start (now, or when its start
// comes). A follower starts on the leader's rung (its index on the
// ladder): the leader decides once for the group. Safe from any goroutine.
func (s *Supervisor) GroupGo(rung int) {
	e := event{Kind: heart.EvGroupGo}
	if s.group != nil && s.group.Follower() {
		e.Led, e.Rung = true, policy.Rung{Index: rung}
	}
	s.postGroup(e)
}

// GroupGoAfter: the group lets the leader's vLLM start, and a member's
// guard said its own vLLM ended the last epoch with cause c: the leader's
// ladder reacts to it as the go is taken (an OOM steps the group down, a
// configuration error gives up). Safe from any goroutine.
func (s *Supervisor) GroupGoAfter(member int, c cause.Cause) {
	s.postGroup(event{Kind: heart.EvGroupGo, Member: member,
		Verdict: cause.Verdict{Cause: c, Summary: fmt.Sprintf("member %d's guard says its vLLM ended: %s", member, c)}})
}

// followLeader puts a follower's policy on the leader's rung as its go is
// taken by the loop, and hands the heart that rung; on the leader, it asks
// the ladder's answer to the member's end the go brings.
func (s *Supervisor) followLeader(e event) event {
	if e.Kind != heart.EvGroupGo {
		return e
	}
	switch {
	case e.Led:
		s.withPolicy(func(p *policy.Policy) { e.Rung = p.Follow(e.Rung.Index) })
	case e.Verdict.Cause != "":
		s.withPolicy(func(p *policy.Policy) { e.Decision = p.AfterMember(e.Member, e.Verdict) })
		if e.Decision.Reason != "" && e.Decision.Action != policy.ActionGiveUp {
			e.Led, e.Rung = true, e.Decision.Rung
		}
	default:
		return e
	}
	s.savePolicy()
	return e
}

// GroupEnd: the group's epoch ended, because of end: this host's vLLM
// tree is killed (a failure of cause group) and its next start waits for
// the go.
func (s *Supervisor) GroupEnd(end cause.GroupEnd) {
	s.postGroup(event{Kind: heart.EvGroupEnd, GroupEnd: end})
}

func (s *Supervisor) postGroup(e event) {
	select {
	case s.groupEv <- e:
	default:
		s.log.Error("the group's word was dropped: the supervisor's queue is full")
	}
}

// groupTook tells the group what an event says of this host's run.
func (m *machine) groupTook(e event) {
	g := m.s.group
	if g == nil || e.Run != m.c.RunN {
		return
	}
	switch {
	case e.Kind == heart.EvAPIGone, e.Kind == heart.EvTreeGone:
		g.Ended()
	case e.Kind == heart.EvCleaned && m.c.Sub == subCleaning && m.c.R.End != heart.EndExited:
		g.Gone("") // a stop, a restart or a restore: no cause to name
	case e.Kind == heart.EvClassified:
		// A failure: gone once its cause is known, so that the group's
		// leader hears it with the tree's end (an OOM anywhere steps the
		// group down); none when the group's end killed it.
		c := e.Verdict.Cause
		if c == cause.CauseGroup {
			c = ""
		}
		g.Gone(c)
	}
}

// groupChecker is a follower's prober: its headless vLLM serves no HTTP;
// it is ready when the group is (the leader's vLLM ready implies every
// rank loaded), and the group's heartbeats are its liveness.
type groupChecker struct{ g Group }

func (c groupChecker) Ready(context.Context, string, time.Duration) probeResult {
	if c.g.GroupReady() {
		return probeResult{OK: true, Step: "group", Probe: "group: the leader's vLLM is ready", Own: true}
	}
	return probeResult{Refused: true, Step: "group", Err: "waiting for the group's leader to be ready"}
}

func (c groupChecker) Health(context.Context, time.Duration) probeResult {
	return probeResult{OK: true, Step: "group", Own: true}
}

func (c groupChecker) Paused(context.Context, time.Duration) probeResult {
	return probeResult{OK: true, Step: "paused", Own: true}
}

func (c groupChecker) Close() {}

// joinGroup takes g as this host's member ([group]; nil: none): a
// follower's runs probe the group.
func (s *Supervisor) joinGroup(g Group) {
	s.group, s.groupEv = g, make(chan event, 64)
	if g != nil && g.Follower() {
		s.newProber = func(launch.Endpoint, string, func() []int) checker { return groupChecker{g} }
	}
}
