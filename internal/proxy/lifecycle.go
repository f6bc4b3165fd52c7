// Where a request's life is decided: one forward loop for every inference
// request, a stream's or not.
//
// live sends (course.send), and when vLLM's answer did not end the request
// (a cut: vLLM died, drained for a restart, or said its engine is gone) it
// decides here, in one place, what comes next:
//
//   - hold: the request waits while vLLM is down (holdUntilReady; a stream
//     writes SSE comments meanwhile), refused with 503 and Retry-After past
//     the hold;
//   - send again: a replay (the client has nothing generated: a non-stream,
//     or a stream before its first token) or a continuation (resume.go);
//   - pass on: the guard never saw vLLM go, so what vLLM answered is the
//     request's answer (a close is sent again once; an engine that says it
//     is dead, until the guard sees it or the hold passes);
//   - suspect: in flight at [proxy] resume_limit deaths it could have
//     caused, it is not sent again (422; a stream's error event).
//
// A non-stream is the zero-delivered case of this loop (transport.go's
// replay); a stream's course is the resumer (resume.go).

package proxy

import (
	"errors"
	"net/http"
	"time"
)

// cut is what a send that did not end the request tells the loop.
type cut struct {
	why       string // for the log and a held stream's comment
	planned   bool   // vLLM aborted it for a planned restart (its drain)
	engine    bool   // vLLM answered that its engine is gone or shutting down
	delivered bool   // the client has some of vLLM's answer
	vllmErr   bool   // vLLM ended the stream with its own error event
	progress  bool   // a continuation gave the client new ids before this cut
}

// course is what differs from one kind of request to another in the loop.
type course interface {
	// send sends the request (again) and passes vLLM's answer on; ok
	// false: it ended (answered, refused or the client left).
	send() (c cut, ok bool)
	// hold waits for vLLM to be ready again; an error: it ended.
	hold(c cut) error
	// again readies the next send: a replay or a continuation; false: it
	// ended.
	again() bool
	// endAlive ends it with what vLLM answered: vLLM stayed up.
	endAlive(c cut)
	// refuse ends it as a suspect (err).
	refuse(err error)
	// named is the request as vLLM saw it, to name a suspect by.
	named() *http.Request
}

// errEnded: a course ended the request itself (its answer is written).
var errEnded = errors.New("request ended")

// live is a request's one forward loop.
func (p *Proxy) live(st *reqState, c course) {
	var first time.Time // the first cut
	for {
		// vLLM's losses of readiness before this send: one after it is
		// what cut it, even when the guard has already made another vLLM
		// ready (a failover to the standby) by the time the cut is read.
		sent, _ := p.lim.generation()
		ct, ok := c.send()
		if !ok {
			return
		}
		if first.IsZero() {
			first = time.Now()
		}
		if !p.afterCut(st, c, ct, sent, first) {
			return
		}
	}
}

// afterCut is the one place that decides what a cut means: hold, then send
// again, pass vLLM's answer on, or refuse a suspect; false: it ended.
//
// A death counts against the request as soon as it can be told from a
// planned restart: at the cut when the guard has not seen vLLM go yet (the
// suspect is refused then, and named in that death's record) or has
// claimed it as a death; else after the hold. A count the hold shows
// wrong (the guard never saw vLLM go, or it was no death) is taken back.
// sent is the count of vLLM's losses of readiness when the cut send was
// made: the loss that cut it is the next one.
func (p *Proxy) afterCut(st *reqState, c course, ct cut, sent uint64, first time.Time) bool {
	gen0, _ := p.lim.generation()
	loss := sent + 1
	unseen := gen0 == sent // the guard has not seen vLLM go since the send
	p.touched(st, st.kind())
	counted := false
	if !ct.planned && (unseen || p.diedAt(loss)) {
		var ok bool
		if counted, ok = p.countDeath(st, loss, ct.progress); !ok {
			c.refuse(p.suspect(c.named(), st))
			return false
		}
	}
	if c.hold(ct) != nil {
		return false
	}
	if gen1, _ := p.lim.generation(); gen1 == sent {
		// The guard never saw vLLM go: not a death, and not held
		// against the request.
		p.untouched(st)
		if counted {
			st.deaths--
		}
		return p.unnoticed(st, c, ct, first)
	}
	switch died := p.diedAt(loss); {
	case counted && !died:
		st.deaths-- // a planned restart after all
	case !counted && !ct.planned && died:
		if _, ok := p.countDeath(st, loss, ct.progress); !ok {
			c.refuse(p.suspect(c.named(), st))
			return false
		}
	}
	return c.again()
}

// unnoticed decides for a cut the guard never saw as vLLM going: vLLM
// saying its engine is gone is believed until the hold limit; a close
// before any answer is sent again once; else vLLM's answer is the
// request's.
func (p *Proxy) unnoticed(st *reqState, c course, ct cut, first time.Time) bool {
	_, _, limit, _ := p.outlook()
	switch {
	case ct.engine && !ct.delivered && time.Since(first) <= limit:
	case !ct.delivered && !ct.vllmErr && st.unnoticed == 0:
		st.unnoticed++
	default:
		c.endAlive(ct)
		return false
	}
	return c.again()
}

// countDeath counts the loss of readiness loss against st (once however
// often it is asked); added: this call counted it; ok false: st is at
// [proxy] resume_limit deaths. A continuation that made progress since the
// last send clears the deaths before it: they were not this request's
// doing.
func (p *Proxy) countDeath(st *reqState, loss uint64, progress bool) (added, ok bool) {
	if progress {
		st.deaths = 0
	}
	if st.deaths == 0 || loss != st.deathGen {
		st.deaths++
		st.deathGen = loss
		added = true
	}
	return added, st.deaths < max(p.cfg.ResumeLimit, 1)
}
