// What became of the requests a death of vLLM touched (issue 30, item 6):
// the proxy keeps an account per death, by kind of request and outcome,
// and hands it to the guard's incident record once every request it
// touched has finished and vLLM is back (or at the next death, or the
// guard's stop, with those still going as pending).
//
// A death is known to the proxy by the loss of readiness it belongs to (the
// limiter's generation; a cut seen while the guard still calls vLLM ready
// belongs to the loss to come, as countDeath counts it). Requests touched
// then join that loss's account; the guard claims it as a death (Died) when
// it records the failure. A loss nobody claims (a planned restart's drain,
// the first load) is forgotten once vLLM is ready again.

package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/vllm-guard/vllm-guard/internal/state"
)

// The kinds of request a death touches (the incident record's requests).
const (
	KindStreams                 = "streams"                    // a stream whose client had tokens
	KindStreamsBeforeFirstToken = "streams_before_first_token" // a stream whose client had none
	KindNonStreaming            = "non_streaming"              // any other inference request in flight
	KindArrivedWhileDown        = "arrived_while_down"         // arrived or queued while vLLM was down
)

// Outcomes of a request a death touched, beside ResumedReplayed and
// ResumedContinued; a request not resumed for a reason counts under it.
const (
	OutcomeServedAfterHold = "served_after_hold"
	OutcomeRefused         = "refused"
	OutcomeSuspect         = "suspect"
	OutcomeClientGone      = "client_gone"
	OutcomeFailed          = "failed"
)

// Why a death's account was handed over with requests still going.
const (
	UnfinishedNextDeath = "next_death"
	UnfinishedGuardStop = "guard_stop"
)

// deathTally is one loss of readiness's account.
type deathTally struct {
	gen    uint64
	id     uint64 // the death's number (Died); 0: not claimed as a death
	req    state.DeathRequests
	reqs   map[*reqState]string // the requests going, by kind
	handed bool                 // handed over or forgotten: outcomes no longer count
}

func (t *deathTally) kind(k string) *state.RequestOutcomes {
	p := map[string]**state.RequestOutcomes{KindStreams: &t.req.Streams, KindStreamsBeforeFirstToken: &t.req.StreamsBeforeFirstToken,
		KindNonStreaming: &t.req.NonStreaming, KindArrivedWhileDown: &t.req.ArrivedWhileDown}[k]
	if *p == nil {
		*p = &state.RequestOutcomes{}
	}
	return *p
}

func (t *deathTally) add(st *reqState, kind string) {
	t.reqs[st] = kind
	for _, o := range []*state.RequestOutcomes{&t.req.RequestOutcomes, t.kind(kind)} {
		o.Touched++
		o.Pending++
	}
}

func (t *deathTally) finish(st *reqState, out outcomeOf) {
	kind, ok := t.reqs[st]
	if !ok || t.handed {
		return
	}
	delete(t.reqs, st)
	what, reason := out(kind)
	for _, o := range []*state.RequestOutcomes{&t.req.RequestOutcomes, t.kind(kind)} {
		o.Pending--
		switch what {
		case ResumedContinued:
			o.Continued++
		case ResumedReplayed:
			o.Replayed++
		case OutcomeServedAfterHold:
			o.ServedAfterHold++
		case OutcomeRefused:
			o.Refused++
		case OutcomeSuspect:
			o.Suspect++
		case OutcomeClientGone:
			o.ClientGone++
		case notResumed:
			if o.NotResumed == nil {
				o.NotResumed = map[string]int{}
			}
			o.NotResumed[reason]++
		default:
			o.Failed++
		}
	}
}

// notResumed is the outcome of a request ended instead of resumed; its
// reason goes with it.
const notResumed = "not_resumed"

// outcomeOf says what became of a request, for one kind it was touched as.
type outcomeOf func(kind string) (what, reason string)

// deathBook holds the accounts.
type deathBook struct {
	mu      sync.Mutex
	tallies map[uint64]*deathTally // collecting, by generation
	claimed []*deathTally          // deaths not handed over yet, oldest first
	deaths  uint64                 // Died's count
	died    [16]uint64             // the losses of readiness last claimed as deaths (generations)
	// open: some account is collecting or not handed over (settleDeaths
	// has work, on every refresh otherwise a lock for nothing).
	open atomic.Bool
	on   func(death uint64, r state.DeathRequests)
}

// handover is an account to give the guard.
type handover struct {
	id  uint64
	req state.DeathRequests
}

// handOverLocked marks t handed over and copies its account.
func (t *deathTally) handOverLocked(unfinished string) handover {
	t.handed = true
	r := t.req
	if r.Pending > 0 {
		r.UnfinishedAt = unfinished
	}
	// The maps and kinds are t's: copied, for t may still be read.
	r.RequestOutcomes = copyOutcomes(&r.RequestOutcomes)
	for _, k := range []**state.RequestOutcomes{&r.Streams, &r.StreamsBeforeFirstToken, &r.NonStreaming, &r.ArrivedWhileDown} {
		if *k != nil {
			c := copyOutcomes(*k)
			*k = &c
		}
	}
	return handover{id: t.id, req: r}
}

func copyOutcomes(o *state.RequestOutcomes) state.RequestOutcomes {
	c := *o
	if o.NotResumed != nil {
		c.NotResumed = make(map[string]int, len(o.NotResumed))
		for k, v := range o.NotResumed {
			c.NotResumed[k] = v
		}
	}
	return c
}

// lossGen is the generation a death seen now belongs to.
func (p *Proxy) lossGen() uint64 {
	gen, ready := p.lim.generation()
	if ready {
		gen++ // the loss to come: the guard has not seen it yet
	}
	return gen
}

// touched counts st in the account of the death (or drain) under way,
// as kind; a request already in it is not counted twice.
func (p *Proxy) touched(st *reqState, kind string) {
	gen := p.lossGen()
	b := &p.deaths
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tallies == nil {
		b.tallies = map[uint64]*deathTally{}
	}
	t := b.tallies[gen]
	if t == nil {
		t = &deathTally{gen: gen, reqs: map[*reqState]string{}}
		b.tallies[gen] = t
	}
	if _, in := t.reqs[st]; in {
		return
	}
	t.add(st, kind)
	st.touched, st.lastTally = true, t
	b.open.Store(true)
}

// queuedAtDeath counts st, which waited in the queue while vLLM went away
// (generation gen), in that loss's account, if it is still open: it may
// have been handed over while st waited for a slot.
func (p *Proxy) queuedAtDeath(st *reqState, gen uint64) {
	b := &p.deaths
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.tallies[gen]
	for _, c := range b.claimed {
		if c.gen == gen {
			t = c // the newest claimed for it
		}
	}
	if t == nil || t.handed {
		return
	}
	if _, in := t.reqs[st]; !in {
		t.add(st, KindArrivedWhileDown)
		st.touched, st.lastTally = true, t
	}
}

// untouched takes st out of the account it joined last: the guard never saw
// that death (a connection vLLM closed as it was reused).
func (p *Proxy) untouched(st *reqState) {
	b := &p.deaths
	b.mu.Lock()
	defer b.mu.Unlock()
	t := st.lastTally
	if t == nil {
		return
	}
	st.lastTally = nil
	kind, ok := t.reqs[st]
	if !ok || t.handed {
		return
	}
	delete(t.reqs, st)
	for _, o := range []*state.RequestOutcomes{&t.req.RequestOutcomes, t.kind(kind)} {
		o.Touched--
		o.Pending--
	}
}

// finished records what became of st in every account it is in (a
// request some death touched).
func (p *Proxy) finished(st *reqState, out outcomeOf) {
	if !st.touched {
		return
	}
	b := &p.deaths
	b.mu.Lock()
	for _, t := range b.tallies {
		t.finish(st, out)
	}
	for _, t := range b.claimed {
		t.finish(st, out)
	}
	st.lastTally = nil
	b.mu.Unlock()
	p.settleDeaths()
}

// settleDeaths forgets the accounts of losses that were no death once vLLM
// is back, and hands over those of deaths that are complete: vLLM is back
// and every request they touched has finished.
func (p *Proxy) settleDeaths() {
	b := &p.deaths
	if !b.open.Load() {
		return
	}
	downs, ready := p.lim.generation()
	b.mu.Lock()
	if ready {
		for gen, t := range b.tallies {
			if gen <= downs {
				// No request joins it any more.
				delete(b.tallies, gen)
				if t.id == 0 {
					t.handed = true
				}
			}
		}
	}
	var out []handover
	kept := b.claimed[:0]
	for _, t := range b.claimed {
		if ready && t.gen <= downs && t.req.Pending == 0 {
			out = append(out, t.handOverLocked(""))
		} else {
			kept = append(kept, t)
		}
	}
	b.claimed = kept
	b.open.Store(len(b.tallies) > 0 || len(b.claimed) > 0)
	on := b.on
	b.mu.Unlock()
	deliver(on, out)
}

func deliver(on func(uint64, state.DeathRequests), out []handover) {
	if on == nil {
		return
	}
	for _, h := range out {
		on(h.id, h.req)
	}
}

// Died tells the proxy that vLLM died (the guard records the failure) and
// returns the death's number: the account of the requests it touched is
// handed to SetOnDeathRequests's function under that number. The accounts
// of earlier deaths not handed over yet are handed over now, their
// requests still going as pending (unfinished_at "next_death"); those
// still held for vLLM, which this death keeps away too, join its account.
func (p *Proxy) Died() uint64 {
	gen := p.lossGen()
	b := &p.deaths
	b.mu.Lock()
	if b.tallies == nil {
		b.tallies = map[uint64]*deathTally{}
	}
	t := b.tallies[gen]
	if t == nil || t.id != 0 {
		prev := t
		t = &deathTally{gen: gen, reqs: map[*reqState]string{}}
		b.tallies[gen] = t
		if prev != nil {
			// vLLM died again before it was back (a crash while loading):
			// what the earlier death still holds is held for this one too.
			for st, kind := range prev.reqs {
				t.add(st, kind)
			}
		}
	}
	var out []handover
	for _, old := range b.claimed {
		out = append(out, old.handOverLocked(UnfinishedNextDeath))
	}
	b.deaths++
	t.id = b.deaths
	b.died[b.deaths%uint64(len(b.died))] = gen
	b.claimed = append(b.claimed[:0], t)
	b.open.Store(true)
	on := b.on
	b.mu.Unlock()
	deliver(on, out)
	return t.id
}

// SetOnDeathRequests sets who receives each death's account (the guard's
// incident record). Call it before Serve.
func (p *Proxy) SetOnDeathRequests(f func(death uint64, r state.DeathRequests)) {
	p.deaths.mu.Lock()
	p.deaths.on = f
	p.deaths.mu.Unlock()
}

// flushDeaths hands over every death's account now (the guard stops), with
// the requests still going as pending.
func (p *Proxy) flushDeaths() {
	b := &p.deaths
	b.mu.Lock()
	var out []handover
	for _, t := range b.claimed {
		out = append(out, t.handOverLocked(UnfinishedGuardStop))
	}
	b.claimed = nil
	on := b.on
	b.mu.Unlock()
	deliver(on, out)
}

// diedAt reports whether the loss of readiness gen was claimed as a death
// (Died): not a planned restart's drain, nor a loss nobody claimed.
func (p *Proxy) diedAt(gen uint64) bool {
	b := &p.deaths
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, g := range b.died {
		if g == gen && gen != 0 {
			return true
		}
	}
	return false
}
