// Holding a request while vLLM is away (issue 30): a request that arrives
// while vLLM loads or restarts, or one that a death of vLLM (or a drain)
// left with nothing, waits for vLLM to be ready again instead of failing.
// One mechanism serves planned restarts and failures alike: the limiter's
// queue, driven by the guard's readiness (Notify), with resumed requests
// first in line.

package proxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Outlook is an Upstream that says what vLLM's absence means to a held
// request.
type Outlook interface {
	// Outlook: comingBack is whether vLLM is loading, restarting or backing
	// off (hold), not failed, given up or stopping for good (refuse at
	// once). readyIn is the expected time until it is ready (Retry-After).
	// holdLimit is how long a request may be held for it. why is words for
	// a held stream's comment and status.
	Outlook() (comingBack bool, readyIn, holdLimit time.Duration, why string)
}

const (
	// DefaultHoldLimit is the hold limit when nothing better is known: an
	// Upstream that is not an Outlook, or no restart seen yet.
	DefaultHoldLimit = 2 * time.Minute
	// defaultTickEvery: a held stream's comment, often enough that clients
	// and load balancers (nginx's proxy_read_timeout: 60 s) do not give up.
	defaultTickEvery = 5 * time.Second
	// defaultNoticeWait bounds how long a request that saw vLLM die waits
	// for the guard to notice (vLLM still called ready) before it is sent
	// again anyway: a death the guard never notices was not one.
	defaultNoticeWait = 2 * time.Second
)

// outlook is the Upstream's Outlook, with [proxy] hold_timeout in force
// when set. An Upstream that is not an Outlook is always coming back.
func (p *Proxy) outlook() (comingBack bool, readyIn, holdLimit time.Duration, why string) {
	comingBack, holdLimit, why = true, DefaultHoldLimit, "vLLM is not ready"
	if o, ok := p.up.(Outlook); ok {
		comingBack, readyIn, holdLimit, why = o.Outlook()
	}
	if d := p.cfg.HoldTimeout.Duration; d > 0 {
		holdLimit = d
	}
	return comingBack, readyIn, holdLimit, why
}

// retryAfterDown is the Retry-After of a refusal while vLLM is down: the
// expected time until it is ready, in whole seconds.
func (p *Proxy) retryAfterDown() string {
	_, readyIn, _, _ := p.outlook()
	if readyIn <= 0 {
		return retryAfterNotReady
	}
	return strconv.Itoa(int(math.Ceil(readyIn.Seconds())))
}

// holdUntilReady waits until vLLM is ready again, the request's hold
// deadline passes, the guard says vLLM is not coming back (failed, gave up,
// final stop), or ctx ends. tick, if not nil, is called every few seconds
// while it waits (streams write an SSE comment with it).
//
// The request gives its slot back while it waits and, on a nil error,
// holds one again: it is admitted before every new request, oldest first,
// within the admission bound in force then. A refusal is a *rejection
// (upstreamError and reject answer it); ctx's error means the client left.
func (p *Proxy) holdUntilReady(ctx context.Context, st *reqState, tick func(why string)) error {
	start := time.Now()
	defer func() { p.m.holdTime.Observe(time.Since(start).Seconds()) }()
	st.giveBack(p.lim)
	if err := p.awaitNotice(ctx); err != nil {
		return err
	}
	a := admit{cost: st.cost, tokens: st.tokens, arrived: st.arrived, queueTimeout: p.cfg.QueueTimeout.Duration,
		resumed: true, paused: tick != nil}
	if tick != nil {
		a.tick = func() {
			_, _, _, why := p.outlook()
			tick(why)
		}
		a.tickEvery = p.tickEvery
	}
	if _, err := p.lim.acquire(ctx, a); err != nil {
		if _, ok := isRejection(err); ok {
			st.ended(OutcomeRefused, "")
		}
		return err
	}
	st.slot = true
	return nil
}

// awaitNotice: while the guard still calls vLLM ready (it has not seen the
// death yet), wait for it to notice, up to p.noticeWait. The guard's view is
// asked again every retryPoll, in case no Notify comes.
func (p *Proxy) awaitNotice(ctx context.Context) error {
	p.refresh()
	gen, ready := p.lim.generation()
	if !ready {
		return nil
	}
	until := time.Now().Add(p.noticeWait)
	t := time.NewTimer(retryPoll)
	defer t.Stop()
	for time.Now().Before(until) {
		changed := p.lim.wait()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-t.C:
			t.Reset(retryPoll)
		}
		p.refresh()
		if g, r := p.lim.generation(); g != gen || !r {
			return nil
		}
	}
	return nil
}

// errSuspect ends a request that was in flight at resume_limit deaths of
// vLLM: it is not sent again, for it may be what kills vLLM.
var errSuspect = errors.New("the request was in flight at every death of vLLM it saw; not sent again")

// Suspect is a request the proxy refused to send again because it was in
// flight at [proxy] resume_limit deaths of vLLM in a row: it may be what
// kills vLLM (one giant request can OOM it on every start). The incident
// record names it.
type Suspect struct {
	Time         time.Time `json:"time"`
	Path         string    `json:"path"`
	Client       string    `json:"client"`
	BodyBytes    int64     `json:"body_bytes"`
	PromptTokens float64   `json:"prompt_tokens"`
	Deaths       int       `json:"deaths"`
}

// suspectError is errSuspect in words for the client.
type suspectError struct{ msg string }

func (e *suspectError) Error() string { return e.msg }
func (e *suspectError) Unwrap() error { return errSuspect }

// suspect ends a request in flight at resume_limit deaths: it is logged,
// counted and handed to the guard (SetOnSuspect) so that the incident
// record names it.
func (p *Proxy) suspect(req *http.Request, st *reqState) error {
	s := Suspect{Time: time.Now(), Path: req.URL.Path, Client: requestClient(req), PromptTokens: math.Round(st.tokens), Deaths: st.deaths}
	if st.body != nil {
		s.BodyBytes = st.body.b.size
	}
	p.suspects.Add(1)
	p.lastSuspect.Store(&s)
	st.ended(OutcomeSuspect, "")
	p.noteResumeFailed(FailedSuspect)
	p.log.Warn("a request was in flight at every death of vLLM it saw; not sending it again: it may be what kills vLLM",
		zap.String("path", s.Path), zap.String("client", s.Client), zap.Int64("body_bytes", s.BodyBytes),
		zap.Float64("prompt_tokens", s.PromptTokens), zap.Int("deaths", s.Deaths), zap.Int("resume_limit", p.cfg.ResumeLimit))
	if f := p.onSuspect.Load(); f != nil {
		(*f)(s)
	}
	return &suspectError{msg: fmt.Sprintf("vLLM died %d times while this request was in flight (%d bytes, about %.0f prompt tokens); "+
		"vllm-guard does not send it again ([proxy] resume_limit = %d), for it may be what kills vLLM: shorten the prompt or lower max_tokens",
		s.Deaths, s.BodyBytes, s.PromptTokens, p.cfg.ResumeLimit)}
}

// requestClient is the request's client as the proxy saw it: the first
// X-Forwarded-For address when a load balancer sent it, else the peer.
func requestClient(req *http.Request) string {
	// The outgoing request carries the peer appended by SetXForwarded.
	if xff := req.Header.Get("X-Forwarded-For"); xff != "" {
		first, _, _ := strings.Cut(xff, ",")
		return strings.TrimSpace(first)
	}
	return req.RemoteAddr
}

// SetOnSuspect sets what is told of each request refused another send
// after resume_limit deaths (the guard's incident record). Call it before
// Serve.
func (p *Proxy) SetOnSuspect(f func(Suspect)) { p.onSuspect.Store(&f) }

// SetOnContinued is told the time each continued stream's first new token
// after a cut is written to its client (a failover's end, as a client sees
// it). f must not block.
func (p *Proxy) SetOnContinued(f func(at time.Time)) { p.onContinued.Store(&f) }

func (p *Proxy) continuedAt(at time.Time) {
	if f := p.onContinued.Load(); f != nil {
		(*f)(at)
	}
}

// replayWhy is why a request is sent again.
type replayWhy int

const (
	replayNone  replayWhy = iota
	replayDrain           // vLLM drains for a restart (or is shutting down) and answered nothing
	replayDeath           // vLLM died under the request before any answer
)

func (w replayWhy) String() string {
	switch w {
	case replayDrain:
		return "drain"
	case replayDeath:
		return "death"
	}
	return "none"
}

// nothingProduced judges vLLM's answer (or its failure) to an inference
// request: whether its client got nothing and it is to be sent again. A
// response's body is restored, to be passed on unchanged, when not.
func (p *Proxy) nothingProduced(req *http.Request, st *reqState, resp *http.Response, err error) replayWhy {
	if req.Context().Err() != nil {
		return replayNone
	}
	if err != nil {
		// The connection reset or closed before any answer: vLLM died.
		if isVLLMGone(err) && !errors.Is(err, errNoTarget) {
			if p.cfg.Resume {
				return replayDeath
			}
			p.noteResumeFailed(FailedResumeOff)
			p.touched(st, st.kind())
			st.ended(notResumed, FailedResumeOff)
		}
		return replayNone
	}
	if resp.StatusCode == http.StatusInternalServerError {
		switch engineError(resp) {
		case engineDead:
			if p.cfg.Resume {
				return replayDeath
			}
			if p.readyNow() {
				p.noteResumeFailed(FailedResumeOff)
			}
			p.touched(st, st.kind())
			st.ended(notResumed, FailedResumeOff)
		case engineShutdown:
			if p.cfg.Resume {
				return replayDrain
			}
		}
	}
	if !p.readyNow() && producedNothing(resp) {
		return replayDrain
	}
	return replayNone
}

// noteResumed counts a request resumed: ResumedReplayed or
// ResumedContinued (the stream continuation counts its own through it).
func (p *Proxy) noteResumed(how string) {
	p.m.resumed.WithLabelValues(how).Inc()
	p.resumed.Add(1)
}

// noteResumeFailed counts a request a death or drain ended that was not
// resumed, by reason (Failed*, or a stream's own reasons).
func (p *Proxy) noteResumeFailed(reason string) { p.m.resumeFailed.WithLabelValues(reason).Inc() }
