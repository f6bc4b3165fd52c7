package group

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

const loss = 5 * time.Second

func at(d time.Duration) time.Time { return t0.Add(d) }

func heard(from int, inc uint64, k Kind, epoch uint64, now time.Duration) Event {
	return Event{Kind: EvHeard, Now: at(now), From: from, Incarnation: inc, Said: Report{Kind: k, Epoch: epoch}}
}

func tick(now time.Duration) Event      { return Event{Kind: EvTick, Now: at(now)} }
func localGone(now time.Duration) Event { return Event{Kind: EvLocalGone, Now: at(now)} }
func localEnded(hung bool) Event        { return Event{Kind: EvLocalEnded, Now: at(0), Hung: hung} }
func launched(epoch uint64) Event {
	return Event{Kind: EvLocalLaunched, Now: at(0), Epoch: epoch, Rung: 1}
}
func openFrom(inc uint64, epoch uint64) Event { return heard(0, inc, Open, epoch, 0) }

// run feeds events in order and returns the state and the last event's effects.
func run(t *testing.T, s State, evs ...Event) (State, []Effect) {
	t.Helper()
	var fx []Effect
	for _, e := range evs {
		s, fx = Step(s, e)
	}
	return s, fx
}

// A leader of three (two followers, incarnations 11 and 12) serving epoch 1.
func leaderServing(t *testing.T) State {
	s, fx := run(t, New(Config{Rank: 0, Size: 3, LossTimeout: loss}),
		heard(1, 11, Idle, 0, 0), heard(2, 12, Idle, 0, 0))
	if want := []Effect{{Kind: FxStart, Epoch: 1}}; !reflect.DeepEqual(fx, want) || s.Phase != Opening {
		t.Fatalf("every member idle: %v %v, want %v opening", s.Phase, fx, want)
	}
	s, fx = Step(s, launched(1))
	if s.Phase != Serving || s.Say() != (Report{Kind: Open, Epoch: 1, Rung: 1}) || len(fx) != 1 || fx[0].Kind != FxSay {
		t.Fatalf("launched: %v says %v, %v", s.Phase, s.Say(), fx)
	}
	return s
}

// A follower (rank 1, its leader incarnation 10) running epoch 1 on rung 1.
func followerStarted(t *testing.T) State {
	s, fx := Step(New(Config{Rank: 1, Size: 3, LossTimeout: loss}), Event{Kind: EvHeard, Now: at(0), From: 0, Incarnation: 10, Said: Report{Kind: Open, Epoch: 1, Rung: 1}})
	want := []Effect{{Kind: FxStart, Epoch: 1, Rung: 1}, {Kind: FxSay, Epoch: 1}}
	if s.Phase != Started || !reflect.DeepEqual(fx, want) || s.Say() != (Report{Kind: Running, Epoch: 1}) {
		t.Fatalf("the leader's Open: %v %v says %v", s.Phase, fx, s.Say())
	}
	return s
}

func ended(epoch uint64, c Cause, kill bool) []Effect {
	fx := []Effect{{Kind: FxEnded, Epoch: epoch, Cause: c}}
	if kill {
		fx = append(fx, Effect{Kind: FxKill, Epoch: epoch, Cause: c})
	}
	return append(fx, Effect{Kind: FxSay, Epoch: epoch})
}

func TestLeaderTable(t *testing.T) {
	cases := []struct {
		name  string
		from  func(*testing.T) State
		evs   []Event
		phase Phase
		fx    []Effect
		say   Report
	}{
		{"the leader's own vLLM dies", leaderServing, []Event{localEnded(false)}, Ending, ended(1, Cause{Why: LocalEnded}, true), Report{Kind: End, Epoch: 1}},
		{"the leader's own vLLM hangs", leaderServing, []Event{localEnded(true)}, Ending, ended(1, Cause{Why: LocalHung}, true), Report{Kind: End, Epoch: 1}},
		{"a follower's worker dies", leaderServing, []Event{heard(2, 12, Ended, 1, time.Second)}, Ending, ended(1, Cause{Why: MemberEnded, Member: 2, Word: Ended}, true), Report{Kind: End, Epoch: 1}},
		{"a follower exits 0 (its tree gone, nothing said)", leaderServing, []Event{heard(2, 12, Idle, 1, time.Second)}, Ending, ended(1, Cause{Why: MemberEnded, Member: 2, Word: Idle}, true), Report{Kind: End, Epoch: 1}},
		{"a follower hangs", leaderServing, []Event{heard(1, 11, Hung, 1, time.Second)}, Ending, ended(1, Cause{Why: MemberHung, Member: 1}, true), Report{Kind: End, Epoch: 1}},
		{"a follower lost its leader", leaderServing, []Event{heard(1, 11, Stopping, 1, time.Second)}, Ending, ended(1, Cause{Why: MemberStopped, Member: 1}, true), Report{Kind: End, Epoch: 1}},
		{"a heartbeat lost", leaderServing, []Event{heard(1, 11, Running, 1, 4*time.Second), tick(loss), tick(loss + time.Millisecond)}, Ending, ended(1, Cause{Why: MemberLost, Member: 2}, true), Report{Kind: End, Epoch: 1}},
		{"a recreated member announces a fresh start", leaderServing, []Event{heard(2, 99, Idle, 0, time.Second)}, Ending, ended(1, Cause{Why: MemberRestarted, Member: 2}, true), Report{Kind: End, Epoch: 1}},
		{"its vLLM ready: the group is ready", leaderServing, []Event{{Kind: EvLocalReady, Now: at(0), Epoch: 1}}, Serving, []Effect{{Kind: FxSay, Epoch: 1, Rung: 1}}, Report{Kind: Ready, Epoch: 1, Rung: 1}},
		{"an older epoch's ready ignored", leaderServing, []Event{{Kind: EvLocalReady, Now: at(0), Epoch: 0}}, Serving, nil, Report{Kind: Open, Epoch: 1, Rung: 1}},
		{"ready, then a member ends: not ready", leaderServing, []Event{{Kind: EvLocalReady, Now: at(0), Epoch: 1}, heard(1, 11, Ended, 1, time.Second)}, Ending, ended(1, Cause{Why: MemberEnded, Member: 1, Word: Ended}, true), Report{Kind: End, Epoch: 1}},
		{"alive at the epoch", leaderServing, []Event{heard(1, 11, Running, 1, time.Second), heard(2, 12, Running, 1, time.Second), tick(loss)}, Serving, nil, Report{Kind: Open, Epoch: 1, Rung: 1}},
		{"not started yet: the Open is on its way", leaderServing, []Event{heard(1, 11, Idle, 0, time.Second)}, Serving, nil, Report{Kind: Open, Epoch: 1, Rung: 1}},
		{"a stale epoch's word ignored", leaderServing, []Event{heard(1, 11, Ended, 0, time.Second), heard(2, 12, Hung, 0, time.Second)}, Serving, nil, Report{Kind: Open, Epoch: 1, Rung: 1}},
		{"a future epoch's word ignored", leaderServing, []Event{heard(1, 11, Ended, 7, time.Second)}, Serving, nil, Report{Kind: Open, Epoch: 1, Rung: 1}},
		{"no member 0 or 3", leaderServing, []Event{heard(0, 5, Ended, 1, time.Second), heard(3, 5, Ended, 1, time.Second), heard(-1, 5, Ended, 1, time.Second)}, Serving, nil, Report{Kind: Open, Epoch: 1, Rung: 1}},
		{"every tree gone: the leader starts first", leaderServing, []Event{heard(2, 12, Ended, 1, time.Second), localGone(time.Second), heard(1, 11, Idle, 1, 2*time.Second), heard(2, 12, Idle, 1, 2*time.Second)},
			Opening, []Effect{{Kind: FxStart, Epoch: 2, Rung: 1}}, Report{Kind: End, Epoch: 1}},
		{"a member idle at an older epoch is not gone", leaderServing, []Event{heard(2, 12, Ended, 1, time.Second), localGone(time.Second), heard(1, 11, Idle, 0, 2*time.Second), heard(2, 12, Idle, 1, 2*time.Second)},
			Ending, nil, Report{Kind: End, Epoch: 1}},
		{"the leader's tree not gone yet", leaderServing, []Event{heard(2, 12, Ended, 1, time.Second), heard(1, 11, Idle, 1, 2*time.Second), heard(2, 12, Idle, 1, 2*time.Second)},
			Ending, nil, Report{Kind: End, Epoch: 1}},
		{"a member absent: no new epoch without it", leaderServing, []Event{heard(2, 12, Ended, 1, time.Second), localGone(time.Second), heard(2, 12, Idle, 1, 2*time.Second), heard(1, 11, Idle, 1, 9*time.Second), tick(9 * time.Second)},
			Ending, nil, Report{Kind: End, Epoch: 1}},
		{"the leader's start failed before launch: it starts again once gone", leaderServing, []Event{heard(2, 12, Ended, 1, time.Second), localGone(time.Second), heard(1, 11, Idle, 1, 2*time.Second), heard(2, 12, Idle, 1, 2*time.Second), localEnded(false), localGone(2 * time.Second)},
			Opening, []Effect{{Kind: FxStart, Epoch: 2, Rung: 1}}, Report{Kind: End, Epoch: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, fx := run(t, tc.from(t), tc.evs...)
			if s.Phase != tc.phase || !reflect.DeepEqual(fx, tc.fx) || s.Say() != tc.say {
				t.Errorf("got %v %v says %v; want %v %v says %v", s.Phase, fx, s.Say(), tc.phase, tc.fx, tc.say)
			}
		})
	}
}

// A leader that starts again (its epoch 0) learns the epochs it missed
// from its members, tells them it ended them, and opens a newer one.
func TestLeaderStartedAgainLearnsTheEpoch(t *testing.T) {
	s := New(Config{Rank: 0, Size: 3, LossTimeout: loss})
	s, fx := Step(s, heard(1, 11, Idle, 5, 0))
	if s.Epoch != 5 || !reflect.DeepEqual(fx, []Effect{{Kind: FxSay, Epoch: 5}}) || s.Say() != (Report{Kind: End, Epoch: 5}) {
		t.Fatalf("epoch %d %v says %v, want 5 and End 5 said", s.Epoch, fx, s.Say())
	}
	s, fx = Step(s, heard(2, 12, Idle, 3, 0))
	if len(fx) != 0 {
		t.Fatalf("member 2 idle at 3 (before End 5 reached it): %v", fx)
	}
	s, fx = Step(s, heard(2, 12, Idle, 5, 0))
	if want := []Effect{{Kind: FxStart, Epoch: 6}}; !reflect.DeepEqual(fx, want) {
		t.Fatalf("every member idle at 5: %v, want %v", fx, want)
	}
}

func TestFollowerTable(t *testing.T) {
	stopped := func(say Kind) Report { return Report{Kind: say, Epoch: 1} }
	cases := []struct {
		name  string
		evs   []Event
		phase Phase
		fx    []Effect
		say   Report
	}{
		{"the leader ends the epoch", []Event{heard(0, 10, End, 1, time.Second)}, Finishing, ended(1, Cause{Why: LeaderEnded}, true), stopped(Stopping)},
		{"the leader dies: its heartbeat lost", []Event{tick(loss), tick(loss + time.Millisecond)}, Finishing, ended(1, Cause{Why: LeaderLost}, true), stopped(Stopping)},
		{"the leader's guard started again", []Event{heard(0, 77, End, 0, time.Second)}, Finishing, ended(1, Cause{Why: LeaderRestarted}, true), stopped(Stopping)},
		{"its own worker dies", []Event{localEnded(false)}, Finishing, ended(1, Cause{Why: LocalEnded}, true), stopped(Ended)},
		{"its own vLLM hangs", []Event{localEnded(true)}, Finishing, ended(1, Cause{Why: LocalHung}, true), stopped(Hung)},
		{"its vLLM exits 0, tree gone at once", []Event{localGone(time.Second)}, Waiting,
			[]Effect{{Kind: FxEnded, Epoch: 1, Cause: Cause{Why: LocalEnded}}, {Kind: FxSay, Epoch: 1}}, Report{Kind: Idle, Epoch: 1}},
		{"killed, then gone: idle at the epoch", []Event{heard(0, 10, End, 1, time.Second), localGone(time.Second)}, Waiting, []Effect{{Kind: FxSay, Epoch: 1}}, Report{Kind: Idle, Epoch: 1}},
		{"the next Open waits for its tree to be gone", []Event{heard(0, 10, End, 1, time.Second), openFrom(10, 2)}, Finishing, nil, stopped(Stopping)},
		{"then starts it", []Event{heard(0, 10, End, 1, time.Second), openFrom(10, 2), localGone(time.Second)}, Started,
			[]Effect{{Kind: FxSay, Epoch: 2}, {Kind: FxStart, Epoch: 2}, {Kind: FxSay, Epoch: 2}}, Report{Kind: Running, Epoch: 2}},
		{"an Open of a newer epoch ends a missed one", []Event{openFrom(10, 3)}, Finishing, ended(1, Cause{Why: LeaderEnded}, true), stopped(Stopping)},
		{"its epoch's Open is a heartbeat", []Event{openFrom(10, 1), tick(time.Second)}, Started, nil, Report{Kind: Running, Epoch: 1}},
		{"a stale epoch's End ignored", []Event{heard(0, 10, End, 0, time.Second)}, Started, nil, Report{Kind: Running, Epoch: 1}},
		{"a stale Open ignored", []Event{openFrom(10, 0)}, Started, nil, Report{Kind: Running, Epoch: 1}},
		{"only the leader is heard", []Event{heard(2, 12, End, 1, time.Second), heard(1, 12, End, 1, time.Second)}, Started, nil, Report{Kind: Running, Epoch: 1}},
		{"the leader lost: its last Open is not started", []Event{heard(0, 10, End, 1, time.Second), openFrom(10, 2), tick(time.Second + loss + time.Millisecond), localGone(7 * time.Second)},
			Waiting, []Effect{{Kind: FxSay, Epoch: 2}}, Report{Kind: Idle, Epoch: 2}},
		{"the leader heard again after a kill: the late exit is its own", []Event{heard(0, 10, End, 1, time.Second), localEnded(false)}, Finishing, nil, stopped(Stopping)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, fx := run(t, followerStarted(t), tc.evs...)
			if s.Phase != tc.phase || !reflect.DeepEqual(fx, tc.fx) || s.Say() != tc.say {
				t.Errorf("got %v %v says %v; want %v %v says %v", s.Phase, fx, s.Say(), tc.phase, tc.fx, tc.say)
			}
		})
	}
}

// A waiting follower that hears an End of a newer epoch says it is idle
// at it (what the leader waits for before it opens the next).
func TestFollowerIdleLearnsTheEpoch(t *testing.T) {
	s, fx := Step(New(Config{Rank: 2, Size: 3, LossTimeout: loss}), heard(0, 10, End, 4, 0))
	if s.Say() != (Report{Kind: Idle, Epoch: 4}) || !reflect.DeepEqual(fx, []Effect{{Kind: FxSay, Epoch: 4}}) {
		t.Errorf("says %v %v, want idle at 4", s.Say(), fx)
	}
}

// A follower's guard started again while the group serves hears the
// leader's Ready of the running epoch: that epoch's rendezvous is over (the
// leader is ready without this host), so it starts nothing and waits idle
// at it; the leader ends it (a new incarnation) and its next Open starts
// this host. On the old code it started a vLLM for the running epoch,
// killed at once by the End.
func TestAFollowerStartedAgainWaitsForTheNextOpen(t *testing.T) {
	s, fx := Step(New(Config{Rank: 1, Size: 2, LossTimeout: loss}), heard(0, 10, Ready, 3, 0))
	if want := []Effect{{Kind: FxSay, Epoch: 3}}; s.Phase != Waiting || !reflect.DeepEqual(fx, want) || s.Say() != (Report{Kind: Idle, Epoch: 3}) {
		t.Fatalf("the leader's Ready of the running epoch: %v %v says %v, want waiting, nothing started, idle at 3", s.Phase, fx, s.Say())
	}
	s, fx = run(t, s, heard(0, 10, End, 3, time.Second), openFrom(10, 4))
	if want := []Effect{{Kind: FxStart, Epoch: 4}, {Kind: FxSay, Epoch: 4}}; s.Phase != Started || !reflect.DeepEqual(fx, want) {
		t.Errorf("the End, then the next Open: %v %v, want started at 4 %v", s.Phase, fx, want)
	}
}

// The group is ready when the leader's vLLM of the epoch is; a follower
// (whose vLLM serves no HTTP) is ready when the leader says so for the
// epoch its own vLLM runs.
func TestGroupReady(t *testing.T) {
	l := leaderServing(t)
	if l.GroupReady() {
		t.Error("launched is not ready")
	}
	l, _ = Step(l, Event{Kind: EvLocalReady, Now: at(0), Epoch: 1})
	if !l.GroupReady() {
		t.Error("the leader's vLLM ready: the group is")
	}
	f := followerStarted(t)
	if f.GroupReady() {
		t.Error("a follower before the leader's word is not ready")
	}
	f, fx := Step(f, Event{Kind: EvHeard, Now: at(time.Second), From: 0, Incarnation: 10, Said: Report{Kind: Ready, Epoch: 1, Rung: 1}})
	if !f.GroupReady() || len(fx) != 0 {
		t.Errorf("the leader says ready: %v %v", f.GroupReady(), fx)
	}
	f, _ = Step(f, heard(0, 10, End, 1, 2*time.Second))
	if f.GroupReady() {
		t.Error("a follower stopping is not ready")
	}
	w, fx := Step(New(Config{Rank: 1, Size: 2, LossTimeout: loss}), Event{Kind: EvHeard, Now: at(0), From: 0, Incarnation: 10, Said: Report{Kind: Ready, Epoch: 4, Rung: 2}})
	if want := []Effect{{Kind: FxSay, Epoch: 4}}; !reflect.DeepEqual(fx, want) || w.GroupReady() {
		t.Errorf("a waiting follower hearing Ready 4 starts nothing (the epoch's rendezvous is over) and is not ready: %v %v", fx, w.GroupReady())
	}
}

// The word a cause names is the member's Kind (or none), never text.
func TestACauseSaysTheMembersWord(t *testing.T) {
	for _, c := range []struct {
		c    Cause
		want string
	}{
		{Cause{Why: MemberEnded, Member: 1, Word: Ended}, "ended"},
		{Cause{Why: MemberEnded, Member: 1, Word: Idle}, "idle"},
		{Cause{Why: MemberHung, Member: 1}, "hung"},
		{Cause{Why: MemberStopped, Member: 1}, "stopping"},
		{Cause{Why: LeaderEnded}, "end"},
		{Cause{Why: MemberLost, Member: 1}, ""},
		{Cause{Why: LeaderRestarted}, ""},
		{Cause{Why: LocalEnded}, ""},
	} {
		if got := c.c.Said().Word(); got != c.want {
			t.Errorf("%v: said %q, want %q", c.c, got, c.want)
		}
	}
}

// A follower whose own vLLM ended by itself says, with its Idle, the cause
// its guard gave that end; the leader opens the next epoch with the cause
// its ladder must react to first, and who said it. A follower killed for
// the group says none.
func TestTheLeaderLearnsAMembersFault(t *testing.T) {
	f := followerStarted(t)
	f, _ = run(t, f, localEnded(false), Event{Kind: EvLocalGone, Now: at(time.Second), Fault: FaultOf("oom")})
	if got := f.Say(); got != (Report{Kind: Idle, Epoch: 1, Fault: FaultOf("oom")}) {
		t.Fatalf("a follower whose vLLM ran out of memory says %+v", got)
	}
	// Its next start forgets it.
	f, _ = Step(f, openFrom(10, 2))
	if f.Phase != Started || f.Fault != 0 {
		t.Fatalf("after the next Open: %v fault %v", f.Phase, f.Fault)
	}

	s := leaderServing(t)
	s, _ = run(t, s, heard(2, 12, Ended, 1, time.Second), localEnded(false), localGone(time.Second),
		Event{Kind: EvHeard, Now: at(2 * time.Second), From: 1, Incarnation: 11, Said: Report{Kind: Idle, Epoch: 1, Fault: FaultOf("crash")}})
	if s.Phase != Ending {
		t.Fatalf("member 2 not gone yet: %v", s.Phase)
	}
	s, fx := Step(s, Event{Kind: EvHeard, Now: at(2 * time.Second), From: 2, Incarnation: 12, Said: Report{Kind: Idle, Epoch: 1, Fault: FaultOf("oom")}})
	want := []Effect{{Kind: FxStart, Epoch: 2, Rung: 1, Member: 2, Fault: FaultOf("oom")}}
	if s.Phase != Opening || !reflect.DeepEqual(fx, want) {
		t.Fatalf("every member gone: %v %+v, want %+v (the OOM before the crash)", s.Phase, fx, want)
	}
	// The leader's own end: no member's fault.
	s = leaderServing(t)
	s, fx = run(t, s, localEnded(false), localGone(time.Second),
		Event{Kind: EvHeard, Now: at(2 * time.Second), From: 2, Incarnation: 12, Said: Report{Kind: Idle, Epoch: 1}},
		Event{Kind: EvHeard, Now: at(2 * time.Second), From: 1, Incarnation: 11, Said: Report{Kind: Idle, Epoch: 1}})
	if len(fx) != 1 || fx[0].Kind != FxStart || fx[0].Fault != 0 {
		t.Fatalf("the leader's own end: %+v, want a start with no member's fault", fx)
	}
}

// A leader whose guard gave up says so and opens no epoch again, whoever
// is gone; a follower running its vLLM stops it, naming the give-up.
func TestALeaderThatGaveUpOpensNothing(t *testing.T) {
	s := leaderServing(t)
	s, _ = run(t, s, localEnded(false), localGone(time.Second))
	s, fx := Step(s, Event{Kind: EvLocalGaveUp, Now: at(time.Second)})
	if s.Say() != (Report{Kind: GaveUp, Epoch: 1}) || !reflect.DeepEqual(fx, []Effect{{Kind: FxSay, Epoch: 1}}) {
		t.Fatalf("gave up: says %+v, %+v", s.Say(), fx)
	}
	s, fx = run(t, s, heard(1, 11, Idle, 1, 2*time.Second), heard(2, 12, Idle, 1, 2*time.Second), tick(3*time.Second))
	if s.Phase != Ending || len(fx) != 0 {
		t.Fatalf("every member gone after the give-up: %v %+v, want no start", s.Phase, fx)
	}

	f := followerStarted(t)
	f, fx = Step(f, heard(0, 10, GaveUp, 1, time.Second))
	c := Cause{Why: LeaderGaveUp}
	if f.Phase != Finishing || !reflect.DeepEqual(fx, ended(1, c, true)) || c.Said() != GaveUp || !strings.Contains(c.String(), "gave up") {
		t.Fatalf("the follower hears the give-up: %v %+v", f.Phase, fx)
	}
}
