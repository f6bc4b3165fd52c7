package events

import (
	"encoding/json"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
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
// (a reader that stops reading never holds up the guard). Each line is one
// write: a failed write (a full disk) loses that event and is logged, and
// the next write is tried afresh, so the stream recovers when space comes
// back. Close flushes, for at most closeTimeout when w can take a
// deadline (a pipe or FIFO whose reader stopped reading).
type JSONLines struct {
	q *Queue
	w io.Writer
}

// closeTimeout bounds Close's wait for a writer that blocks (a pipe whose
// reader stopped reading): the guard's stop never waits on it for longer.
var closeTimeout = 5 * time.Second

// NewJSONLines starts writing events to w; log (nil: none) hears of write
// failures and of the recovery.
func NewJSONLines(w io.Writer, log *zap.Logger) *JSONLines {
	if log == nil {
		log = zap.NewNop()
	}
	lw := &lineWriter{w: w, log: log}
	return &JSONLines{w: w, q: NewQueue(4096, lw.write)}
}

// lineWriter writes one event a line and says when writing fails and when
// it works again.
type lineWriter struct {
	w       io.Writer
	log     *zap.Logger
	buf     []byte
	failing bool   // the last write failed
	lost    uint64 // events lost since writing began to fail
	cut     bool   // a failed write left part of a line: end it first
}

func (l *lineWriter) write(e Event) {
	data, err := json.Marshal(e)
	if err != nil {
		l.log.Error("an event could not be encoded; it is left out of the events file", zap.String("kind", string(e.Kind)), zap.Error(err))
		return
	}
	l.buf = l.buf[:0]
	if l.cut {
		l.buf = append(l.buf, '\n')
	}
	l.buf = append(append(l.buf, data...), '\n')
	n, err := l.w.Write(l.buf)
	if err != nil {
		l.cut = n > 0 && n < len(l.buf) || (l.cut && n == 0)
		l.lost++
		if !l.failing {
			l.failing = true
			l.log.Error("writing the events file failed: events are lost until it works again (a full disk, a reader that went away)", zap.Error(err))
		}
		return
	}
	l.cut = false
	if l.failing {
		l.log.Warn("writing the events file works again", zap.Uint64("events_lost", l.lost))
		l.failing, l.lost = false, 0
	}
}

// Put queues one event for writing.
func (j *JSONLines) Put(e Event) { j.q.Put(e) }

// Close writes what is queued and stops. A writer that can take a
// deadline (a pipe, a FIFO) gets closeTimeout to take it; then the rest is
// lost instead of holding up the guard's exit.
func (j *JSONLines) Close() {
	if d, ok := j.w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		_ = d.SetWriteDeadline(time.Now().Add(closeTimeout))
	}
	j.q.Close()
}

// Dropped is how many events were not written because the writer fell behind.
func (j *JSONLines) Dropped() uint64 { return j.q.Dropped() }
