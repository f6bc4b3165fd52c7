// Package group owns the guard-to-guard protocol of a vLLM that spans
// hosts: the group epoch's state machine (pure: events in, state and
// effects out, time brought by each event) and its transport (signed
// heartbeats over TCP between the leader's guard and each follower's).
//
// A death, an exit (0 included), a hang or a lost heartbeat anywhere ends
// the epoch: every member kills its whole local vLLM tree; the leader
// opens the next epoch once every member says its tree is gone, starts its
// own vLLM first, and tells the followers, who start then. A peer says only
// what its own vLLM does at an epoch (a Kind, never text): the causes the
// machine names are its own.
package group

import (
	"fmt"
	"time"
)

// Kind is what a guard says of its own vLLM at an epoch.
type Kind uint8

const (
	// The leader's words.
	Open Kind = 1 + iota // epoch N's rendezvous is open: start your vLLM
	End                  // epoch N ended: kill your tree, say Idle
	// A follower's words.
	Running  // my vLLM of epoch N runs (or starts)
	Stopping // my vLLM of epoch N is being killed (told, or the leader lost)
	Ended    // my vLLM of epoch N ended by itself (an exit, any code, or a death)
	Hung     // my vLLM of epoch N hung (my guard judged it)
	Idle     // no vLLM tree here; N is the newest epoch I know
	// The leader's again: epoch N's vLLM passed the leader's readiness
	// gate (which implies every rank loaded): the group is ready.
	Ready
	// The leader's: its guard gave up after epoch N (its policy, once for
	// the group): no epoch opens until it is started again.
	GaveUp

	lastKind = GaveUp
)

var kindNames = [...]string{Open: "open", End: "end", Running: "running", Stopping: "stopping", Ended: "ended", Hung: "hung", Idle: "idle", Ready: "ready", GaveUp: "gave_up"}

// Word is the kind's name, "" for none (0).
func (k Kind) Word() string {
	if k == 0 {
		return ""
	}
	return k.String()
}

func (k Kind) String() string {
	if k >= Open && k <= lastKind {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Report is what one guard says: its Kind at an epoch, and with Open the
// rung the leader started on (the followers start on the same). A
// follower's Idle also says the cause its own guard gave the end of its
// own vLLM (Fault), when that vLLM ended by itself: the leader's ladder
// reacts to it (an OOM anywhere steps the group down).
type Report struct {
	Kind  Kind
	Epoch uint64
	Rung  int
	Fault Fault
}

// Fault is the cause a guard gave the end of its own host's vLLM, as a
// code of a closed table (never text): the words are the guard's causes
// (docs/how-it-decides.md). 0: none (it did not end by itself, or has no
// cause yet).
type Fault uint8

var faultWords = [...]string{1: "oom", 2: "kv_insufficient", 3: "gpu_busy", 4: "config_error", 5: "hang", 6: "crash", 7: "host_oom", 8: "gpu_fault"}

const lastFault = Fault(len(faultWords) - 1)

// FaultOf is the code of a cause's word; 0 for "" or a word not in the
// table (the group's own cause, "group", is never sent).
func FaultOf(word string) Fault {
	for i, w := range faultWords {
		if w != "" && w == word {
			return Fault(i)
		}
	}
	return 0
}

// Word is the cause's word ("" for none).
func (f Fault) Word() string {
	if f == 0 || f > lastFault {
		return ""
	}
	return faultWords[f]
}

// Config is the machine's share of [group].
type Config struct {
	Rank, Size  int
	LossTimeout time.Duration
}

// Phase is where the machine is in an epoch.
type Phase uint8

const (
	// The leader's phases.
	Ending  Phase = iota // epoch N ended (or none began): waiting for every tree to be gone
	Opening              // every tree gone: its own vLLM may start (FxStart), then it says Open
	Serving              // epoch N runs on every member
	// A follower's.
	Waiting   // no tree here: waiting for the leader's Open
	Started   // its vLLM of the epoch runs
	Finishing // its tree is being killed
)

var phaseNames = [...]string{Ending: "ending", Opening: "opening", Serving: "serving", Waiting: "waiting", Started: "started", Finishing: "finishing"}

func (p Phase) String() string { return phaseNames[p] }

// Member is what a guard knows of another: the leader of each follower,
// a follower of the leader.
type Member struct {
	// Incarnation is the peer guard's start (a random number each start);
	// 0: never heard.
	Incarnation uint64
	Heard       time.Time // the last authenticated report's arrival
	Said        Report
	// Gone: it said Idle at the ended epoch or later (leader's view).
	Gone bool
}

// Present reports whether the member was heard within the loss timeout.
func (m Member) Present(now time.Time, loss time.Duration) bool {
	return m.Incarnation != 0 && now.Sub(m.Heard) <= loss
}

// State is one guard's view of the group.
type State struct {
	Cfg   Config
	Phase Phase
	// Epoch: the leader's current (or last ended) epoch; a follower's
	// newest known.
	Epoch uint64
	Rung  int
	// LocalGone: no vLLM tree of this host is left.
	LocalGone bool
	// LocalReady: the leader's vLLM of the epoch passed its readiness gate.
	LocalReady bool
	// GaveUp: the leader's guard gave up: it opens no epoch again.
	GaveUp bool
	// Members: the leader's view, by rank (its own slot unused); a
	// follower's, only the leader at 0.
	Members []Member
	// A follower's: the epoch its vLLM last started for, an Open it
	// will start once its tree is gone, and what it says while stopping.
	Ran     uint64
	Pending Report
	Saying  Kind
	// Fault: the cause of this follower's own vLLM's last end, said with
	// its Idle until its next start.
	Fault Fault
	// LeaderReady: the leader said Ready for the epoch this follower's
	// vLLM runs, since it started.
	LeaderReady bool
}

// New is the machine of rank cfg.Rank before anything is heard: the
// leader waits for every member, a follower for the leader's Open.
func New(cfg Config) State {
	s := State{Cfg: cfg, LocalGone: true, Phase: Waiting, Members: make([]Member, 1)}
	if cfg.Rank == 0 {
		s.Phase, s.Members = Ending, make([]Member, cfg.Size)
	}
	return s
}

// Leader reports whether this machine is the leader's.
func (s State) Leader() bool { return s.Cfg.Rank == 0 }

// Say is what this guard says now (the transport sends it at once after
// an FxSay and again at every heartbeat).
func (s State) Say() Report {
	switch s.Phase {
	case Serving:
		if s.LocalReady {
			return Report{Kind: Ready, Epoch: s.Epoch, Rung: s.Rung}
		}
		return Report{Kind: Open, Epoch: s.Epoch, Rung: s.Rung}
	case Ending, Opening:
		if s.GaveUp {
			return Report{Kind: GaveUp, Epoch: s.Epoch}
		}
		return Report{Kind: End, Epoch: s.Epoch}
	case Started:
		return Report{Kind: Running, Epoch: s.Ran}
	case Finishing:
		return Report{Kind: s.Saying, Epoch: s.Ran}
	}
	return Report{Kind: Idle, Epoch: s.Epoch, Fault: s.Fault}
}

// GroupReady reports whether the group serves: the leader's vLLM of the
// epoch is ready (on a follower: the leader said so for the epoch its own
// vLLM runs). A follower's vLLM serves no HTTP: this is its readiness.
func (s State) GroupReady() bool {
	if s.Leader() {
		return s.Phase == Serving && s.LocalReady
	}
	return s.Phase == Started && s.LeaderReady
}
