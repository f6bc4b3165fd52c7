package proxy

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// Why a request was not admitted; the values are the reason label of
// proxy_rejected_total.
const (
	reasonQueueFull    = "queue_full"
	reasonQueueTimeout = "queue_timeout"
	reasonNotReady     = "not_ready"
	reasonBodyTooLarge = "body_too_large"
	// reasonTooLargeForMemory: the cost model predicts the request alone
	// would not fit the memory admission allows.
	reasonTooLargeForMemory = "too_large_for_memory"
	// reasonBufferFull: the request bodies held leave no room for this one
	// ([proxy] max_buffered_bytes).
	reasonBufferFull = "buffer_full"
)

var reasons = []string{reasonQueueFull, reasonQueueTimeout, reasonNotReady, reasonBodyTooLarge, reasonTooLargeForMemory, reasonBufferFull}

// rejection is acquire's refusal: the reason label, and whether the guard
// is shutting down (a 503 like not_ready, said differently).
type rejection struct {
	reason   string
	shutdown bool
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
	changed  chan struct{}
	admitted uint64
	rejected map[string]uint64
	engaged  bool
	done     chan struct{} // closed by close: waiters leave at once
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
	cost, tokens float64
	ch           chan struct{} // closed when granted
	granted      bool
	elem         *list.Element
}

func newLimiter(queueCap int) *limiter {
	l := &limiter{queueCap: queueCap, limit: 1, changed: make(chan struct{}), rejected: map[string]uint64{}, done: make(chan struct{})}
	l.queue.Init()
	return l
}

// set applies the upstream's view: the limit and readiness. It reports
// whether readiness went from true to false.
func (l *limiter) set(limit int, room float64, ready bool) (lostReady bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lostReady = l.ready && !ready
	if limit != l.limit || ready != l.ready || room != l.room {
		l.limit, l.ready, l.room = limit, ready, room
		close(l.changed)
		l.changed = make(chan struct{})
	}
	l.dispatchLocked()
	return lostReady
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

// acquire takes a slot, waiting in the FIFO until deadline. A nil error
// means the caller holds a slot and must call release. On a refusal the
// error is a *rejection; when ctx ends first it is ctx's error.
// queued reports whether the request had to wait.
//
// cost is the request's predicted memory and tokens its prompt tokens; the
// caller passes both to release.
func (l *limiter) acquire(ctx context.Context, deadline time.Time, cost, tokens float64) (queued bool, err error) {
	l.mu.Lock()
	if l.closed {
		l.rejectLocked(errShutdown.reason)
		l.mu.Unlock()
		return false, errShutdown
	}
	if l.ready && l.fitsLocked(cost) && l.queue.Len() == 0 {
		l.takeLocked(cost, tokens)
		l.mu.Unlock()
		return false, nil
	}
	if l.queue.Len() >= l.queueCap || !time.Now().Before(deadline) {
		var r *rejection
		switch {
		case !l.ready:
			r = &rejection{reason: reasonNotReady}
		case l.queue.Len() >= l.queueCap:
			r = &rejection{reason: reasonQueueFull}
		default:
			r = &rejection{reason: reasonQueueTimeout}
		}
		l.rejectLocked(r.reason)
		l.mu.Unlock()
		return false, r
	}
	if l.ready {
		// Waiting for a slot, not for vLLM: admission control is at work.
		l.engaged = true
	}
	w := &waiter{cost: cost, tokens: tokens, ch: make(chan struct{})}
	w.elem = l.queue.PushBack(w)
	l.mu.Unlock()

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var cause error
	select {
	case <-w.ch:
		return true, nil
	case <-ctx.Done():
		cause = ctx.Err()
	case <-timer.C:
	case <-l.done:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted {
		if cause == nil {
			return true, nil // granted as the deadline passed: take it
		}
		// Granted as the client left: hand the slot on.
		l.putLocked(cost, tokens)
		l.dispatchLocked()
		return true, cause
	}
	l.queue.Remove(w.elem)
	if cause != nil {
		return true, cause
	}
	var r *rejection
	switch {
	case l.closed:
		r = errShutdown
	case !l.ready:
		r = &rejection{reason: reasonNotReady}
	default:
		r = &rejection{reason: reasonQueueTimeout}
	}
	l.rejectLocked(r.reason)
	return true, r
}

func (l *limiter) rejectLocked(reason string) {
	l.rejected[reason]++
	if reason == reasonQueueFull || reason == reasonQueueTimeout {
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
