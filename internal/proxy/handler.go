// One request through the proxy: which requests take a slot (IsInference),
// admission and its refusals (413, 429, 503), and the rewrite to vLLM.

package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/admission"
)

type ctxKey struct{}

// clientBodyKey holds a pass-through request's *clientBody.
type clientBodyKey struct{}

// reqState travels with a request through the ReverseProxy. Only the
// request's own goroutine touches it.
type reqState struct {
	arrived  time.Time // its arrival: resumed requests are admitted oldest first
	deadline time.Time // the queue bound: also for waiting out a refused connection
	body     *trackBody
	tokens   float64 // the prompt's estimated tokens (Awaiting)
	cost     float64 // its predicted memory (the memory bound)
	slot     bool    // it holds an admission slot now
	// deaths: the deaths of vLLM it was in flight at, the last one in the
	// limiter's generation deathGen (countDeath, lifecycle.go).
	deaths   int
	deathGen uint64
	// unnoticed: it was sent again after a death the guard never saw (a
	// connection closed as it was reused); once is enough.
	unnoticed int
	// What a death's account says of it (deaths.go): touched, the account
	// it joined last; stream and output: a stream, whose client has
	// generated tokens; how: resumed how (ResumedReplayed,
	// ResumedContinued); end and endReason: how it ended when not
	// answered (OutcomeRefused, OutcomeSuspect, notResumed and why).
	// streamOwned: a resumable stream's life (resume.go) decides what
	// every death means to it; the transport only waits out a refused
	// connection for it.
	streamOwned    bool
	touched        bool
	lastTally      *deathTally
	stream, output bool
	how            string
	end, endReason string
}

// kind is the kind of request a death touches st as.
func (st *reqState) kind() string {
	switch {
	case st.output:
		return KindStreams
	case st.stream:
		return KindStreamsBeforeFirstToken
	}
	return KindNonStreaming
}

// ended marks how st ended, unless that is said already.
func (st *reqState) ended(what, reason string) {
	if st.end == "" {
		st.end, st.endReason = what, reason
	}
}

// resumedHow marks st resumed: a stream continued once stays continued.
func (st *reqState) resumedHow(how string) {
	if st.how != ResumedContinued {
		st.how = how
	}
}

// outcome is what became of st, answered code (0: nothing), for a kind.
func (st *reqState) outcome(code int) outcomeOf {
	return func(kind string) (string, string) {
		switch {
		case st.end != "":
			return st.end, st.endReason
		case code == 0:
			return OutcomeClientGone, ""
		case code >= 500:
			return OutcomeFailed, ""
		case kind == KindArrivedWhileDown:
			return OutcomeServedAfterHold, ""
		case st.how != "":
			return st.how, ""
		}
		return OutcomeFailed, ""
	}
}

// giveBack returns the request's slot, if it holds one.
func (st *reqState) giveBack(l *limiter) {
	if st.slot {
		st.slot = false
		l.release(st.cost, st.tokens)
	}
}

// replayBody is the request's body to send again (none: http.NoBody).
func (st *reqState) replayBody() (io.ReadCloser, bool) {
	if st.body == nil {
		return http.NoBody, true
	}
	return st.body.replay()
}

// IsInference reports whether a request takes an admission slot: a POST
// under /v1/ or /v2/ (completions, chat, embeddings, responses, audio,
// rerank, scoring) or to vLLM's pooling and tokenizer endpoints at the root,
// and a protocol upgrade (a WebSocket: realtime) to any of those paths.
// Everything else (/health, /ping, /metrics, /version, /v1/models, /load, a
// GET of anything) passes straight through. The method is compared in any
// case and the path as cleanPath leaves it, so that what is checked is what
// vLLM routes (issue 24: //v1/completions and "post" went round the slots).
func IsInference(r *http.Request) bool {
	upgrade := r.Header.Get("Upgrade") != ""
	if !strings.EqualFold(r.Method, http.MethodPost) && !upgrade {
		return false
	}
	path := cleanPath(r.URL.Path)
	if strings.HasPrefix(path, "/v1/") || strings.HasPrefix(path, "/v2/") {
		return true
	}
	switch path {
	case "/pooling", "/classify", "/score", "/rerank", "/tokenize", "/detokenize", "/invocations":
		return true
	}
	return false
}

// cleanPath is p with repeated slashes and dot segments removed, as a
// router that normalises paths sees it.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	return path.Clean("/" + p)
}

// normalize makes r what the inference check and vLLM both see: the method
// in upper case, the path cleaned.
func normalize(r *http.Request) {
	if m := strings.ToUpper(r.Method); m != r.Method {
		r.Method = m
	}
	if c := cleanPath(r.URL.Path); c != r.URL.Path {
		r.URL.Path, r.URL.RawPath = c, ""
	}
}

// ServeHTTP admits, forwards and accounts for one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w, rc: http.NewResponseController(w), writeTimeout: p.cfg.WriteTimeout.Duration}
	defer p.account(rec, r, start)
	if p.stopping.Load() {
		p.stoppingRefusal(rec)
		return
	}
	if limit := p.cfg.MaxBodyBytes; limit > 0 && r.ContentLength > limit {
		p.tooLarge(rec, r.ContentLength)
		return
	}
	normalize(r)
	switch {
	case IsOperatorRoute(r):
		p.refuseOperatorRoute(rec, r)
	case !IsInference(r):
		p.passThrough(rec, r)
	default:
		p.serveInference(rec, r, start)
	}
}

// account counts a request's answer once it has ended.
func (p *Proxy) account(rec *recorder, r *http.Request, start time.Time) {
	if rec.stalled {
		p.log.Info("client read none of its answer within write_timeout; request ended, cancelled at vLLM, slot freed",
			zap.String("path", r.URL.Path), zap.String("client", r.RemoteAddr), zap.Duration("write_timeout", p.cfg.WriteTimeout.Duration))
	}
	code := rec.code
	if code == 0 {
		code = 499 // the client left before any answer (nginx's convention)
	}
	p.m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
	p.m.duration.Observe(time.Since(start).Seconds())
}

// passThrough sends probes, scrapes and listings straight to vLLM: a load
// balancer's health check or Prometheus must never wait behind generation
// requests, be refused for load, or take their slots. A body with no
// length is still bounded (upstreamError: 413).
func (p *Proxy) passThrough(rec *recorder, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		if p.cfg.MaxBodyBytes > 0 {
			r.Body = http.MaxBytesReader(rec, r.Body, p.cfg.MaxBodyBytes)
		}
		cb := &clientBody{ReadCloser: r.Body}
		r.Body = cb
		r = r.WithContext(context.WithValue(r.Context(), clientBodyKey{}, cb))
	}
	p.rp.ServeHTTP(rec, r)
}

// serveInference admits an inference request and hands it to its forward
// loop (lifecycle.go). The body is read before admission, unless the
// client waits for 100 Continue: it is told to send once admitted, and
// until its body is read its prompt is guessed from its length (a quarter
// of its bytes, at most the room: base64 images would make it far too
// much).
func (p *Proxy) serveInference(rec *recorder, r *http.Request, start time.Time) {
	expect := expectsContinue(r)
	var body *bufferedBody
	var tokens float64
	if expect {
		tokens = float64(r.ContentLength) / 4
	} else {
		sc := newPromptScanner()
		var ok bool
		if body, ok = p.readBody(rec, r, sc, bodyDeadline(start)); !ok {
			return
		}
		defer body.release()
		if body.size > 0 {
			tokens = sc.tokens(body.size)
		}
	}
	p.refresh()
	bound := p.bound.Load()
	var cost float64
	if bound != nil && bound.RoomBytes > 0 {
		cost = bound.Model.RequestBytes(tokens)
		if cost > bound.RoomBytes {
			if !expect {
				p.tooLargeForMemory(rec, tokens, cost, bound)
				return
			}
			cost = bound.RoomBytes // decided once the body is read
		}
	}
	st := &reqState{arrived: start, deadline: start.Add(p.cfg.QueueTimeout.Duration), tokens: tokens, cost: cost}
	// A request some death touched: what became of it goes in that
	// death's account once it has finished.
	defer func() { p.finished(st, st.outcome(rec.code)) }()
	if !p.admit(rec, r, st) {
		return
	}
	defer st.giveBack(p.lim)
	if expect {
		if body = p.readAdmittedBody(rec, r, st, bound); body == nil {
			return
		}
		defer body.release()
	}
	p.forward(rec, r, st, body)
}

// admit waits for a slot; false: the request was refused (and answered)
// or its client left.
func (p *Proxy) admit(rec *recorder, r *http.Request, st *reqState) bool {
	genAtArrival, readyAtArrival := p.lim.generation()
	if !readyAtArrival {
		p.touched(st, KindArrivedWhileDown)
	}
	queued, err := p.lim.acquire(r.Context(), admit{cost: st.cost, tokens: st.tokens, arrived: st.arrived, queueTimeout: p.cfg.QueueTimeout.Duration})
	if gen, _ := p.lim.generation(); readyAtArrival && gen != genAtArrival {
		// It waited in the queue while vLLM went away (and came back).
		p.queuedAtDeath(st, gen)
	}
	if err != nil {
		if rj, ok := isRejection(err); ok {
			st.ended(OutcomeRefused, "")
			p.reject(rec, rj)
		}
		return false // else the client left while waiting: nobody to answer
	}
	st.slot = true
	if queued && !readyAtArrival {
		p.m.holdTime.Observe(time.Since(st.arrived).Seconds())
	}
	// A deadline left by an earlier request on this kept-alive connection
	// may have passed: renew it before anything (a 100 Continue) is written.
	rec.renew()
	if queued {
		rec.Header().Set(QueueWaitHeader, strconv.FormatFloat(float64(time.Since(st.arrived).Microseconds())/1000, 'f', 1, 64))
	}
	return true
}

// readAdmittedBody reads the body of a client that waited for 100
// Continue: reading sends it; a slot is held now, so the body must come at
// a minimum rate. Then the guess gives way to the count. nil: refused (and
// answered) or unreadable.
func (p *Proxy) readAdmittedBody(rec *recorder, r *http.Request, st *reqState, bound *admission.Bound) *bufferedBody {
	sc := newPromptScanner()
	body, ok := p.readBody(rec, r, sc, minRateDeadline(time.Now()))
	if !ok {
		return nil
	}
	counted, newCost := sc.tokens(body.size), 0.0
	if bound != nil && bound.RoomBytes > 0 {
		if newCost = bound.Model.RequestBytes(counted); newCost > bound.RoomBytes {
			body.release()
			p.tooLargeForMemory(rec, counted, newCost, bound)
			return nil
		}
	}
	p.lim.adjust(st.cost, st.tokens, newCost, counted)
	st.cost, st.tokens = newCost, counted
	return body
}

// forward sends the admitted request with its body on its forward loop.
func (p *Proxy) forward(rec *recorder, r *http.Request, st *reqState, body *bufferedBody) {
	// The body is here: vLLM has nothing to wait for (and its 100
	// Continue would reach the client a second time).
	r.Header.Del("Expect")
	if body.size > 0 {
		st.body = newTrackBody(body)
		r.Body, r.ContentLength = st.body, body.size
	} else {
		r.Body, r.ContentLength = http.NoBody, 0
	}
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, st))
	if r, done := p.resumeStream(rec, r, st); !done {
		p.rp.ServeHTTP(rec, r)
	}
}

func (p *Proxy) tooLargeForMemory(w http.ResponseWriter, tokens, cost float64, b *admission.Bound) {
	p.lim.reject(reasonTooLargeForMemory)
	p.m.rejected.WithLabelValues(reasonTooLargeForMemory).Inc()
	writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error",
		fmt.Sprintf("request of about %.0f prompt tokens would need about %.0f MiB of GPU memory while it runs; vllm-guard admits at most %.0f MiB "+
			"for all requests in flight (the memory admission limit: predicted peak under 1 − [profile] headroom of the device); shorten the prompt",
			tokens, cost/(1<<20), b.RoomBytes/(1<<20)))
}

func (p *Proxy) tooLarge(w http.ResponseWriter, n int64) {
	p.lim.reject(reasonBodyTooLarge)
	p.m.rejected.WithLabelValues(reasonBodyTooLarge).Inc()
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error",
		fmt.Sprintf("request body of %d bytes is larger than the proxy's limit of %d bytes ([proxy] max_body_bytes)", n, p.cfg.MaxBodyBytes))
}

// stoppingRefusal answers a request that arrived during the guard's final
// stop: at once, the connection closed, so that a client or load balancer
// goes to another instance.
func (p *Proxy) stoppingRefusal(w http.ResponseWriter) {
	p.lim.reject(reasonNotReady)
	p.reject(w, errShutdown)
}

func (p *Proxy) reject(w http.ResponseWriter, rj *rejection) {
	p.m.rejected.WithLabelValues(rj.reason).Inc()
	switch {
	case rj.shutdown:
		w.Header().Set("Retry-After", retryAfterBusy)
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusServiceUnavailable, "server_error",
			"vllm-guard is stopping: this instance will not serve the request; send it to another or retry once it is back")
	case rj.gone:
		_, _, _, why := p.outlook()
		writeError(w, http.StatusServiceUnavailable, "server_error",
			fmt.Sprintf("vLLM is not coming back (%s); vllm-guard status says why", why))
	case rj.held:
		_, _, limit, why := p.outlook()
		w.Header().Set("Retry-After", p.retryAfterDown())
		writeError(w, http.StatusServiceUnavailable, "server_error",
			fmt.Sprintf("vLLM did not come back within the hold limit of %s (%s); retry after Retry-After", limit.Round(time.Second), why))
	case rj.reason == reasonNotReady:
		w.Header().Set("Retry-After", retryAfterNotReady)
		writeError(w, http.StatusServiceUnavailable, "server_error",
			fmt.Sprintf("vLLM is not ready (restarting or loading) and did not come back within %s; retry shortly", p.cfg.QueueTimeout.Duration))
	case rj.down:
		_, _, _, why := p.outlook()
		w.Header().Set("Retry-After", p.retryAfterDown())
		writeError(w, http.StatusServiceUnavailable, "server_error",
			fmt.Sprintf("vLLM is restarting (%s) and vllm-guard already holds %d requests for it ([proxy] queue_size); retry after Retry-After", why, p.cfg.QueueSize))
	case rj.reason == reasonQueueFull:
		w.Header().Set("Retry-After", retryAfterBusy)
		writeError(w, http.StatusTooManyRequests, "rate_limit_error",
			fmt.Sprintf("vllm-guard admission queue is full (%d waiting, %d in flight); retry shortly", p.cfg.QueueSize, p.Stats().Limit))
	default:
		w.Header().Set("Retry-After", retryAfterBusy)
		writeError(w, http.StatusTooManyRequests, "rate_limit_error",
			fmt.Sprintf("no free slot within %s (vllm-guard admission control); retry shortly", p.cfg.QueueTimeout.Duration))
	}
}

// rewrite points the outgoing request at vLLM and says who asked.
//
// No client field is evidence: vLLM's uvicorn trusts the guard (127.0.0.1)
// and prints X-Forwarded-For as the client of its access lines, so a
// client's own value would be text of its choosing in vLLM's output
// (issue 32: "CUDA out of memory" there once made a crash an OOM). The
// ReverseProxy has already removed the client's X-Forwarded-* and
// Forwarded headers; they come back only from a peer in [proxy]
// trusted_proxies, with the peer appended, as nginx's
// $proxy_add_x_forwarded_for does. From anyone else X-Forwarded-For is
// the peer's address alone.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	if u, err := p.targetURL(); err == nil {
		pr.SetURL(u)
	}
	// A request's trailers are dropped: vLLM reads none, and one the
	// transport will not write (Content-Length, Host) failed the request
	// with a 502 and a warning each time (issue 32).
	pr.Out.Trailer = nil
	if !p.trustedPeer(pr.In.RemoteAddr) {
		pr.SetXForwarded()
		return
	}
	in, out := pr.In.Header, pr.Out.Header
	if v := in.Values("X-Forwarded-For"); len(v) > 0 {
		out["X-Forwarded-For"] = v
	}
	pr.SetXForwarded() // appends the peer
	// What the load balancer saw (its scheme, the name asked for) is
	// what vLLM should see.
	for _, h := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v := in.Get(h); v != "" {
			out.Set(h, v)
		}
	}
	if v := in.Values("Forwarded"); len(v) > 0 {
		out.Set("Forwarded", strings.Join(v, ", ")+", for="+forwardedNode(pr.In.RemoteAddr))
	}
}

// trustedPeer reports whether the connection's peer is in [proxy]
// trusted_proxies.
func (p *Proxy) trustedPeer(remote string) bool {
	if len(p.trusted) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	for _, t := range p.trusted {
		if t.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedNode is the peer as a Forwarded header's for= names it (RFC
// 7239: an IPv6 address is bracketed and quoted).
func forwardedNode(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return "unknown"
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		return `"[` + a.String() + `]"`
	}
	return a.String()
}

var errNoTarget = errors.New("vLLM's address is not known yet")

// clientBody is a pass-through request's body as the transport reads it:
// it keeps the error of reading it from the client (a malformed chunk or
// trailer, the client gone), so that a failure of the client's is not
// answered as vLLM's (502 and a warning per request).
// The ReverseProxy hands its error handler its own copy of the request,
// body wrapped: the clientBody travels in the context.
type clientBody struct {
	io.ReadCloser
	err atomic.Pointer[error]
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

// failed is the error of reading the body from the client, if any.
func (b *clientBody) failed() error {
	if e := b.err.Load(); e != nil {
		return *e
	}
	return nil
}

// proxyError answers a request the ReverseProxy could not complete. A
// body the client sent wrong is the client's fault: 400 (or nothing, when
// it left), never vLLM's 502; everything else is upstreamError's.
func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if cb, ok := r.Context().Value(clientBodyKey{}).(*clientBody); ok {
		var mbe *http.MaxBytesError
		if cerr := cb.failed(); cerr != nil && !errors.As(cerr, &mbe) {
			badBody(w, r, cerr)
			return
		}
	}
	p.upstreamError(w, r, err)
}

// badBody answers a request whose body could not be read from its client:
// 400 for a malformed one, nothing when the client left.
func badBody(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return // the client went away: nobody to answer
	}
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusBadRequest, "invalid_request_error",
		fmt.Sprintf("the request body could not be read (%v); send a well-formed body", err))
}

// targetURL parses the Upstream's base URL, once per distinct value.
func (p *Proxy) targetURL() (*url.URL, error) {
	raw, _ := p.up.Target()
	if t := p.target.Load(); t != nil && t.raw == raw {
		return t.u, t.err
	}
	t := &parsedTarget{raw: raw}
	if raw == "" {
		t.err = errNoTarget
	} else if t.u, t.err = url.Parse(raw); t.err == nil && (t.u.Scheme == "" || t.u.Host == "") {
		t.err = fmt.Errorf("vLLM's address %q is not a base URL such as http://127.0.0.1:8000", raw)
	}
	p.target.Store(t)
	return t.u, t.err
}
