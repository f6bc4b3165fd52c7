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
// Admitter says the bound in force (internal/admission's Policy decides it).
package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/admission"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/connlimit"
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
	Admission() admission.Bound
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
	RejectedBy map[string]uint64 `json:"rejected_by_reason"` // queue_full, queue_timeout, not_ready, body_too_large, too_large_for_memory, buffer_full, operator_route
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
	// Held: requests waiting for vLLM to be ready again (arrived while it
	// was away, or resumed after a death or a drain); Paused: streams among
	// them whose client has part of its answer.
	Held   int `json:"held"`
	Paused int `json:"paused_streams"`
	// Resumed: requests sent again after a death or drain (replayed) or
	// continued; Suspects: requests refused another send after
	// resume_limit deaths, the last of them LastSuspect.
	Resumed     uint64   `json:"resumed"`
	Suspects    uint64   `json:"suspects"`
	LastSuspect *Suspect `json:"last_suspect,omitempty"`
}

// QueueWaitHeader is set on responses to requests that waited in the
// queue: the wait in milliseconds. The drill counts queueing with it.
const QueueWaitHeader = "X-Vllm-Guard-Queue-Wait-Ms"

// Bounds of the proxy's connections. Generation can take minutes before
// the first byte of a non-streaming answer, so nothing bounds a response
// in flight: vLLM's liveness is the supervisor's job.
const (
	readHeaderTimeout = 5 * time.Second  // a client's request headers
	bodyReadTimeout   = 60 * time.Second // a client's request body, at most
	// An inference request's body must come at bodyMinRate once
	// bodyGrace has passed (bodyDeadline): a body trickled a byte at a
	// time ends in about bodyGrace, not bodyReadTimeout (issue 41).
	bodyGrace   = 10 * time.Second
	bodyMinRate = 64 << 10 // bytes a second
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
	bound   atomic.Pointer[admission.Bound] // the last applied
	await   awaiting                        // sent to vLLM, no byte of the answer yet
	trusted []netip.Prefix                  // [proxy] trusted_proxies
	// stopping: the guard is stopping for good (Stopping); every new
	// request is refused at once.
	stopping atomic.Bool
	// Resumed requests, suspects (hold.go) and who hears of them.
	resumed     atomic.Uint64
	suspects    atomic.Uint64
	lastSuspect atomic.Pointer[Suspect]
	onSuspect   atomic.Pointer[func(Suspect)]
	onContinued atomic.Pointer[func(time.Time)] // SetOnContinued
	deaths      deathBook                       // what became of the requests each death touched
	tickEvery   time.Duration                   // a held stream's comment (holdUntilReady)
	noticeWait  time.Duration                   // for the guard to see a death (awaitNotice)
	refreshMu   sync.Mutex                      // serialises refresh
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
	if cfg.MaxConnectionsPerClient < 0 {
		cfg.MaxConnectionsPerClient = 0 // a quarter of the cap (perClient)
	}
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = max(config.Default().Proxy.MaxBufferedBytes, cfg.MaxBodyBytes)
	}
	p := &Proxy{cfg: cfg, up: up, log: log.Named("proxy"), lim: newLimiter(max(cfg.QueueSize, 0)),
		budget: newBodyBudget(cfg.MaxBufferedBytes, perClientBuffered(cfg)), tickEvery: defaultTickEvery,
		noticeWait: defaultNoticeWait}
	trusted, err := config.TrustedPrefixes(cfg.TrustedProxies)
	if err != nil {
		// config.Load refuses such a file; a caller that skipped it
		// trusts nobody rather than a guess.
		p.log.Error("[proxy] trusted_proxies not applied: no client's X-Forwarded-For is passed on", zap.Error(err))
	}
	p.trusted = trusted
	p.tr = &http.Transport{
		Proxy:                 nil, // never an environment proxy between the guard and its vLLM
		DialContext:           upstreamDialer().DialContext,
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
		ErrorHandler:   p.proxyError,
		ModifyResponse: p.modifyResponse,
		// Its messages are per request (a client gone mid-copy): debug.
		ErrorLog: newStdLog(p.log, zap.DebugLevel),
	}
	p.m = newMetrics(reg, p.lim, p.budget)
	p.refresh()
	return p
}

// upstreamDialer is the dialer of the proxy's connections to vLLM.
func upstreamDialer() *net.Dialer {
	return &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
}

// DialThrough makes every new connection of the proxy to vLLM with
// through(its dialer): the guard's check that the listener is the running
// vLLM's own (supervisor.DialVLLM), so that no client's key or prompt
// reaches another process on vLLM's port. Connections are kept alive and
// reused: the check is paid per new connection only. A dial it refuses is
// a refused connection to the proxy: nothing was sent, and an inference
// request waits for vLLM as for any refusal. Call it before Serve.
func (p *Proxy) DialThrough(through func(*net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error)) {
	dial := through(upstreamDialer())
	p.tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil && !isDialError(err) {
			err = &net.OpError{Op: "dial", Net: network, Err: err}
		}
		return c, err
	}
}

// perClientBuffered is one client address's share of the body budget:
// [proxy] max_buffered_bytes_per_client, or when 0 a quarter of
// max_buffered_bytes, and never less than one largest body.
func perClientBuffered(cfg config.Proxy) int64 {
	if cfg.MaxBufferedBytesPerClient > 0 {
		return cfg.MaxBufferedBytesPerClient
	}
	return max(cfg.MaxBufferedBytes/4, cfg.MaxBodyBytes)
}

// Stopping tells the proxy the guard is stopping for good (SIGTERM): this
// instance will serve nothing new, so a request that arrives now, or waits
// in the queue, is answered 503 at once with Connection: close, to be sent
// to another instance, instead of being held until the stop ends (issue
// 32: 5 s and more). Requests in flight go on; the guard waits for them
// before vLLM gets its SIGTERM. Serve calls it when its context ends.
func (p *Proxy) Stopping() {
	// The deaths' accounts go to their records now, the requests still
	// going as pending: the records close as the guard stops.
	p.flushDeaths()
	p.stopping.Store(true)
	p.lim.close()
}

// Notify tells the proxy that readiness, the rung or the alerts changed:
// it recomputes the limit and wakes waiters. Call it on every change.
func (p *Proxy) Notify() { p.refresh() }

// Stats returns the admission state now.
func (p *Proxy) Stats() Stats {
	s := p.lim.stats()
	s.UpstreamRetries = p.retries.Load()
	s.Resumed, s.Suspects, s.LastSuspect = p.resumed.Load(), p.suspects.Load(), p.lastSuspect.Load()
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
	// One at a time: a refresh that read the Upstream before a change
	// must not apply its view after the one that read it after (Notify),
	// or a held request would wait for a readiness the limiter missed.
	p.refreshMu.Lock()
	defer p.refreshMu.Unlock()
	_, ready := p.up.Target()
	var b admission.Bound
	if a, ok := p.up.(Admitter); ok {
		b = a.Admission()
	} else {
		b = admission.Bound{Limit: limitFor(p.up.MaxNumSeqs(), p.cfg.InflightFactor, p.up.Pressure()), Bound: admission.BoundRung,
			Why: "max_num_seqs × inflight_factor"}
		if p.up.Pressure() {
			b.Bound, b.Why = admission.BoundPressure, "halved while gpu_memory_critical or oom_predicted is active"
		}
	}
	if old := p.bound.Load(); old == nil || old.Bound != b.Bound || old.Limit != b.Limit || old.RoomBytes != b.RoomBytes {
		// The guard says a change of bound on its event stream.
		p.bound.Store(&b)
		p.m.setBound(b.Bound)
	}
	o := outlook{resume: p.cfg.Resume}
	if !ready && p.cfg.Resume {
		o.comingBack, _, o.holdLimit, _ = p.outlook()
	}
	if p.lim.set(b.Limit, b.RoomBytes, ready, o) {
		// vLLM went away: its pooled connections are dead or about to be.
		p.tr.CloseIdleConnections()
	}
	if ready {
		// A death's account may be complete now that vLLM is back.
		p.settleDeaths()
	}
}

// Serve answers on l until ctx is done, then stops accepting, refuses the
// queued requests (503) and lets those in flight finish (up to 30 s). At
// most [proxy] max_connections client connections are open at once, fewer
// if the descriptor limit leaves less after the supervision reserve
// (connlimit.Caps), and at most max_connections_per_client of one client
// address (by default a quarter of them) have a request in progress; more
// are answered 503 and closed at accept. Idle connections, those still
// sending their headers and those whose request is still receiving its
// body give their place to a newcomer, so they cannot shut clients out
// (issue 41: two addresses trickling 512 bodies each did). A peer in
// trusted_proxies is held to no share itself: the clients it forwards are,
// each by the address it names (frontDoor).
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	nofile := connlimit.NoFile()
	capN, _ := connlimit.Caps(nofile, p.cfg.MaxConnections)
	if capN < p.cfg.MaxConnections {
		p.log.Warn("proxy connections capped below [proxy] max_connections by the file-descriptor limit; raise LimitNOFILE to allow more",
			zap.Int("max_connections", p.cfg.MaxConnections), zap.Int("cap", capN), zap.Uint64("nofile", nofile),
			zap.Int("reserved_for_supervision", connlimit.Reserve))
	}
	per := perClient(p.cfg.MaxConnectionsPerClient, capN)
	cl := connlimit.NewPerSource(l, capN, per)
	cl.Exempt(p.trusted)
	l = cl
	srv := &http.Server{
		Handler:           p.frontDoor(p, newClientShare(per)),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       clientIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          newStdLog(p.log, zap.WarnLevel),
		ConnState:         cl.ConnState,
		ConnContext:       connlimit.ConnContext,
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
	p.Stopping()
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

// perClient is the share of one client address: [proxy]
// max_connections_per_client, or when 0 a quarter of the connection cap
// (256 of 1024), at least 4: a few addresses cannot fill it with requests
// in progress (and none with connections that ask nothing or send slowly:
// those give way). A single host running a benchmark at 200 requests at
// once stays within it.
func perClient(configured, capN int) int {
	if configured > 0 {
		return configured
	}
	return max(capN/4, 4)
}

// frontDoor is what every request meets before next (the proxy itself).
// A request with a body is receiving it, not working, until the body is
// read: its connection gives its place to a newcomer meanwhile
// (connlimit.Reading). A request from a peer in trusted_proxies counts
// against the share of the client that peer forwards (forwardedClient):
// over it, 429 at once.
func (p *Proxy) frontDoor(next http.Handler, share *clientShare) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			connlimit.Reading(r.Context())
			orig := r.Body
			b := &readingBody{ReadCloser: orig, ctx: r.Context(), left: r.ContentLength}
			r.Body = b
			defer func() {
				// The server looks at the request's own body once the
				// handler is done (to know whether the connection can
				// carry another request): it gets it back.
				r.Body = orig
				if !b.eof.Load() {
					// Answered with the body unread (408 for one too
					// slow, 413, a refusal): the server would go on
					// reading the rest, with no deadline, before it let
					// the connection go (a body stalled after a 408 held
					// its connection for as long as the client liked).
					_ = http.NewResponseController(w).SetReadDeadline(time.Now())
				}
			}()
		}
		if p.trustedPeer(r.RemoteAddr) {
			client := p.forwardedClient(r)
			if !share.take(client) {
				p.overShare(w, r, share.max)
				return
			}
			defer share.give(client)
		}
		next.ServeHTTP(w, r)
	})
}

// overShare answers a request whose forwarded client has its share of
// requests in progress already: at once, its body unread.
func (p *Proxy) overShare(w http.ResponseWriter, r *http.Request, share int) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close") // the body is not read
	}
	w.Header().Set("Retry-After", retryAfterBusy)
	writeError(w, http.StatusTooManyRequests, "rate_limit_error",
		fmt.Sprintf("this client has %d requests in progress already, its share ([proxy] max_connections_per_client); retry shortly", share))
}

// readingBody tells the listener the request is working once its body is
// read to its end.
// read to its end (its Content-Length, or io.EOF when it has none).
type readingBody struct {
	io.ReadCloser
	ctx  context.Context
	left int64       // bytes still to come; < 0: not known
	eof  atomic.Bool // read to its end
}

func (b *readingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.left > 0 {
		b.left -= int64(n)
	}
	if (err == io.EOF || b.left == 0) && !b.eof.Swap(true) {
		connlimit.Working(b.ctx)
	}
	return n, err
}

// forwardedClient is the client a request from a trusted peer stands for:
// the rightmost address of its X-Forwarded-For that is not itself in
// trusted_proxies (the one the outermost trusted balancer saw); the peer
// itself when there is none or it cannot be read. An IPv6 /64 counts as
// one client, as at accept.
func (p *Proxy) forwardedClient(r *http.Request) netip.Prefix {
	peer := clientOf(r.RemoteAddr)
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		h := strings.TrimSpace(hops[i])
		a, err := netip.ParseAddr(h)
		if err != nil {
			ap, perr := netip.ParseAddrPort(h)
			if perr != nil {
				return peer
			}
			a = ap.Addr()
		}
		a = a.Unmap()
		if p.trustedAddr(a) {
			continue
		}
		bits := 32
		if a.Is6() {
			bits = 64
		}
		pfx, _ := a.Prefix(bits)
		return pfx
	}
	return peer
}

// bodyDeadline is when an inference request's body, begun at start, must
// have arrived, given how much of it has: bodyGrace plus a bodyMinRate
// for what came, and never past bodyReadTimeout.
func bodyDeadline(start time.Time) func(read int64) time.Time {
	return func(read int64) time.Time {
		d := bodyGrace + time.Duration(float64(read)/bodyMinRate*float64(time.Second))
		return start.Add(min(d, bodyReadTimeout))
	}
}

// trustedAddr reports whether a is in [proxy] trusted_proxies.
func (p *Proxy) trustedAddr(a netip.Addr) bool {
	for _, t := range p.trusted {
		if t.Contains(a) {
			return true
		}
	}
	return false
}
