// Package proxy owns the admission-control reverse proxy in front of vLLM:
// at most the rung's max_num_seqs × inflight_factor requests in
// flight, fewer when the guard's cost model predicts memory would not hold
// them (requests are then admitted by their predicted memory, from their
// prompt tokens, and one that alone would not fit is refused with 413), a
// bounded FIFO queue with a timeout, a pause (not errors) while vLLM
// restarts, half the admission under memory pressure, SSE passed through
// unbuffered, a stream cut by a vLLM death ended with an error event, and
// the proxy_* metrics. Only inference requests take slots (IsInference);
// probes, scrapes and listings pass straight through. It decides nothing about vLLM itself: an Upstream
// (the supervisor's wiring) says where vLLM is, whether it is ready, the
// rung in force and whether a memory alert is active; one that is also an
// Admitter says the bound in force (policy.Admission decides it).
package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/internal/connlimit"
	"github.com/vllm-guard/vllm-guard/policy"
)

// Upstream is what the proxy asks the supervisor. Its methods are called
// from request goroutines, concurrently, and must be cheap.
type Upstream interface {
	// Target is vLLM's base URL (http://host:port) and whether it is
	// ready now.
	Target() (baseURL string, ready bool)
	// MaxNumSeqs is the max_num_seqs of the rung in force.
	MaxNumSeqs() int
	// Pressure reports whether gpu_memory_critical or oom_predicted is
	// active: admission halves while it is.
	Pressure() bool
}

// Admitter is an Upstream that decides the limit itself (the guard, from its
// cost model). Admission is called on every request and must be cheap.
type Admitter interface {
	Admission() policy.AdmissionBound
}

// Stats is the proxy's admission state, for status and the drill.
type Stats struct {
	Ready      bool              `json:"ready"`
	Limit      int               `json:"limit"`
	Inflight   int               `json:"inflight"`
	Queued     int               `json:"queued"`
	QueueSize  int               `json:"queue_size"`
	Admitted   uint64            `json:"admitted"`
	Rejected   uint64            `json:"rejected"`
	RejectedBy map[string]uint64 `json:"rejected_by_reason"` // queue_full, queue_timeout, not_ready, body_too_large, too_large_for_memory, buffer_full
	// Bound is what sets Limit (rung, memory, trend, reopening, pressure)
	// and Why says it in words.
	Bound string `json:"bound"`
	Why   string `json:"bound_reason,omitempty"`
	// MemoryRoomBytes > 0: the memory bound is in force; the predicted
	// memory of the requests in flight is MemoryInflightBytes.
	MemoryRoomBytes      float64 `json:"memory_room_bytes,omitempty"`
	MemoryInflightBytes  float64 `json:"memory_inflight_bytes,omitempty"`
	PromptTokensInflight float64 `json:"prompt_tokens_inflight"`
	// Engaged: some request ever waited for a slot or was refused one
	// (queue_full, queue_timeout). Waiting for vLLM to be ready is not
	// admission control at work and does not count.
	Engaged bool `json:"engaged"`
	// UpstreamRetries counts connections vLLM refused that the proxy
	// retried (vLLM restarting before the supervisor noticed).
	UpstreamRetries uint64 `json:"upstream_retries"`
}

// QueueWaitHeader is set on responses to requests that waited in the
// queue: the wait in milliseconds. The drill counts queueing with it.
const QueueWaitHeader = "X-Vllm-Guard-Queue-Wait-Ms"

// Bounds of the proxy's connections. Generation can take minutes before
// the first byte of a non-streaming answer, so nothing bounds a response
// in flight: vLLM's liveness is the supervisor's job.
const (
	readHeaderTimeout = 5 * time.Second  // a client's request headers
	bodyReadTimeout   = 60 * time.Second // a client's request body
	// A kept-alive client connection between requests (vLLM's own uvicorn
	// keeps one 5 s). Under pressure an idle connection gives its place
	// to a newcomer sooner (connlimit).
	clientIdleTimeout = 30 * time.Second
	maxHeaderBytes    = 64 << 10
	dialTimeout       = 5 * time.Second
	upstreamIdle      = 90 * time.Second // a pooled connection to vLLM
	drainTimeout      = 30 * time.Second // in-flight requests at shutdown
	// retryPoll: after vLLM refused a connection while still said to be
	// ready, try again this often until the supervisor says otherwise or
	// the request's queue deadline passes.
	retryPoll = 100 * time.Millisecond
)

// Retry-After values (seconds): a full queue drains in about a request's
// time; a restart takes longer.
const (
	retryAfterBusy     = "1"
	retryAfterNotReady = "5"
)

// Proxy is the admission-control reverse proxy. It is an http.Handler;
// Serve runs it on a listener.
type Proxy struct {
	cfg     config.Proxy
	up      Upstream
	log     *zap.Logger
	lim     *limiter
	tr      *http.Transport
	rp      *httputil.ReverseProxy
	m       *metrics
	budget  *bodyBudget
	target  atomic.Pointer[parsedTarget]
	retries atomic.Uint64
	bound   atomic.Pointer[policy.AdmissionBound] // the last applied
	await   awaiting                              // sent to vLLM, no byte of the answer yet
}

type parsedTarget struct {
	raw string
	u   *url.URL
	err error
}

// New builds a proxy over up. reg may be nil (metrics are then not
// registered anywhere); log may be nil.
func New(cfg config.Proxy, up Upstream, reg prometheus.Registerer, log *zap.Logger) *Proxy {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.InflightFactor <= 0 {
		cfg.InflightFactor = 1
	}
	if cfg.WriteTimeout.Duration <= 0 {
		cfg.WriteTimeout = config.Default().Proxy.WriteTimeout
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = config.Default().Proxy.MaxConnections
	}
	if cfg.MaxConnectionsPerClient <= 0 {
		cfg.MaxConnectionsPerClient = config.Default().Proxy.MaxConnectionsPerClient
	}
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = max(config.Default().Proxy.MaxBufferedBytes, cfg.MaxBodyBytes)
	}
	p := &Proxy{cfg: cfg, up: up, log: log.Named("proxy"), lim: newLimiter(max(cfg.QueueSize, 0)),
		budget: &bodyBudget{max: cfg.MaxBufferedBytes}}
	p.tr = &http.Transport{
		Proxy:                 nil, // never an environment proxy between the guard and its vLLM
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   4096,
		IdleConnTimeout:       upstreamIdle,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass encodings through as they are
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      &retryTransport{p: p},
		FlushInterval:  -1, // every write reaches the client at once: SSE events are not held back
		BufferPool:     bufferPool{},
		ErrorHandler:   p.upstreamError,
		ModifyResponse: p.modifyResponse,
		// Its messages are per request (a client gone mid-copy): debug.
		ErrorLog: newStdLog(p.log, zap.DebugLevel),
	}
	p.m = newMetrics(reg, p.lim, p.budget)
	p.refresh()
	return p
}

// Notify tells the proxy that readiness, the rung or the alerts changed:
// it recomputes the limit and wakes waiters. Call it on every change.
func (p *Proxy) Notify() { p.refresh() }

// Stats returns the admission state now.
func (p *Proxy) Stats() Stats {
	s := p.lim.stats()
	s.UpstreamRetries = p.retries.Load()
	if b := p.bound.Load(); b != nil {
		s.Bound, s.Why = b.Bound, b.Why
	}
	return s
}

// Window is what was in flight since the previous call (the guard's cost
// samples pair it with the GPU memory).
func (p *Proxy) Window() Window { return p.lim.window() }

// limitFor is the admission limit for a rung and pressure.
func limitFor(maxNumSeqs int, factor float64, pressure bool) int {
	n := max(int(float64(maxNumSeqs)*factor), 1)
	if pressure {
		n = max(n/2, 1)
	}
	return n
}

func (p *Proxy) refresh() {
	_, ready := p.up.Target()
	var b policy.AdmissionBound
	if a, ok := p.up.(Admitter); ok {
		b = a.Admission()
	} else {
		b = policy.AdmissionBound{Limit: limitFor(p.up.MaxNumSeqs(), p.cfg.InflightFactor, p.up.Pressure()), Bound: policy.BoundRung,
			Why: "max_num_seqs × inflight_factor"}
		if p.up.Pressure() {
			b.Bound, b.Why = policy.BoundPressure, "halved while gpu_memory_critical or oom_predicted is active"
		}
	}
	if old := p.bound.Load(); old == nil || old.Bound != b.Bound || old.Limit != b.Limit || old.RoomBytes != b.RoomBytes {
		// The guard says a change of bound on its event stream.
		p.bound.Store(&b)
		p.m.setBound(b.Bound)
	}
	if p.lim.set(b.Limit, b.RoomBytes, ready) {
		// vLLM went away: its pooled connections are dead or about to be.
		p.tr.CloseIdleConnections()
	}
}

// Serve answers on l until ctx is done, then stops accepting, refuses the
// queued requests (503) and lets those in flight finish (up to 30 s). At
// most [proxy] max_connections client connections are open at once, fewer
// if the descriptor limit leaves less after the supervision reserve
// (connlimit.Caps), and at most max_connections_per_client of one client
// address have a request in progress; more are answered 503 and closed at
// accept. Idle connections (and those still sending their headers) give
// their place to a newcomer, so they cannot shut clients out.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	nofile := connlimit.NoFile()
	capN, _ := connlimit.Caps(nofile, p.cfg.MaxConnections)
	if capN < p.cfg.MaxConnections {
		p.log.Warn("proxy connections capped below [proxy] max_connections by the file-descriptor limit; raise LimitNOFILE to allow more",
			zap.Int("max_connections", p.cfg.MaxConnections), zap.Int("cap", capN), zap.Uint64("nofile", nofile),
			zap.Int("reserved_for_supervision", connlimit.Reserve))
	}
	cl := connlimit.NewPerSource(l, capN, p.cfg.MaxConnectionsPerClient)
	l = cl
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       clientIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          newStdLog(p.log, zap.WarnLevel),
		ConnState:         cl.ConnState,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	p.log.Info("proxy listening", zap.String("addr", l.Addr().String()), zap.Int("limit", p.Stats().Limit), zap.Int("max_connections", capN),
		zap.Int("max_connections_per_client", cl.PerSource()),
		zap.Int("queue_size", p.cfg.QueueSize), zap.Duration("queue_timeout", p.cfg.QueueTimeout.Duration))
	select {
	case err := <-errc:
		p.lim.close()
		p.tr.CloseIdleConnections()
		return fmt.Errorf("proxy on %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	p.lim.close()
	sctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		p.log.Warn("proxy drain timed out; closing the remaining connections", zap.Duration("timeout", drainTimeout))
		srv.Close()
	}
	<-errc
	p.tr.CloseIdleConnections()
	return nil
}

type ctxKey struct{}

// reqState travels with a request through the ReverseProxy.
type reqState struct {
	deadline time.Time // the queue bound: also for waiting out a refused connection
	body     *trackBody
	tokens   float64 // the prompt's estimated tokens (Awaiting)
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
	defer func() {
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
	}()

	if limit := p.cfg.MaxBodyBytes; limit > 0 && r.ContentLength > limit {
		p.tooLarge(rec, r.ContentLength)
		return
	}
	normalize(r)
	if !IsInference(r) {
		// Probes, scrapes and listings pass straight through: a load
		// balancer's health check or Prometheus must never wait behind
		// generation requests, be refused for load, or take their slots.
		// A body with no length is still bounded (upstreamError: 413).
		if r.Body != nil && r.Body != http.NoBody && p.cfg.MaxBodyBytes > 0 {
			r.Body = http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes)
		}
		p.rp.ServeHTTP(rec, r)
		return
	}
	deadline := start.Add(p.cfg.QueueTimeout.Duration)
	// The body is read before admission, unless the client waits for
	// 100 Continue: it is told to send once admitted, and until its body
	// is read its prompt is guessed from its length (a quarter of its
	// bytes, at most the room: base64 images would make it far too much).
	expect := expectsContinue(r)
	var body *bufferedBody
	var tokens float64
	if expect {
		tokens = float64(r.ContentLength) / 4
	} else {
		sc := newPromptScanner()
		var ok bool
		if body, ok = p.readBody(rec, r, sc, fixedDeadline(start.Add(bodyReadTimeout))); !ok {
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
	queued, err := p.lim.acquire(r.Context(), deadline, cost, tokens)
	if err != nil {
		if rj, ok := isRejection(err); ok {
			p.reject(rec, rj)
		}
		return // else the client left while waiting: nobody to answer
	}
	defer func() { p.lim.release(cost, tokens) }()
	// A deadline left by an earlier request on this kept-alive connection
	// may have passed: renew it before anything (a 100 Continue) is written.
	rec.renew()
	if queued {
		rec.Header().Set(QueueWaitHeader, strconv.FormatFloat(float64(time.Since(start).Microseconds())/1000, 'f', 1, 64))
	}
	if expect {
		// Reading sends the 100 Continue; a slot is held now, so the body
		// must come at a minimum rate. Then the guess gives way to the
		// count.
		sc := newPromptScanner()
		var ok bool
		if body, ok = p.readBody(rec, r, sc, minRateDeadline(time.Now())); !ok {
			return
		}
		defer body.release()
		counted, newCost := sc.tokens(body.size), 0.0
		if bound != nil && bound.RoomBytes > 0 {
			if newCost = bound.Model.RequestBytes(counted); newCost > bound.RoomBytes {
				p.tooLargeForMemory(rec, counted, newCost, bound)
				return
			}
		}
		p.lim.adjust(cost, tokens, newCost, counted)
		cost, tokens = newCost, counted
	}

	// The body is here: vLLM has nothing to wait for (and its 100
	// Continue would reach the client a second time).
	r.Header.Del("Expect")
	st := &reqState{deadline: deadline, tokens: tokens}
	if body.size > 0 {
		st.body = newTrackBody(body)
		r.Body, r.ContentLength = st.body, body.size
	} else {
		r.Body, r.ContentLength = http.NoBody, 0
	}
	p.rp.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), ctxKey{}, st)))
}

func (p *Proxy) tooLargeForMemory(w http.ResponseWriter, tokens, cost float64, b *policy.AdmissionBound) {
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

func (p *Proxy) reject(w http.ResponseWriter, rj *rejection) {
	p.m.rejected.WithLabelValues(rj.reason).Inc()
	switch {
	case rj.shutdown:
		w.Header().Set("Retry-After", retryAfterNotReady)
		writeError(w, http.StatusServiceUnavailable, "server_error", "vllm-guard is shutting down; retry shortly")
	case rj.reason == reasonNotReady:
		w.Header().Set("Retry-After", retryAfterNotReady)
		writeError(w, http.StatusServiceUnavailable, "server_error",
			fmt.Sprintf("vLLM is not ready (restarting or loading) and did not come back within %s; retry shortly", p.cfg.QueueTimeout.Duration))
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

// rewrite points the outgoing request at vLLM.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	if u, err := p.targetURL(); err == nil {
		pr.SetURL(u)
	}
	pr.SetXForwarded()
}

var errNoTarget = errors.New("vLLM's address is not known yet")

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
			t.p.retries.Add(1)
			t.p.log.Debug("vLLM answered nothing while draining for a restart; holding the request until it is back")
			if err := t.waitReady(req.Context(), st.deadline); err != nil {
				return nil, err
			}
			u, err := t.p.targetURL()
			if err != nil {
				return nil, err
			}
			req = req.Clone(req.Context())
			req.URL.Scheme, req.URL.Host = u.Scheme, u.Host
			req.Body = body
			continue
		}
		if err == nil || st == nil || !isDialError(err) || (st.body != nil && st.body.touched()) {
			return resp, err
		}
		t.p.retries.Add(1)
		t.p.log.Debug("vLLM refused a connection; waiting for it", zap.Error(err))
		if err := t.waitReady(req.Context(), st.deadline); err != nil {
			return nil, err
		}
		u, err := t.p.targetURL()
		if err != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.URL.Scheme, req.URL.Host = u.Scheme, u.Host
		if st.body != nil {
			// The transport closed the ReverseProxy's wrapper of the
			// body; the body itself was not read.
			req.Body = st.body
		}
	}
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
	}
	return nil
}

// recorder remembers the status code and bounds every write to the client:
// before each write or flush the connection's write deadline is set
// writeTimeout ahead, so a client that reads nothing for that long makes
// the write fail. The ReverseProxy then aborts the request, which cancels
// it at vLLM and frees its slot (issue 15: two clients that never read
// held both slots of a limit of 2 for as long as they liked). A client that
// reads, however slowly, renews the deadline with each write that gets
// through. Flush, FlushError and Unwrap keep streaming and
// http.ResponseController working through it.
type recorder struct {
	http.ResponseWriter
	rc           *http.ResponseController // of the server's ResponseWriter
	writeTimeout time.Duration
	code         int
	stalled      bool // a write failed on the deadline
}

func (r *recorder) renew() {
	if r.writeTimeout > 0 {
		_ = r.rc.SetWriteDeadline(time.Now().Add(r.writeTimeout))
	}
}

func (r *recorder) noteErr(err error) {
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		r.stalled = true
	}
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 && code >= 200 {
		r.code = code
	}
	r.renew()
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	r.renew()
	n, err := r.ResponseWriter.Write(b)
	r.noteErr(err)
	return n, err
}

func (r *recorder) Flush() { _ = r.FlushError() }

func (r *recorder) FlushError() error {
	r.renew()
	err := r.rc.Flush()
	r.noteErr(err)
	return err
}

// Hijack (a protocol upgrade) hands the connection over without the
// write deadline: the upgraded stream is no longer an HTTP answer.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	_ = r.rc.SetWriteDeadline(time.Time{})
	return r.rc.Hijack()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// bufferPool lends the ReverseProxy its copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *(buffers.Get().(*[]byte)) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
