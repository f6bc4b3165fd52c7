// Package incident assembles one incident record per failure of vLLM, from
// the event stream: the cause and its evidence, what the guard did, the last
// lines vLLM printed, and the GPU memory of the last minutes. It writes them
// through the state store, off the supervisor's goroutine, and remembers the
// last one for the status document even when writing it failed.
package incident

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/state"
)

// Store is where records go (state.Store).
type Store interface {
	AddIncident(inc state.Incident) (path string, err error)
}

// Recorder turns exited events into incident records.
type Recorder struct {
	store      Store
	memory     func() gpumon.Snapshot // the GPU view at the time of the failure
	childLines int
	interval   time.Duration // one GPU sample
	log        *zap.Logger
	queue      chan state.Incident
	done       chan struct{}
	publish    func(events.Event) // says each record written, or not; nil: nobody

	mu       sync.Mutex
	last     *state.Incident
	suspects []state.SuspectRequest    // told by the proxy, not yet in a record
	held     func() state.HeldRequests // the proxy's held requests; nil: no proxy
}

// SetHeld gives the recorder the proxy's count of held requests, put in
// each record. Set it before the first Handle.
func (r *Recorder) SetHeld(held func() state.HeldRequests) { r.held = held }

// suspectWindow: a suspect told this long before a failure belongs to it
// (the proxy sees the death first: its connection closes at once, the
// supervisor's record waits for the process tree to be gone).
const suspectWindow = 2 * time.Minute

// NoteSuspect records a request the proxy refused to send again at a
// death (proxy.SetOnSuspect): the record of that death names it.
func (r *Recorder) NoteSuspect(s state.SuspectRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.suspects = append(r.suspects, s)
	if len(r.suspects) > 64 {
		r.suspects = r.suspects[len(r.suspects)-64:]
	}
}

// New starts a recorder; Close stops it after writing what is queued.
func New(store Store, memory func() gpumon.Snapshot, childLines int, interval time.Duration, log *zap.Logger) *Recorder {
	r := &Recorder{store: store, memory: memory, childLines: childLines, interval: interval, log: log,
		queue: make(chan state.Incident, 64), done: make(chan struct{})}
	go r.writeAll()
	return r
}

// Handle is the recorder's event consumer: it assembles the record at once
// (the memory view is the one at the failure) and queues the write, so a
// slow disk never holds up the supervisor.
func (r *Recorder) Handle(e events.Event) {
	if e.Kind != events.KindExited || e.Failure == nil {
		return
	}
	inc := Assemble(*e.Failure, r.memory(), r.childLines, r.interval)
	if r.held != nil {
		h := r.held()
		inc.Held = &h
	}
	r.mu.Lock()
	for _, s := range r.suspects {
		if !s.Time.Before(e.Failure.Time.Add(-suspectWindow)) {
			inc.Suspects = append(inc.Suspects, s)
		}
	}
	r.suspects = nil
	r.last = &inc
	r.mu.Unlock()
	select {
	case r.queue <- inc:
	default:
		r.log.Warn("incident records are not being written fast enough: this one is only in status", zap.String("cause", string(inc.Cause)))
	}
}

func (r *Recorder) writeAll() {
	defer close(r.done)
	for inc := range r.queue {
		path, err := r.store.AddIncident(inc)
		if err != nil {
			r.log.Warn("could not write the incident record; status still shows it", zap.Error(err))
			r.say(events.Event{Kind: events.KindIncident, Reason: "not written: " + err.Error()})
			continue
		}
		r.log.Info("incident recorded", zap.String("path", path), zap.String("cause", string(inc.Cause)))
		r.say(events.Event{Kind: events.KindIncident, Reason: path})
	}
}

// Publish makes the recorder say on the event stream each record it wrote
// (or could not write). Set it before the first Handle.
func (r *Recorder) Publish(publish func(events.Event)) { r.publish = publish }

func (r *Recorder) say(e events.Event) {
	if r.publish != nil {
		r.publish(e)
	}
}

// Last is the last failure's record (nil before any).
func (r *Recorder) Last() *state.Incident {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		return nil
	}
	c := *r.last
	return &c
}

// Close writes what is queued and stops. Handle must not be called after.
func (r *Recorder) Close() {
	close(r.queue)
	<-r.done
}

// Assemble builds the record of one failure.
func Assemble(f events.Failure, snap gpumon.Snapshot, childLines int, interval time.Duration) state.Incident {
	inc := state.Incident{
		Time: f.Time, Cause: f.Verdict.Cause, Confidence: f.Verdict.Confidence, Summary: f.Verdict.Summary,
		Evidence: f.Verdict.Evidence, ExitCode: f.ExitCode, Signal: f.Signal, Phase: f.Phase,
		RungBefore: f.RungBefore, RungAfter: f.Decision.Rung, Action: f.Decision.Action, Reason: f.Decision.Reason,
		Delay: f.Decision.Delay, GPU: f.Verdict.GPU,
	}
	from := max(0, len(f.Lines)-childLines)
	for _, l := range f.Lines[from:] {
		inc.LastLines = append(inc.LastLines, l.Text)
	}
	for _, d := range snap.Devices {
		if inc.MemoryTrend == "" || d.Trend != "steady" {
			inc.MemoryTrend = d.Trend
		}
		for i, fr := range d.History {
			t := f.Time.Add(-time.Duration(len(d.History)-1-i) * interval)
			if i < len(inc.Memory) {
				inc.Memory[i].Fraction = max(inc.Memory[i].Fraction, fr)
			} else {
				inc.Memory = append(inc.Memory, state.MemSample{T: t, Fraction: fr})
			}
		}
	}
	return inc
}
