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

// retryTransport sends to vLLM; a refused connection (vLLM just died or
// restarts, before the supervisor noticed) is retried until vLLM is back
// or the request's queue deadline passes. Nothing was sent then, so a
// retry is safe for any method.
type retryTransport struct{ p *Proxy }

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, _ := req.Context().Value(ctxKey{}).(*reqState)
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
		if err == nil && st != nil && !t.p.readyNow() && producedNothing(resp) {
			// vLLM is draining for a planned restart (the guard no longer
			// calls it ready) and answered this request with nothing: an
			// empty aborted answer, or a 500 once its engine is gone (see
			// drain.go). Send it again once vLLM is back.
			resp.Body.Close()
			waitWritten(req.Context(), written)
			body, ok := st.replayBody()
			if !ok {
				return nil, errAbortedNoReplay
			}
			t.p.log.Debug("vLLM answered nothing while draining for a restart; holding the request until it is back")
			if req, err = t.again(req, st); err != nil {
				return nil, err
			}
			req.Body = body
			continue
		}
		if err == nil || st == nil || !isDialError(err) || (st.body != nil && st.body.touched()) {
			return resp, err
		}
		t.p.log.Debug("vLLM refused a connection; waiting for it", zap.Error(err))
		if req, err = t.again(req, st); err != nil {
			return nil, err
		}
		if st.body != nil {
			// The transport closed the ReverseProxy's wrapper of the
			// body; the body itself was not read.
			req.Body = st.body
		}
	}
}

// again counts a retry, waits until vLLM is back (or the request's queue
// deadline passes) and returns req aimed at vLLM as it is now; the caller
// sets its body.
func (t *retryTransport) again(req *http.Request, st *reqState) (*http.Request, error) {
	t.p.retries.Add(1)
	if err := t.waitReady(req.Context(), st.deadline); err != nil {
		return nil, err
	}
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

// waitReady waits for a change of readiness or a poll interval, and then
// for vLLM to be ready, until deadline.
func (t *retryTransport) waitReady(ctx context.Context, deadline time.Time) error {
	timer := time.NewTimer(min(retryPoll, time.Until(deadline)))
	defer timer.Stop()
	for first := true; ; first = false {
		if !first && t.p.lim.isReady() {
			return nil
		}
		if !time.Now().Before(deadline) {
			return errNotReady
		}
		changed := t.p.lim.wait()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-timer.C:
			timer.Reset(min(retryPoll, max(time.Until(deadline), time.Millisecond)))
		}
		t.p.refresh()
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
			resp.Body.(*sseBody).cut = func() { p.streamNotResumed(reason) }
		}
	}
	return nil
}
