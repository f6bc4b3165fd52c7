package proxy

import (
	"container/list"
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"
)

// Why a request was not admitted; the values are the reason label of
// proxy_rejected_total.
const (
	reasonQueueFull     = "queue_full"
	reasonQueueTimeout  = "queue_timeout"
	reasonNotReady      = "not_ready"
	reasonBodyTooLarge  = "body_too_large"
	reasonOperatorRoute = "operator_route"
	// reasonTooLargeForMemory: the cost model predicts the request alone
	// would not fit the memory admission allows.
	reasonTooLargeForMemory = "too_large_for_memory"
	// reasonBufferFull: the request bodies held leave no room for this one
	// ([proxy] max_buffered_bytes).
	reasonBufferFull = "buffer_full"
)

var reasons = []string{reasonQueueFull, reasonQueueTimeout, reasonNotReady, reasonBodyTooLarge, reasonTooLargeForMemory, reasonBufferFull, reasonOperatorRoute}

// rejection is acquire's refusal: the reason label, and whether the guard
// is shutting down (a 503 like not_ready, said differently).
type rejection struct {
	reason   string
	shutdown bool
	gone     bool // vLLM is down and not coming back (failed, gave up, stopping for good)
	held     bool // held while vLLM restarted, up to the hold limit
	down     bool // the queue was full while vLLM was down
}

func (r *rejection) Error() string { return "request not admitted: " + r.reason }

var errShutdown = &rejection{reason: reasonNotReady, shutdown: true}

// limiter is the admission state: requests in flight to vLLM, and a FIFO of
// requests waiting for a slot or for vLLM to be ready. One mutex guards it
// all; the hot path is a few field updates under it.
type limiter struct {
	mu    sync.Mutex
	limit int
	ready bool
	// room > 0: the memory bound; the predicted bytes of the requests in
	// flight (cost) stay within it. tokens: their prompt tokens.
	room, cost, tokens float64
	win                window
	closed             bool
	inflight           int
	queue              list.List // of *waiter, oldest first
	queueCap           int
	// changed is closed and replaced whenever readiness or the limit
	// changes, so a request waiting for vLLM outside the queue can wake.
	changed chan struct{}
	// outlookChanged is closed and replaced when readiness or what vLLM's
	// absence means changes (not the limit or the memory room, which move
	// with every sample): the queue's waiters look at their deadlines again.
	outlookChanged chan struct{}
	admitted       uint64
	rejected       map[string]uint64
	engaged        bool
	done           chan struct{} // closed by close: waiters leave at once
	// resume: [proxy] resume is on. holding: vLLM is down and coming
	// back, so waiters are held up to holdLimit; gone: down and not
	// coming back, so they are refused at once. downSince and readySince
	// are when readiness last changed; downs counts the losses of it.
	resume, holding, gone bool
	holdLimit             time.Duration
	downSince, readySince time.Time
	downs                 uint64
	// Waiters in the queue that were resumed, and streams among them.
	resumedWaiting, pausedWaiting int
}

// window is what was in flight since the last sample: the fewest
// requests (and their prompt tokens then) and the most.
type window struct {
	minInflight, maxInflight int
	minTokens                float64
	admitted                 uint64  // admissions in the window
	tokens                   float64 // their prompt tokens
}

// Window is what the proxy had in flight since the previous call.
type Window struct {
	MinInflight, MaxInflight int
	MinTokens                float64 // prompt tokens in flight when the fewest requests were
	MeanTokens               float64 // prompt tokens of a request admitted in the window; 0 if none
}

type waiter struct {
	admit
	ch       chan struct{} // closed when granted
	granted  bool
	elem     *list.Element
	queuedAt time.Time // a resumed request's queue timeout starts no earlier
}

func newLimiter(queueCap int) *limiter {
	l := &limiter{queueCap: queueCap, limit: 1, changed: make(chan struct{}), outlookChanged: make(chan struct{}), rejected: map[string]uint64{}, done: make(chan struct{})}
	l.queue.Init()
	return l
}

// outlook is what vLLM's absence means to the requests that wait.
type outlook struct {
	resume, comingBack bool
	holdLimit          time.Duration
}

// set applies the upstream's view: the limit, readiness and the outlook
// while vLLM is down. It reports whether readiness went from true to false.
func (l *limiter) set(limit int, room float64, ready bool, o outlook) (lostReady bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lostReady = l.ready && !ready
	holding, gone := o.resume && !ready && o.comingBack, o.resume && !ready && !o.comingBack
	if limit != l.limit || ready != l.ready || room != l.room || holding != l.holding || gone != l.gone || o.holdLimit != l.holdLimit {
		now := time.Now()
		if lostReady {
			l.downSince = now
			l.downs++
		} else if ready && !l.ready {
			l.readySince = now
		}
		if ready != l.ready || holding != l.holding || gone != l.gone || o.holdLimit != l.holdLimit || o.resume != l.resume {
			close(l.outlookChanged)
			l.outlookChanged = make(chan struct{})
		}
		l.limit, l.ready, l.room = limit, ready, room
		l.resume, l.holding, l.gone, l.holdLimit = o.resume, holding, gone, o.holdLimit
		close(l.changed)
		l.changed = make(chan struct{})
	}
	l.dispatchLocked()
	return lostReady
}

// generation counts vLLM's losses of readiness, and says whether it is
// ready now: a request that saw vLLM die while the limiter still thinks it
// ready belongs to the coming loss.
func (l *limiter) generation() (downs uint64, ready bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.downs, l.ready
}

// wait returns a channel closed at the next change of readiness or limit.
func (l *limiter) wait() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *limiter) isReady() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ready && !l.closed
}

// admit is one request asking acquire for a slot.
type admit struct {
	cost, tokens float64 // its predicted memory and prompt tokens; release takes both
	// arrived orders resumed requests (oldest first) and starts the
	// queue timeout, and the hold while vLLM is down.
	arrived      time.Time
	queueTimeout time.Duration
	// resumed: it was in flight at a death of vLLM (or a drain) and gave
	// its slot back; it is admitted before any new request, and never
	// refused for a full queue.
	resumed bool
	// paused: a stream whose client got part of its answer (Stats).
	paused bool
	// tick, when not nil, is called every tickEvery while it waits.
	tick      func()
	tickEvery time.Duration
}

// acquire takes a slot, waiting in the FIFO. A nil error means the caller
// holds a slot and must call release. On a refusal the error is a
// *rejection; when ctx ends first it is ctx's error. queued reports
// whether the request had to wait.
//
// While vLLM is ready a request waits at most its queue timeout from its
// arrival (or from vLLM's return, when it was held). While vLLM is down
// and coming back (holding) it is held up to the hold limit from its
// arrival or vLLM's going (whichever is later); while vLLM is down and not
// coming back (gone) it is refused at once.
func (l *limiter) acquire(ctx context.Context, a admit) (queued bool, err error) {
	l.mu.Lock()
	if l.closed {
		l.rejectLocked(errShutdown.reason)
		l.mu.Unlock()
		return false, errShutdown
	}
	if !a.resumed && l.ready && l.fitsLocked(a.cost) && l.queue.Len() == 0 {
		l.takeLocked(a.cost, a.tokens)
		l.mu.Unlock()
		return false, nil
	}
	w := &waiter{admit: a, ch: make(chan struct{}), queuedAt: time.Now()}
	if a.resumed && l.ready {
		// First in line: a free slot is its at once.
		l.enqueueLocked(w)
		l.dispatchLocked()
		if w.granted {
			l.mu.Unlock()
			return false, nil
		}
		l.removeLocked(w)
	}
	if r := l.refuseLocked(w, time.Now(), true); r != nil {
		l.rejectLocked(r.reason)
		l.mu.Unlock()
		return false, r
	}
	if l.ready && !a.resumed {
		// Waiting for a slot, not for vLLM: admission control is at work.
		l.engaged = true
	}
	l.enqueueLocked(w)
	l.dispatchLocked()
	l.mu.Unlock()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var ticks <-chan time.Time
	if a.tick != nil && a.tickEvery > 0 {
		t := time.NewTicker(a.tickEvery)
		defer t.Stop()
		ticks = t.C
	}
	var cause error
	for cause == nil {
		l.mu.Lock()
		dl, changed := l.deadlineLocked(w), l.outlookChanged
		l.mu.Unlock()
		timer.Reset(max(time.Until(dl), 0))
		select {
		case <-w.ch:
			return true, nil
		case <-ctx.Done():
			cause = ctx.Err()
		case <-l.done:
			cause = errShutdown
		case <-ticks:
			a.tick()
			continue
		case <-changed:
		case <-timer.C:
		}
		if cause != nil {
			break
		}
		l.mu.Lock()
		r := l.refuseLocked(w, time.Now(), false)
		l.mu.Unlock()
		if r != nil {
			cause = r
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted {
		if _, refused := isRejection(cause); refused {
			return true, nil // granted as the deadline passed: take it
		}
		// Granted as the client left: hand the slot on.
		l.putLocked(a.cost, a.tokens)
		l.dispatchLocked()
		return true, cause
	}
	l.removeLocked(w)
	if r, ok := isRejection(cause); ok {
		l.rejectLocked(r.reason)
	}
	return true, cause
}

// enqueueLocked puts w in line: a resumed request after the resumed ones
// that arrived before it, ahead of every new one; a new one at the back.
func (l *limiter) enqueueLocked(w *waiter) {
	if w.resumed {
		l.resumedWaiting++
	}
	if w.paused {
		l.pausedWaiting++
	}
	if !w.resumed {
		w.elem = l.queue.PushBack(w)
		return
	}
	for e := l.queue.Front(); e != nil; e = e.Next() {
		o := e.Value.(*waiter)
		if !o.resumed || o.arrived.After(w.arrived) {
			w.elem = l.queue.InsertBefore(w, e)
			return
		}
	}
	w.elem = l.queue.PushBack(w)
}

func (l *limiter) removeLocked(w *waiter) {
	l.queue.Remove(w.elem)
	l.unqueuedLocked(w)
}

func (l *limiter) unqueuedLocked(w *waiter) {
	if w.resumed {
		l.resumedWaiting--
	}
	if w.paused {
		l.pausedWaiting--
	}
}

// deadlineLocked is when w stops waiting, as things are now.
func (l *limiter) deadlineLocked(w *waiter) time.Time {
	switch {
	case !l.ready && l.holding:
		return later(w.arrived, l.downSince).Add(l.holdLimit)
	case l.ready && l.resume:
		start := later(w.arrived, l.readySince)
		if w.resumed {
			// It held a slot until it gave it back to wait.
			start = later(start, w.queuedAt)
		}
		return start.Add(w.queueTimeout)
	default:
		return w.arrived.Add(w.queueTimeout)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// refuseLocked says why w must not wait (nil: it may): vLLM is not coming
// back, its deadline passed, or (joining) the queue is full.
func (l *limiter) refuseLocked(w *waiter, now time.Time, joining bool) *rejection {
	switch {
	case l.closed:
		return errShutdown
	case !l.ready && l.gone:
		return &rejection{reason: reasonNotReady, gone: true}
	case joining && !w.resumed && l.queue.Len()-l.resumedWaiting >= l.queueCap:
		return &rejection{reason: reasonQueueFull, down: !l.ready}
	case !now.Before(l.deadlineLocked(w)):
		if !l.ready {
			return &rejection{reason: reasonNotReady, held: l.holding}
		}
		return &rejection{reason: reasonQueueTimeout}
	}
	return nil
}

func (l *limiter) rejectLocked(reason string) {
	l.rejected[reason]++
	if l.ready && (reason == reasonQueueFull || reason == reasonQueueTimeout) {
		// A full queue while vLLM is down is not admission control at work.
		l.engaged = true
	}
}

// reject counts a refusal decided outside acquire (body too large).
func (l *limiter) reject(reason string) {
	l.mu.Lock()
	l.rejectLocked(reason)
	l.mu.Unlock()
}

func (l *limiter) release(cost, tokens float64) {
	l.mu.Lock()
	l.putLocked(cost, tokens)
	l.dispatchLocked()
	l.mu.Unlock()
}

// adjust replaces an admitted request's predicted cost and prompt tokens
// (guessed before its body was read) with those counted; a smaller cost
// may let waiters in.
func (l *limiter) adjust(oldCost, oldTokens, cost, tokens float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cost += cost - oldCost
	l.tokens += tokens - oldTokens
	l.win.tokens = max(l.win.tokens+tokens-oldTokens, 0)
	l.dispatchLocked()
}

// fitsLocked: one more request of this cost stays within the count and,
// when in force, the memory bound. Alone it is always let through: one
// too large for the bound is refused before it queues (tooLargeForMemory).
func (l *limiter) fitsLocked(cost float64) bool {
	return l.inflight < l.limit && (l.room <= 0 || l.inflight == 0 || l.cost+cost <= l.room)
}

func (l *limiter) takeLocked(cost, tokens float64) {
	l.inflight++
	l.admitted++
	l.cost += cost
	l.tokens += tokens
	l.win.maxInflight = max(l.win.maxInflight, l.inflight)
	l.win.admitted++
	l.win.tokens += tokens
}

func (l *limiter) putLocked(cost, tokens float64) {
	l.inflight--
	l.cost -= cost
	l.tokens -= tokens
	if l.inflight == 0 {
		l.cost, l.tokens = 0, 0 // no drift from float sums
	}
	if l.inflight < l.win.minInflight {
		l.win.minInflight, l.win.minTokens = l.inflight, l.tokens
	}
}

// window returns what was in flight since the last call and starts anew.
func (l *limiter) window() Window {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := Window{MinInflight: l.win.minInflight, MaxInflight: l.win.maxInflight, MinTokens: l.win.minTokens}
	if l.win.admitted > 0 {
		w.MeanTokens = l.win.tokens / float64(l.win.admitted)
	}
	l.win = window{minInflight: l.inflight, maxInflight: l.inflight, minTokens: l.tokens}
	return w
}

// dispatchLocked hands free slots to the oldest waiters, in order: one that
// does not fit waits for memory, and so do those behind it.
func (l *limiter) dispatchLocked() {
	for l.ready && !l.closed && l.queue.Len() > 0 {
		w := l.queue.Front().Value.(*waiter)
		if !l.fitsLocked(w.cost) {
			return
		}
		l.queue.Remove(l.queue.Front())
		l.unqueuedLocked(w)
		w.granted = true
		l.takeLocked(w.cost, w.tokens)
		close(w.ch)
	}
}

// close refuses every waiter and every later request: the proxy is
// shutting down. Requests in flight go on.
func (l *limiter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.done)
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *limiter) stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Stats{
		Ready: l.ready && !l.closed, Limit: l.limit, Inflight: l.inflight, Queued: l.queue.Len(), QueueSize: l.queueCap,
		Admitted: l.admitted, Engaged: l.engaged, RejectedBy: make(map[string]uint64, len(reasons)),
		MemoryRoomBytes: l.room, MemoryInflightBytes: l.cost, PromptTokensInflight: l.tokens,
		Held: l.resumedWaiting, Paused: l.pausedWaiting,
	}
	if !l.ready && (l.holding || l.gone) {
		s.Held = l.queue.Len() // every waiter waits for vLLM
	}
	for _, r := range reasons {
		s.RejectedBy[r] = l.rejected[r]
		s.Rejected += l.rejected[r]
	}
	return s
}

// isRejection unwraps a refusal.
func isRejection(err error) (*rejection, bool) {
	var r *rejection
	ok := errors.As(err, &r)
	return r, ok
}

// clientShare counts the requests in progress of each client a trusted
// load balancer forwards, each at most max ([proxy]
// max_connections_per_client): behind one balancer, clients get a share
// each, as they do when they connect themselves.
type clientShare struct {
	mu  sync.Mutex
	max int
	n   map[netip.Prefix]int
}

func newClientShare(max int) *clientShare {
	return &clientShare{max: max, n: map[netip.Prefix]int{}}
}

// take counts one more request of c; false (nothing counted) when c has
// its share in progress already.
func (s *clientShare) take(c netip.Prefix) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[c] >= s.max {
		return false
	}
	s.n[c]++
	return true
}

func (s *clientShare) give(c netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[c]--; s.n[c] <= 0 {
		delete(s.n, c)
	}
}
