package group

import (
	"math/rand/v2"
	"testing"
	"time"
)

// world is three guards (a leader, two followers) and their vLLM trees,
// over a network that delivers in order, in fake time: every fault is
// followed by one whole-group restart, and no host ever starts an epoch
// while a tree of an older one is alive anywhere.
type world struct {
	t     *testing.T
	now   time.Time
	s     []State
	tree  []uint64 // the epoch of each host's live vLLM tree (0: none)
	queue []func()
	cut   []bool // a host whose guard is silent (lost, or hung)
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, now: t0, tree: make([]uint64, 3), cut: make([]bool, 3)}
	for r := range 3 {
		w.s = append(w.s, New(Config{Rank: r, Size: 3, LossTimeout: loss}))
	}
	return w
}

func (w *world) step(r int, e Event) {
	e.Now = w.now
	s, fx := Step(w.s[r], e)
	w.s[r] = s
	for _, f := range fx {
		switch f.Kind {
		case FxSay:
			w.say(r)
		case FxKill:
			w.queue = append(w.queue, func() { w.tree[r] = 0; w.step(r, Event{Kind: EvLocalGone}) })
		case FxStart:
			for o, e := range w.tree {
				if e != 0 && e < f.Epoch {
					w.t.Fatalf("host %d starts epoch %d while host %d's tree of epoch %d lives", r, f.Epoch, o, e)
				}
			}
			w.tree[r] = f.Epoch
			if r == 0 {
				w.queue = append(w.queue, func() { w.step(0, Event{Kind: EvLocalLaunched, Epoch: f.Epoch}) })
			}
		}
	}
}

// say delivers what host r says to its peers (the leader to each
// follower, a follower to the leader), unless r is silent.
func (w *world) say(r int) {
	if w.cut[r] {
		return
	}
	rep, inc := w.s[r].Say(), uint64(100+r)
	for o := range 3 {
		if o != r && (r == 0 || o == 0) && !w.cut[o] {
			w.queue = append(w.queue, func() { w.step(o, Event{Kind: EvHeard, From: r, Incarnation: inc, Said: rep}) })
		}
	}
}

// second lets a second pass: every guard says its state, ticks, and the
// deliveries run.
func (w *world) second() {
	w.now = w.now.Add(time.Second)
	for r := range 3 {
		w.say(r)
		w.step(r, Event{Kind: EvTick})
	}
	for len(w.queue) > 0 {
		f := w.queue[0]
		w.queue = w.queue[1:]
		f()
	}
}

// serving: every host runs epoch e's tree, and the leader serves it.
func (w *world) serving() (uint64, bool) {
	e := w.tree[0]
	return e, e != 0 && w.tree[1] == e && w.tree[2] == e && w.s[0].Phase == Serving && w.s[0].Epoch == e
}

func (w *world) settle(what string) uint64 {
	for range 30 {
		if e, ok := w.serving(); ok {
			return e
		}
		w.second()
	}
	w.t.Fatalf("after %s the group never runs again: trees %v, phases %v %v %v", what, w.tree, w.s[0].Phase, w.s[1].Phase, w.s[2].Phase)
	return 0
}

func TestEveryFaultRestartsTheWholeGroup(t *testing.T) {
	faults := []struct {
		name string
		do   func(w *world)
		heal func(w *world)
	}{
		{"the leader's vLLM dies", func(w *world) { w.step(0, Event{Kind: EvLocalEnded}) }, nil},
		{"a follower's worker dies", func(w *world) { w.step(1, Event{Kind: EvLocalEnded}) }, nil},
		{"a follower's vLLM exits 0", func(w *world) { w.tree[2] = 0; w.step(2, Event{Kind: EvLocalGone}) }, nil},
		{"a follower hangs", func(w *world) { w.step(2, Event{Kind: EvLocalEnded, Hung: true}) }, nil},
		{"a follower's guard is lost", func(w *world) { w.cut[1] = true }, func(w *world) { w.cut[1] = false }},
		{"the leader's guard is lost", func(w *world) { w.cut[0] = true }, func(w *world) { w.cut[0] = false }},
	}
	rng := rand.New(rand.NewPCG(1, 44))
	w := newWorld(t)
	last := w.settle("the first start")
	for i := range 60 {
		f := faults[rng.IntN(len(faults))]
		f.do(w)
		quiet := 1 + rng.IntN(8)
		if f.heal != nil {
			quiet = 6 + rng.IntN(4) // past the loss timeout: a shorter silence is no loss
		}
		for range quiet {
			w.second()
		}
		if f.heal != nil {
			f.heal(w)
		}
		e := w.settle(f.name)
		if e <= last {
			t.Fatalf("fault %d (%s): the group runs epoch %d again, want a new one after %d", i, f.name, e, last)
		}
		last = e
	}
}
