// The way to vLLM and back: a refused connection retried until vLLM is back
// or the request's deadline passes, and vLLM's failures answered in
// OpenAI's shape.

package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// errNotReady ends a request whose vLLM stayed unreachable until its
// deadline.
var errNotReady = errors.New("vLLM did not come back before the request's queue deadline")

// retryTransport sends to vLLM. A refused connection (vLLM just died or
// restarts, before the supervisor noticed) is retried until vLLM is back:
// nothing was sent, so a retry is safe for any method (dial). An inference
// request that is not a resumable stream lives in the one forward loop
// (lifecycle.go) as its zero-delivered case: replay.
type retryTransport struct{ p *Proxy }

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, _ := req.Context().Value(ctxKey{}).(*reqState)
	if st == nil || st.streamOwned {
		// A pass-through request, or a resumable stream's send (its own
		// loop decides what a death means).
		resp, err, _ := t.dial(req, st)
		return resp, err
	}
	rp := &replay{t: t, req: req, st: st}
	t.p.live(st, rp)
	return rp.resp, rp.err
}

// dial sends req, waiting out refused connections (nothing was sent). written
// closes once the transport is done with the body.
func (t *retryTransport) dial(req *http.Request, st *reqState) (*http.Response, error, <-chan struct{}) {
	var refusedSince time.Time // vLLM first refused the connection
	for {
		if req.URL.Host == "" {
			// The target was unknown at rewrite time.
			if _, err := t.p.targetURL(); err != nil {
				return nil, err, nil
			}
		}
		var wait *awaitEntry
		var written <-chan struct{}
		if st != nil {
			wait = t.p.await.add(st.tokens)
			req.Body, written = closeSignal(req.Body)
		}
		resp, err := t.p.tr.RoundTrip(req)
		if wait != nil {
			if err != nil || resp.StatusCode == http.StatusSwitchingProtocols {
				// An upgraded connection's body must stay the transport's
				// own (it is written to as well): its answer has begun.
				wait.done()
			} else {
				resp.Body = &firstByteBody{ReadCloser: resp.Body, e: wait}
			}
		}
		if st == nil || err == nil || !isDialError(err) || (st.body != nil && st.body.touched()) {
			return resp, err, written
		}
		// Nothing was sent: wait for vLLM and send it again. While the
		// guard still calls vLLM ready this is bounded by the queue
		// timeout, as before; once it does not, by the hold.
		if refusedSince.IsZero() {
			refusedSince = time.Now()
		}
		t.p.log.Debug("vLLM refused a connection; waiting for it", zap.Error(err))
		t.p.retries.Add(1)
		if err := t.p.awaitRefused(req.Context(), st, refusedSince); err != nil {
			return nil, err, nil
		}
		if req, err = t.reaim(req); err != nil {
			return nil, err, nil
		}
		if st.body != nil {
			// The transport closed the ReverseProxy's wrapper of the
			// body; the body itself was not read.
			req.Body = st.body
		}
	}
}

// replay is the course (lifecycle.go) of a request whose answer the
// ReverseProxy passes on: a cut is a death or drain before vLLM's answer,
// and sending again is the same request from the one copy of its body.
type replay struct {
	t    *retryTransport
	req  *http.Request
	st   *reqState
	resp *http.Response // vLLM's answer (passed on unless sent again)
	err  error
}

func (r *replay) send() (cut, bool) {
	p := r.t.p
	resp, err, written := r.t.dial(r.req, r.st)
	r.resp, r.err = resp, err
	why := p.nothingProduced(r.req, r.st, resp, err)
	if why == replayNone {
		return cut{}, false
	}
	waitWritten(r.req.Context(), written)
	if err := r.req.Context().Err(); err != nil {
		r.drop()
		r.err = err
		return cut{}, false
	}
	if _, ok := r.st.replayBody(); !ok {
		p.touched(r.st, r.st.kind())
		p.noteResumeFailed(FailedBodyNotKept)
		r.st.ended(notResumed, FailedBodyNotKept)
		r.drop()
		r.err = errAbortedNoReplay
		return cut{}, false
	}
	return cut{why: why.String(), planned: why == replayDrain, engine: resp != nil}, true
}

// drop closes and forgets vLLM's answer: it is not the request's.
func (r *replay) drop() {
	if r.resp != nil {
		r.resp.Body.Close()
	}
	r.resp, r.err = nil, nil
}

func (r *replay) hold(c cut) error {
	p := r.t.p
	p.log.Debug("vLLM answered nothing (it died, or drains for a restart); holding the request until it is back",
		zap.String("path", r.req.URL.Path), zap.String("why", c.why))
	p.retries.Add(1)
	err := p.holdUntilReady(r.req.Context(), r.st, nil)
	if err != nil {
		p.countHoldFailure(err)
		r.drop()
		r.err = err
	}
	return err
}

func (r *replay) again() bool {
	r.drop()
	body, _ := r.st.replayBody()
	req, err := r.t.reaim(r.req)
	if err != nil {
		r.err = err
		return false
	}
	req.Body, r.req = body, req
	r.t.p.noteResumed(ResumedReplayed)
	r.st.resumedHow(ResumedReplayed)
	return true
}

// endAlive: vLLM stayed up; what it answered (or how it failed) is passed
// on.
func (r *replay) endAlive(cut) {}

func (r *replay) refuse(err error) {
	r.drop()
	r.err = err
}

func (r *replay) named() *http.Request { return r.req }

// reaim returns req aimed at vLLM as it is now; the caller sets its body.
func (t *retryTransport) reaim(req *http.Request) (*http.Request, error) {
	u, err := t.p.targetURL()
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host = u.Scheme, u.Host
	return req, nil
}

// readyNow is whether the guard calls vLLM ready at this moment, asked of
// the Upstream itself rather than the limiter's last view: a drain's
// first answers can come before the limiter heard of the stop.
func (p *Proxy) readyNow() bool {
	_, ready := p.up.Target()
	return ready && p.lim.isReady()
}

// awaitRefused waits after a refused connection: for a change of
// readiness or a poll interval, then for vLLM to be ready. While the guard
// still calls vLLM ready the wait ends retryPoll later (the caller tries
// again), or with errNotReady once the queue timeout has passed since the
// first refusal; when it does not, the request is held (holdUntilReady).
func (p *Proxy) awaitRefused(ctx context.Context, st *reqState, since time.Time) error {
	changed := p.lim.wait()
	t := time.NewTimer(retryPoll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-changed:
	case <-t.C:
	}
	p.refresh()
	if p.lim.isReady() {
		if time.Since(since) >= p.cfg.QueueTimeout.Duration {
			st.ended(OutcomeRefused, "")
			return errNotReady
		}
		return nil
	}
	if !p.cfg.Resume && !time.Now().Before(st.deadline) {
		st.ended(OutcomeRefused, "")
		return errNotReady
	}
	// Nothing was sent: for the death under way, it arrived while vLLM
	// was down.
	p.touched(st, KindArrivedWhileDown)
	if err := p.holdUntilReady(ctx, st, nil); err != nil {
		p.countHoldFailure(err)
		return err
	}
	return nil
}

// countHoldFailure counts a held request refused: the hold limit passed,
// or vLLM is not coming back.
func (p *Proxy) countHoldFailure(err error) {
	if rj, ok := isRejection(err); ok {
		switch {
		case rj.gone:
			p.noteResumeFailed(FailedNotComingBack)
		case rj.held:
			p.noteResumeFailed(FailedHoldTimeout)
		}
	}
}

func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// upstreamError answers a request that got no response from vLLM.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		p.tooLarge(w, mbe.Limit+1)
	case r.Context().Err() != nil:
		// The client left: its upstream request is cancelled with it.
	case errors.Is(err, errNotReady):
		p.lim.reject(reasonNotReady)
		p.reject(w, &rejection{reason: reasonNotReady})
	case errors.Is(err, errSuspect):
		writeError(w, http.StatusUnprocessableEntity, "invalid_request_error", err.Error())
	case errors.As(err, new(*rejection)):
		rj, _ := isRejection(err)
		p.reject(w, rj)
	case errors.Is(err, errAbortedNoReplay):
		w.Header().Set("Retry-After", retryAfterNotReady)
		writeError(w, http.StatusServiceUnavailable, "server_error",
			"vLLM is restarting and aborted this request before generating anything; its body is too large for vllm-guard to send again: retry shortly")
	case r.Context().Value(ctxKey{}) == nil && (isDialError(err) || errors.Is(err, errNoTarget)):
		// A pass-through request (a probe, a scrape) while vLLM is down:
		// answered at once, never held.
		w.Header().Set("Retry-After", retryAfterNotReady)
		writeError(w, http.StatusServiceUnavailable, "server_error",
			"vLLM is not up now (loading, restarting or backing off); vllm-guard status says why")
	case isVLLMGone(err):
		p.log.Debug("vLLM went away during a request", zap.String("path", r.URL.Path), zap.Error(err))
		w.Header().Set("Retry-After", retryAfterNotReady)
		writeError(w, http.StatusServiceUnavailable, "server_error",
			"vLLM went away before answering (it is restarting); retry shortly")
	default:
		p.log.Warn("vLLM request failed", zap.String("path", r.URL.Path), zap.Error(err))
		writeError(w, http.StatusBadGateway, "server_error", "vLLM request failed: "+err.Error())
	}
}

// isVLLMGone: the connection to vLLM failed or closed under the request.
func isVLLMGone(err error) bool {
	var ne net.Error
	return isDialError(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, errNoTarget) ||
		(errors.As(err, &ne) && !ne.Timeout())
}

// modifyResponse guards SSE streams against a cut.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	if isEventStream(resp.Header.Get("Content-Type")) {
		resp.Body = &sseBody{rc: resp.Body, ctx: resp.Request.Context(), log: p.log, path: resp.Request.URL.Path, lastNL: 2}
		if reason, ok := resp.Request.Context().Value(notResumedKey{}).(string); ok {
			st, _ := resp.Request.Context().Value(ctxKey{}).(*reqState)
			resp.Body.(*sseBody).cut = func() {
				p.streamNotResumed(reason)
				if st != nil {
					p.touched(st, KindStreams)
					st.ended(notResumed, reason)
				}
			}
		}
	}
	return nil
}
