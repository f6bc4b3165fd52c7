package events

import (
	"bufio"
	"encoding/json"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Bus delivers every published event to every handler, in order, one event
// at a time: handlers must be quick (set a gauge, send a datagram, queue
// work). A handler may publish in turn (an OOM raises an alert): the new
// event is delivered after the current one, never re-entrantly. A slow
// consumer goes through a Queue instead.
type Bus struct {
	mu         sync.Mutex
	seq        uint64
	handlers   []func(Event)
	pending    []Event
	delivering bool
}

// NewBus makes an empty bus.
func NewBus() *Bus { return &Bus{} }

// Handle adds a consumer. Add consumers before the first Publish.
func (b *Bus) Handle(h func(Event)) {
	b.mu.Lock()
	b.handlers = append(b.handlers, h)
	b.mu.Unlock()
}

// Publish stamps e (sequence number, and the time when unset) and hands it
// to every consumer. Publishers may be on several goroutines: events are
// delivered in sequence order, by whichever publisher is delivering.
func (b *Bus) Publish(e Event) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.seq++
	e.Seq = b.seq
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	b.pending = append(b.pending, e)
	if b.delivering {
		b.mu.Unlock()
		return
	}
	b.delivering = true
	for len(b.pending) > 0 {
		next := b.pending[0]
		b.pending = b.pending[1:]
		hs := b.handlers
		b.mu.Unlock()
		for _, h := range hs {
			h(next)
		}
		b.mu.Lock()
	}
	b.delivering = false
	b.mu.Unlock()
}

// Queue hands events to a slow consumer on its own goroutine, through a
// bounded buffer: when the consumer falls behind, events are dropped and
// counted, and the publisher never waits.
type Queue struct {
	ch      chan Event
	dropped atomic.Uint64
	done    chan struct{}
}

// NewQueue starts a goroutine that calls consume for each event; Close
// stops it after the queued events were consumed.
func NewQueue(size int, consume func(Event)) *Queue {
	q := &Queue{ch: make(chan Event, size), done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for e := range q.ch {
			consume(e)
		}
	}()
	return q
}

// Put queues e, or drops it when the queue is full.
func (q *Queue) Put(e Event) {
	select {
	case q.ch <- e:
	default:
		q.dropped.Add(1)
	}
}

// Dropped is how many events did not fit.
func (q *Queue) Dropped() uint64 { return q.dropped.Load() }

// Close consumes what is queued, then stops. Put must not be called after.
func (q *Queue) Close() {
	close(q.ch)
	<-q.done
}

// JSONLines writes each event as one JSON line to w, from its own goroutine
// (a reader that stops reading never holds up the guard). Close flushes.
type JSONLines struct {
	q *Queue
}

// NewJSONLines starts writing events to w.
func NewJSONLines(w io.Writer) *JSONLines {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	return &JSONLines{q: NewQueue(4096, func(e Event) {
		_ = enc.Encode(e)
		_ = bw.Flush()
	})}
}

// Put queues one event for writing.
func (j *JSONLines) Put(e Event) { j.q.Put(e) }

// Close writes what is queued and stops.
func (j *JSONLines) Close() { j.q.Close() }

// Dropped is how many events were not written because the writer fell behind.
func (j *JSONLines) Dropped() uint64 { return j.q.Dropped() }
