package group

import (
	"fmt"
	"time"
)

// EventKind is what happened.
type EventKind uint8

const (
	// EvTick: the heartbeat's timer (the loss check).
	EvTick EventKind = iota
	// EvHeard: an authenticated report from member From.
	EvHeard
	// EvLocalEnded: this host's vLLM ended (an exit of any code, a death)
	// or hung (Hung), as this host's supervisor saw it.
	EvLocalEnded
	// EvLocalGone: this host's vLLM tree is gone, nothing of it left.
	EvLocalGone
	// EvLocalLaunched: the leader's vLLM of epoch Epoch launched on rung
	// Rung (after its FxStart).
	EvLocalLaunched
	// EvLocalReady: the leader's vLLM of epoch Epoch passed its readiness
	// gate.
	EvLocalReady
	// EvLocalGaveUp: the leader's guard gave up (its policy).
	EvLocalGaveUp
)

// Event is one input of Step.
type Event struct {
	Kind        EventKind
	Now         time.Time
	From        int    // EvHeard
	Incarnation uint64 // EvHeard
	Said        Report // EvHeard
	Hung        bool   // EvLocalEnded
	Epoch       uint64 // EvLocalLaunched, EvLocalReady
	Rung        int    // EvLocalLaunched
	// Fault: EvLocalGone, the cause this host's guard gave its vLLM's
	// end, when it ended by itself (0: killed for the group, or none).
	Fault Fault
}

// EffectKind is what the machine asks for.
type EffectKind uint8

const (
	// FxKill: kill this host's whole vLLM tree (the epoch ended); report
	// EvLocalGone once nothing is left.
	FxKill EffectKind = iota
	// FxStart: this host's vLLM may start for Epoch, on Rung (a follower
	// takes the leader's). The leader reports EvLocalLaunched.
	FxStart
	// FxEnded: epoch Epoch ended, because of Cause (for the log, the
	// status and the events).
	FxEnded
	// FxSay: what this guard says changed: send it now.
	FxSay
)

// Effect is one output of Step.
type Effect struct {
	Kind  EffectKind
	Epoch uint64
	Rung  int
	Cause Cause
	// FxStart on the leader: a member whose own vLLM ended the last epoch
	// by itself, and the cause its guard gave it (Fault 0: none): the
	// leader's ladder reacts to it before the start.
	Member int
	Fault  Fault
}

// Why is the kind of a cause.
type Why uint8

const (
	LocalEnded      Why = 1 + iota // this host's vLLM ended
	LocalHung                      // this host's vLLM hung
	MemberEnded                    // a member says its vLLM ended (or is gone)
	MemberHung                     // a member says its vLLM hung
	MemberStopped                  // a member stopped its vLLM (it lost the leader)
	MemberLost                     // a member not heard for the loss timeout
	MemberRestarted                // a member's guard started again (a new incarnation)
	LeaderEnded                    // the leader ended the epoch
	LeaderGaveUp                   // the leader's guard gave up
	LeaderLost                     // the leader not heard for the loss timeout
	LeaderRestarted                // the leader's guard started again
)

// Cause is why an epoch ended, in this guard's own words: a kind and the
// member's rank, never a peer's text.
type Cause struct {
	Why    Why
	Member int
	// Word: what the member said (MemberEnded: Ended, or Idle at the
	// epoch), its Kind and nothing else of it.
	Word Kind
}

func (c Cause) String() string {
	switch c.Why {
	case 0:
		return ""
	case LocalEnded:
		return "this host's vLLM ended"
	case LocalHung:
		return "this host's vLLM hung"
	case MemberEnded:
		return fmt.Sprintf("member %d's guard says its vLLM ended", c.Member)
	case MemberHung:
		return fmt.Sprintf("member %d's guard says its vLLM hung", c.Member)
	case MemberStopped:
		return fmt.Sprintf("member %d's guard stopped its vLLM", c.Member)
	case MemberLost:
		return fmt.Sprintf("member %d not heard for the loss timeout", c.Member)
	case MemberRestarted:
		return fmt.Sprintf("member %d's guard started again", c.Member)
	case LeaderEnded:
		return "the leader ended the epoch"
	case LeaderGaveUp:
		return "the leader's guard gave up: fix the cause on the leader's host and start its guard again"
	case LeaderLost:
		return "the leader not heard for the loss timeout"
	case LeaderRestarted:
		return "the leader's guard started again"
	}
	return fmt.Sprintf("cause(%d)", c.Why)
}

// Local reports whether c is this host's own vLLM's end.
func (c Cause) Local() bool { return c.Why == LocalEnded || c.Why == LocalHung }

// Said is the word the member said that ended the epoch (0: it said
// nothing: not heard, started again, or this host's own end). The guard
// only ever names this Kind, never a peer's text.
func (c Cause) Said() Kind {
	switch c.Why {
	case MemberEnded:
		if c.Word == Idle {
			return Idle
		}
		return Ended
	case MemberHung:
		return Hung
	case MemberStopped:
		return Stopping
	case LeaderEnded:
		return End
	case LeaderGaveUp:
		return GaveUp
	}
	return 0
}

// Step is the machine: one event in, the new state and what to do out. It
// reads no clock (the event brings the time) and reaches nothing.
func Step(s State, e Event) (State, []Effect) {
	s.Members = append([]Member(nil), s.Members...)
	if s.Leader() {
		return leaderStep(s, e)
	}
	return followerStep(s, e)
}

func leaderStep(s State, e Event) (State, []Effect) {
	switch e.Kind {
	case EvTick:
		if s.Phase == Serving {
			for r := 1; r < len(s.Members); r++ {
				if !s.Members[r].Present(e.Now, s.Cfg.LossTimeout) {
					return s.end(e.Now, Cause{Why: MemberLost, Member: r})
				}
			}
		}
		return s.tryOpen(e.Now, nil)
	case EvHeard:
		return s.leaderHeard(e)
	case EvLocalEnded:
		why := LocalEnded
		if e.Hung {
			why = LocalHung
		}
		s.LocalGone = false
		if s.Phase == Opening { // the start failed before its launch
			s.Phase = Ending
			return s, nil
		}
		if s.Phase == Serving {
			return s.end(e.Now, Cause{Why: why})
		}
	case EvLocalGone:
		s.LocalGone = true
		return s.tryOpen(e.Now, nil)
	case EvLocalLaunched:
		if s.Phase == Opening && e.Epoch == s.Epoch+1 {
			s.Phase, s.Epoch, s.Rung, s.LocalGone, s.LocalReady = Serving, e.Epoch, e.Rung, false, false
			return s, []Effect{{Kind: FxSay, Epoch: s.Epoch, Rung: s.Rung}}
		}
	case EvLocalGaveUp:
		if s.GaveUp {
			return s, nil
		}
		s.GaveUp, s.Phase, s.LocalReady = true, Ending, false
		return s, []Effect{{Kind: FxSay, Epoch: s.Epoch}}
	case EvLocalReady:
		if s.Phase == Serving && e.Epoch == s.Epoch && !s.LocalReady {
			s.LocalReady = true
			return s, []Effect{{Kind: FxSay, Epoch: s.Epoch, Rung: s.Rung}}
		}
	}
	return s, nil
}

func (s State) leaderHeard(e Event) (State, []Effect) {
	r := e.From
	if r <= 0 || r >= len(s.Members) {
		return s, nil
	}
	m := &s.Members[r]
	fresh := m.Incarnation != 0 && m.Incarnation != e.Incarnation
	m.Incarnation, m.Heard, m.Said = e.Incarnation, e.Now, e.Said
	if s.Phase != Serving {
		var fx []Effect
		if e.Said.Epoch > s.Epoch && s.Phase == Ending {
			// A leader that started again learns the epochs it missed,
			// and tells every member it ended them.
			s.Epoch = e.Said.Epoch
			fx = append(fx, Effect{Kind: FxSay, Epoch: s.Epoch})
		}
		for i := range s.Members {
			said := s.Members[i].Said
			s.Members[i].Gone = said.Kind == Idle && said.Epoch >= s.Epoch
		}
		return s.tryOpen(e.Now, fx)
	}
	if fresh {
		return s.end(e.Now, Cause{Why: MemberRestarted, Member: r})
	}
	n := e.Said.Epoch
	switch {
	case e.Said.Kind == Idle && n < s.Epoch:
		// Not started yet: the Open is on its way.
	case n != s.Epoch:
		// A stale epoch's word (or one not begun): ignored.
	case e.Said.Kind == Idle || e.Said.Kind == Ended:
		return s.end(e.Now, Cause{Why: MemberEnded, Member: r, Word: e.Said.Kind})
	case e.Said.Kind == Hung:
		return s.end(e.Now, Cause{Why: MemberHung, Member: r})
	case e.Said.Kind == Stopping:
		return s.end(e.Now, Cause{Why: MemberStopped, Member: r})
	}
	return s, nil
}

// end ends the leader's epoch: every member must say Idle at it or later.
func (s State) end(now time.Time, c Cause) (State, []Effect) {
	s.Phase, s.LocalReady = Ending, false
	for r := range s.Members {
		s.Members[r].Gone = false
	}
	fx := []Effect{{Kind: FxEnded, Epoch: s.Epoch, Cause: c}}
	if !s.LocalGone {
		fx = append(fx, Effect{Kind: FxKill, Epoch: s.Epoch, Cause: c})
	}
	fx = append(fx, Effect{Kind: FxSay, Epoch: s.Epoch})
	return s.tryOpen(now, fx)
}

// tryOpen: once every tree is gone and every member is here, the leader's
// own vLLM may start the next epoch.
func (s State) tryOpen(now time.Time, fx []Effect) (State, []Effect) {
	if s.Phase != Ending || !s.LocalGone || s.GaveUp {
		return s, fx
	}
	for r := 1; r < len(s.Members); r++ {
		if m := s.Members[r]; !m.Gone || !m.Present(now, s.Cfg.LossTimeout) {
			return s, fx
		}
	}
	s.Phase = Opening
	start := Effect{Kind: FxStart, Epoch: s.Epoch + 1, Rung: s.Rung}
	start.Member, start.Fault = s.worstFault()
	return s, append(fx, start)
}

// faultOrder: the causes the leader's ladder reacts to first.
var faultOrder = []Fault{FaultOf("config_error"), FaultOf("oom"), FaultOf("kv_insufficient")}

// worstFault is, of the causes the members said with their Idle at the
// ended epoch, the one the ladder must react to first (a configuration
// error, then an OOM, then a KV cache too small, then any other), and who
// said it.
func (s State) worstFault() (int, Fault) {
	best, rank := Fault(0), 0
	rankOf := func(f Fault) int {
		for i, o := range faultOrder {
			if f == o {
				return i
			}
		}
		return len(faultOrder)
	}
	for r := 1; r < len(s.Members); r++ {
		said := s.Members[r].Said
		if said.Kind != Idle || said.Epoch != s.Epoch || said.Fault == 0 {
			continue
		}
		if best == 0 || rankOf(said.Fault) < rankOf(best) {
			best, rank = said.Fault, r
		}
	}
	return rank, best
}

func followerStep(s State, e Event) (State, []Effect) {
	switch e.Kind {
	case EvTick:
		l := s.Members[0]
		if l.Incarnation != 0 && !l.Present(e.Now, s.Cfg.LossTimeout) {
			s.Pending = Report{}
			if s.Phase == Started {
				return s.stop(Stopping, Cause{Why: LeaderLost})
			}
		}
	case EvHeard:
		if e.From == 0 {
			return s.followerHeard(e)
		}
	case EvLocalEnded:
		if s.Phase == Started {
			c, say := Cause{Why: LocalEnded}, Ended
			if e.Hung {
				c, say = Cause{Why: LocalHung}, Hung
			}
			return s.stop(say, c)
		}
	case EvLocalGone:
		var fx []Effect
		switch s.Phase {
		case Started: // gone before its end was reported: it ended
			fx = append(fx, Effect{Kind: FxEnded, Epoch: s.Ran, Cause: Cause{Why: LocalEnded}})
		case Waiting:
			return s, nil
		}
		s.Phase, s.LocalGone, s.Fault = Waiting, true, e.Fault
		fx = append(fx, Effect{Kind: FxSay, Epoch: s.Epoch})
		return s.tryStart(fx)
	}
	return s, nil
}

func (s State) followerHeard(e Event) (State, []Effect) {
	l := &s.Members[0]
	fresh := l.Incarnation != 0 && l.Incarnation != e.Incarnation
	l.Incarnation, l.Heard, l.Said = e.Incarnation, e.Now, e.Said
	var fx []Effect
	if fresh {
		s.Pending = Report{}
		if s.Phase == Started {
			s, fx = s.stop(Stopping, Cause{Why: LeaderRestarted})
		}
	}
	n := e.Said.Epoch
	switch e.Said.Kind {
	case Open, Ready:
		if n == s.Ran && s.Phase == Started {
			s.LeaderReady = e.Said.Kind == Ready
			return s, fx
		}
		if n <= s.Ran {
			return s, fx // this epoch's (or a stale) Open
		}
		if s.Phase == Started { // it missed the End of the epoch it runs
			s, fx = s.stop(Stopping, Cause{Why: LeaderEnded})
		}
		if e.Said.Kind == Ready {
			// The epoch's rendezvous is over: its leader is ready without
			// this host (a guard started again). It waits idle at the
			// epoch, which the leader ends; its next Open starts this host.
			if n > s.Epoch {
				s.Epoch = n
				fx = append(fx, Effect{Kind: FxSay, Epoch: n})
			}
			if s.Pending.Epoch <= n {
				s.Pending = Report{}
			}
			return s, fx
		}
		s.Epoch, s.Pending = max(s.Epoch, n), e.Said
		return s.tryStart(fx)
	case End, GaveUp:
		if n < s.Ran {
			return s, fx // a stale epoch's End
		}
		if s.Pending.Epoch <= n {
			s.Pending = Report{}
		}
		if s.Phase == Started {
			c := Cause{Why: LeaderEnded}
			if e.Said.Kind == GaveUp {
				c.Why = LeaderGaveUp
			}
			s, fx = s.stop(Stopping, c)
		}
		if n > s.Epoch {
			s.Epoch = n
			if s.Phase == Waiting {
				fx = append(fx, Effect{Kind: FxSay, Epoch: n})
			}
		}
	}
	return s, fx
}

// stop: a follower's vLLM of its epoch must go; it says so meanwhile.
func (s State) stop(say Kind, c Cause) (State, []Effect) {
	s.Phase, s.Saying, s.LeaderReady = Finishing, say, false
	return s, []Effect{
		{Kind: FxEnded, Epoch: s.Ran, Cause: c},
		{Kind: FxKill, Epoch: s.Ran, Cause: c},
		{Kind: FxSay, Epoch: s.Ran},
	}
}

// tryStart: a follower with no tree left starts the leader's newest Open.
func (s State) tryStart(fx []Effect) (State, []Effect) {
	if s.Phase != Waiting || s.Pending.Epoch == 0 || s.Pending.Epoch <= s.Ran {
		return s, fx
	}
	s.Phase, s.Ran, s.Rung, s.LocalGone, s.LeaderReady, s.Fault = Started, s.Pending.Epoch, s.Pending.Rung, false, false, 0
	s.Pending = Report{}
	fx = append(fx, Effect{Kind: FxStart, Epoch: s.Ran, Rung: s.Rung}, Effect{Kind: FxSay, Epoch: s.Ran})
	return s, fx
}
