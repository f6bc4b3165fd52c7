// Package incident assembles one incident record per failure of vLLM, from
// the event stream: the cause and its evidence, what the guard did, the last
// lines vLLM printed, and the GPU memory of the last minutes. It writes them
// through the state store, off the supervisor's goroutine, and remembers the
// last one for the status document even when writing it failed.
package incident

import (
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/state"
)

// NotWritten begins the reason of an incident event whose record could
// not be written; the rest says why.
const NotWritten = "not written: "

// Store is where records go (state.Store).
type Store interface {
	AddIncident(inc state.Incident) (path string, err error)
	// UpdateIncident rewrites the record of the failure at at (of cause)
	// with update applied, atomically; found is false when there is none.
	UpdateIncident(at time.Time, cause cause.Cause, update func(*state.Incident)) (found bool, err error)
}

// job is one write: a new record, or the account of a death's requests
// for the record already written (requests set).
type job struct {
	inc      state.Incident
	requests *state.DeathRequests
}

// recordKey names a record: its failure's time and cause.
type recordKey struct {
	at    time.Time
	cause cause.Cause
}

// Recorder turns exited events into incident records.
type Recorder struct {
	store      Store
	memory     func() gpumon.Snapshot // the GPU view at the time of the failure
	childLines int
	interval   time.Duration // one GPU sample
	log        *zap.Logger
	queue      chan job
	done       chan struct{}
	publish    func(events.Event) // says each record written, or not; nil: nobody
	died       func() uint64      // the proxy's Died; nil: no proxy

	mu       sync.Mutex
	closed   bool
	last     *state.Incident
	suspects []state.SuspectRequest    // told by the proxy, not yet in a record
	held     func() state.HeldRequests // the proxy's held requests; nil: no proxy
	// deaths: the records whose requests' account the proxy has yet to
	// give, by the proxy's number of the death.
	deaths map[uint64]recordKey
}

// maxAwaited bounds the records awaiting their account (a proxy that never
// gives one cannot grow it).
const maxAwaited = 64

// SetDeaths makes the recorder tell the proxy of each death it records
// (proxy.Died), whose account of the requests the death touched comes back
// through NoteRequests. Set it before the first Handle.
func (r *Recorder) SetDeaths(died func() uint64) { r.died = died }

// NoteRequests puts the proxy's account of the requests death touched
// (proxy.SetOnDeathRequests) into that death's record: the file is
// rewritten, and status's last incident shows it.
func (r *Recorder) NoteRequests(death uint64, req state.DeathRequests) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, ok := r.deaths[death]
	if !ok || r.closed {
		return
	}
	delete(r.deaths, death)
	if r.last != nil && r.last.Time.Equal(k.at) && r.last.Cause == k.cause {
		c := *r.last
		c.Requests = &req
		r.last = &c
	}
	r.enqueueLocked(job{inc: state.Incident{Time: k.at, Cause: k.cause}, requests: &req})
}

func (r *Recorder) enqueueLocked(j job) {
	if r.closed {
		return
	}
	select {
	case r.queue <- j:
	default:
		if j.requests != nil {
			r.log.Warn("incident records are not being written fast enough: a death's account of its requests is only in status",
				zap.Time("incident", j.inc.Time))
			return
		}
		r.log.Warn("incident records are not being written fast enough: this one is only in status", zap.String("cause", string(j.inc.Cause)))
	}
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
		queue: make(chan job, 64), done: make(chan struct{}), deaths: map[uint64]recordKey{}}
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
	// Bounded at once: the record kept for status is no larger than the
	// one written, whatever vLLM (or a client through it) printed.
	inc := state.Bounded(Assemble(*e.Failure, r.memory(), r.childLines, r.interval))
	inc.VLLM, inc.Role = e.VLLM, e.Role
	if e.Failover != nil {
		inc.TakenOverBy = e.Failover.To
	}
	if r.held != nil {
		h := r.held()
		inc.Held = &h
	}
	var death uint64
	if r.died != nil {
		// (Outside the lock: the proxy may hand over an earlier death's
		// account through NoteRequests as it counts this one.)
		death = r.died()
	}
	r.mu.Lock()
	if death != 0 {
		r.deaths[death] = recordKey{at: inc.Time.UTC(), cause: inc.Cause}
		for len(r.deaths) > maxAwaited {
			delete(r.deaths, slices.Min(slices.Collect(maps.Keys(r.deaths))))
		}
	}
	for _, s := range r.suspects {
		if !s.Time.Before(e.Failure.Time.Add(-suspectWindow)) {
			inc.Suspects = append(inc.Suspects, s)
		}
	}
	r.suspects = nil
	r.last = &inc
	r.enqueueLocked(job{inc: inc})
	r.mu.Unlock()
}

func (r *Recorder) writeAll() {
	defer close(r.done)
	for j := range r.queue {
		if j.requests != nil {
			r.writeRequests(j)
			continue
		}
		inc := j.inc
		path, err := r.store.AddIncident(inc)
		if err != nil {
			r.log.Warn("could not write the incident record; status still shows it", zap.Error(err))
			r.say(events.Event{Kind: events.KindIncident, Reason: NotWritten + err.Error()})
			continue
		}
		r.log.Info("incident recorded", zap.String("path", path), zap.String("cause", string(inc.Cause)))
		r.say(events.Event{Kind: events.KindIncident, Reason: path})
	}
}

// writeRequests rewrites a record with its death's account of requests.
func (r *Recorder) writeRequests(j job) {
	found, err := r.store.UpdateIncident(j.inc.Time, j.inc.Cause, func(inc *state.Incident) { inc.Requests = j.requests })
	switch {
	case err != nil:
		r.log.Warn("could not write what became of a death's requests into its incident record; status still shows it",
			zap.Time("incident", j.inc.Time), zap.Error(err))
	case !found:
		r.log.Info("the incident record of a death was gone (pruned, or never written) when what became of its requests was known",
			zap.Time("incident", j.inc.Time), zap.String("requests", j.requests.Line()))
	default:
		r.log.Info("what became of the requests a death touched is in its incident record",
			zap.Time("incident", j.inc.Time), zap.String("requests", j.requests.Line()))
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
	r.mu.Lock()
	r.closed = true
	close(r.queue)
	r.mu.Unlock()
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
