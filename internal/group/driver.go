package group

import (
	"context"
	"sync"
	"time"
)

// Local is what the machine asks of this host's supervisor. Each call
// must return at once (hand the work to the supervisor's own loop).
type Local interface {
	// Kill: kill this host's whole vLLM tree; call Driver.LocalGone once
	// nothing of it is left.
	Kill(epoch uint64, c Cause)
	// Start: this host's vLLM may start for epoch on rung (a follower
	// takes the leader's rung); the leader calls Driver.LocalLaunched. On
	// the leader, fault is the cause member's guard gave the end of its own
	// vLLM that ended the last epoch (0: none): its ladder reacts first.
	Start(epoch uint64, rung int, member int, fault Fault)
	// Ended: epoch ended because of c (the log, the status, the events).
	Ended(epoch uint64, c Cause)
}

// Driver runs one guard's machine: the transport's reports and this
// host's events in, in order, on one goroutine (Run); a tick each
// heartbeat for the loss check; the effects out to Local and the
// transport.
type Driver struct {
	node  *Node
	local Local
	every time.Duration
	in    chan Event
	done  chan struct{} // closed when Run returns: this host's words are dropped

	mu sync.Mutex
	s  State
}

// NewDriver is the machine of cfg over node.
func NewDriver(cfg Config, node *Node, local Local, heartbeat time.Duration) *Driver {
	return &Driver{node: node, local: local, every: heartbeat, in: make(chan Event, 16), done: make(chan struct{}), s: New(cfg)}
}

// State is the machine's state now (a copy).
func (d *Driver) State() State {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.s
	s.Members = append([]Member(nil), s.Members...)
	return s
}

// LocalEnded: this host's vLLM ended (any exit, a death) or hung.
func (d *Driver) LocalEnded(hung bool) { d.post(Event{Kind: EvLocalEnded, Hung: hung}) }

// LocalGone: nothing of this host's vLLM tree is left; fault is the cause
// this guard gave its end when it ended by itself (0: killed for the
// group, or none).
func (d *Driver) LocalGone(fault Fault) { d.post(Event{Kind: EvLocalGone, Fault: fault}) }

// LocalLaunched: the leader's vLLM of epoch launched on rung.
func (d *Driver) LocalLaunched(epoch uint64, rung int) {
	d.post(Event{Kind: EvLocalLaunched, Epoch: epoch, Rung: rung})
}

// LocalReady: the leader's vLLM of epoch passed its readiness gate.
func (d *Driver) LocalReady(epoch uint64) { d.post(Event{Kind: EvLocalReady, Epoch: epoch}) }

// LocalGaveUp: the leader's guard gave up; it opens no epoch again and
// says so.
func (d *Driver) LocalGaveUp() { d.post(Event{Kind: EvLocalGaveUp}) }

// post hands a word of this host to Run, in order; after Run returned it
// is dropped.
func (d *Driver) post(e Event) {
	select {
	case d.in <- e:
	case <-d.done:
	}
}

// Run steps the machine until ctx ends; this host's words posted before
// are stepped first (a leader's give-up is its last word).
func (d *Driver) Run(ctx context.Context) {
	defer close(d.done)
	t := time.NewTicker(d.every)
	defer t.Stop()
	d.node.Say(d.State().Say())
	for {
		var e Event
		select {
		case <-ctx.Done():
			d.drain()
			return
		case h := <-d.node.Heard():
			e = Event{Kind: EvHeard, From: h.From, Incarnation: h.Incarnation, Said: h.Report}
		case e = <-d.in:
		case <-t.C:
			e = Event{Kind: EvTick}
		}
		e.Now = time.Now()
		d.step(e)
	}
}

// drain steps this host's words already posted.
func (d *Driver) drain() {
	for {
		select {
		case e := <-d.in:
			e.Now = time.Now()
			d.step(e)
		default:
			return
		}
	}
}

func (d *Driver) step(e Event) {
	d.mu.Lock()
	s, fx := Step(d.s, e)
	d.s = s
	d.mu.Unlock()
	for _, f := range fx {
		switch f.Kind {
		case FxSay:
			d.node.Say(s.Say())
		case FxKill:
			d.local.Kill(f.Epoch, f.Cause)
		case FxStart:
			d.local.Start(f.Epoch, f.Rung, f.Member, f.Fault)
		case FxEnded:
			d.local.Ended(f.Epoch, f.Cause)
		}
	}
}
