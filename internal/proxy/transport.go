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
// nothing was sent, so a retry is safe for any method. An inference request
// that vLLM's death or drain left with nothing for its client is held and
// sent again from the one copy of its body once vLLM is ready (replay):
// planned restarts and failures take this one path.
type retryTransport struct{ p *Proxy }

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, _ := req.Context().Value(ctxKey{}).(*reqState)
	// refusedSince: vLLM first refused the connection; firstReplay: the
	// request was first held to be sent again (past the hold limit from
	// it, vLLM's answer is passed on).
	var refusedSince, firstReplay time.Time
	for {
		if req.URL.Host == "" {
			// The target was unknown at rewrite time.
			if _, err := t.p.targetURL(); err != nil {
				return nil, err
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
		if st == nil {
			return resp, err
		}
		if err != nil && isDialError(err) && (st.body == nil || !st.body.touched()) {
			// Nothing was sent: wait for vLLM and send it again. While the
			// guard still calls vLLM ready this is bounded by the queue
			// timeout, as before; once it does not, by the hold.
			if refusedSince.IsZero() {
				refusedSince = time.Now()
			}
			t.p.log.Debug("vLLM refused a connection; waiting for it", zap.Error(err))
			t.p.retries.Add(1)
			if err := t.p.awaitRefused(req.Context(), st, refusedSince); err != nil {
				return nil, err
			}
			if req, err = t.reaim(req); err != nil {
				return nil, err
			}
			if st.body != nil {
				// The transport closed the ReverseProxy's wrapper of the
				// body; the body itself was not read.
				req.Body = st.body
			}
			continue
		}
		if st.streamOwned {
			// A resumable stream's one loop (resume.go) decides what a
			// death before its answer means: the same as one after.
			return resp, err
		}
		why := t.p.nothingProduced(req, st, resp, err)
		if why == replayNone || (why == replayDeath && err != nil && st.unnoticed > 0) {
			// A second close the guard did not see as a death: vLLM is up
			// and cut this request itself; the failure is passed on.
			return resp, err
		}
		if _, _, limit, _ := t.p.outlook(); !firstReplay.IsZero() && time.Since(firstReplay) > limit {
			// vLLM keeps saying its engine is gone (or shutting down) and
			// the guard never sees it go: its answer is passed on.
			return resp, err
		}
		if firstReplay.IsZero() {
			firstReplay = time.Now()
		}
		refusedSince = time.Time{}
		if resp != nil {
			resp.Body.Close()
		}
		waitWritten(req.Context(), written)
		if req.Context().Err() != nil {
			return nil, req.Context().Err()
		}
		t.p.touched(st, st.kind())
		if why == replayDeath && !t.p.noteDeath(st) {
			return nil, t.p.suspect(req, st)
		}
		body, ok := st.replayBody()
		if !ok {
			t.p.noteResumeFailed(FailedBodyNotKept)
			st.ended(notResumed, FailedBodyNotKept)
			return nil, errAbortedNoReplay
		}
		t.p.log.Debug("vLLM answered nothing (it died, or drains for a restart); holding the request until it is back",
			zap.String("path", req.URL.Path), zap.String("why", why.String()))
		t.p.retries.Add(1)
		if err := t.p.holdUntilReady(req.Context(), st, nil); err != nil {
			t.p.countHoldFailure(err)
			return nil, err
		}
		if gen, _ := t.p.lim.generation(); why == replayDeath && gen < st.deathGen {
			// The guard has not seen vLLM go: not a death (a connection
			// vLLM closed as it was reused, or an engine error the guard
			// has yet to see), and not held against the request.
			st.deaths--
			st.unnoticed++
			t.p.untouched(st)
		}
		if req, err = t.reaim(req); err != nil {
			return nil, err
		}
		req.Body = body
		t.p.noteResumed(ResumedReplayed)
		st.resumedHow(ResumedReplayed)
	}
}

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
