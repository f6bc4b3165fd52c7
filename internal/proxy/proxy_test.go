package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"go.uber.org/zap"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// fakeUp is the supervisor's side, set by the tests.
type fakeUp struct {
	mu       sync.Mutex
	url      string
	ready    bool
	seqs     int
	pressure bool
}

func (f *fakeUp) Target() (string, bool) { f.mu.Lock(); defer f.mu.Unlock(); return f.url, f.ready }
func (f *fakeUp) MaxNumSeqs() int        { f.mu.Lock(); defer f.mu.Unlock(); return f.seqs }
func (f *fakeUp) Pressure() bool         { f.mu.Lock(); defer f.mu.Unlock(); return f.pressure }
func (f *fakeUp) set(fn func(*fakeUp))   { f.mu.Lock(); fn(f); f.mu.Unlock() }

// rig is a proxy between a test client and an httptest upstream.
type rig struct {
	t        *testing.T
	up       *fakeUp
	upstream *httptest.Server
	p        *Proxy
	front    *httptest.Server
	client   *http.Client
	reg      *prometheus.Registry
}

func proxyConfig() config.Proxy {
	c := config.Default().Proxy
	c.QueueTimeout = config.Duration{Duration: 10 * time.Second}
	return c
}

func newRig(t *testing.T, cfg config.Proxy, seqs int, h http.HandlerFunc) *rig {
	t.Helper()
	r := &rig{t: t, reg: prometheus.NewRegistry()}
	r.upstream = httptest.NewServer(h)
	r.up = &fakeUp{url: r.upstream.URL, ready: true, seqs: seqs}
	r.p = New(cfg, r.up, r.reg, testLog)
	r.front = httptest.NewServer(r.p)
	r.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000}}
	t.Cleanup(r.close)
	return r
}

func (r *rig) close() {
	r.front.Close()
	r.upstream.Close()
	r.p.tr.CloseIdleConnections()
	r.client.CloseIdleConnections()
}

type result struct {
	code int
	hdr  http.Header
	body string
	err  error
}

func (r *rig) get(ctx context.Context, path string) result {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+path, nil)
	resp, err := r.client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, hdr: resp.Header, body: string(b), err: err}
}

func (r *rig) goGet(path string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- r.get(context.Background(), path) }()
	return ch
}

// gate is an upstream handler that holds each request until released,
// and records the order of arrival.
type gate struct {
	mu      sync.Mutex
	arrived []string
	release chan struct{}
}

func newGate() *gate { return &gate{release: make(chan struct{}, 1000)} }

func (g *gate) handler(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.arrived = append(g.arrived, r.URL.Path)
	g.mu.Unlock()
	select {
	case <-g.release:
	case <-r.Context().Done():
		return
	}
	io.WriteString(w, "ok "+r.URL.Path)
}

func (g *gate) n() int { g.mu.Lock(); defer g.mu.Unlock(); return len(g.arrived) }
func (g *gate) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.arrived...)
}

func mustOK(t *testing.T, res result) {
	t.Helper()
	if res.err != nil || res.code != http.StatusOK {
		t.Fatalf("want 200, got %d %q (err %v)", res.code, res.body, res.err)
	}
}

func TestLimitHoldsRequestsInFlight(t *testing.T) {
	g := newGate()
	r := newRig(t, proxyConfig(), 2, g.handler)
	var done []<-chan result
	for i := range 3 {
		done = append(done, r.goGet(fmt.Sprintf("/v1/r%d", i)))
	}
	testkit.WaitFor(t, "2 upstream, 1 queued", 30*time.Second, func() bool { return g.n() == 2 && r.p.Stats().Queued == 1 })
	if s := r.p.Stats(); s.Inflight != 2 || s.Limit != 2 || !s.Engaged {
		t.Fatalf("stats %+v: want 2 in flight, limit 2, engaged", s)
	}
	g.release <- struct{}{}
	testkit.WaitFor(t, "the queued request forwarded", 30*time.Second, func() bool { return g.n() == 3 })
	g.release <- struct{}{}
	g.release <- struct{}{}
	queuedSeen := 0
	for _, ch := range done {
		res := <-ch
		mustOK(t, res)
		if res.hdr.Get(QueueWaitHeader) != "" {
			queuedSeen++
		}
	}
	if queuedSeen != 1 {
		t.Fatalf("%d responses carry %s, want 1 (the queued one)", queuedSeen, QueueWaitHeader)
	}
	testkit.WaitFor(t, "slots free", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
}

func TestQueueIsFIFO(t *testing.T) {
	g := newGate()
	r := newRig(t, proxyConfig(), 1, g.handler)
	first := r.goGet("/v1/first")
	testkit.WaitFor(t, "first upstream", 30*time.Second, func() bool { return g.n() == 1 })
	var rest []<-chan result
	for i := range 5 {
		rest = append(rest, r.goGet(fmt.Sprintf("/v1/q%d", i)))
		testkit.WaitFor(t, "queued in order", 30*time.Second, func() bool { return r.p.Stats().Queued == i+1 })
	}
	for range 6 {
		g.release <- struct{}{}
	}
	mustOK(t, <-first)
	for _, ch := range rest {
		mustOK(t, <-ch)
	}
	want := []string{"/v1/first", "/v1/q0", "/v1/q1", "/v1/q2", "/v1/q3", "/v1/q4"}
	if got := g.order(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("upstream order %v, want %v", got, want)
	}
}

func TestQueueFullIs429WithRetryAfter(t *testing.T) {
	g := newGate()
	cfg := proxyConfig()
	cfg.QueueSize = 1
	r := newRig(t, cfg, 1, g.handler)
	a := r.goGet("/v1/a")
	testkit.WaitFor(t, "a upstream", 30*time.Second, func() bool { return g.n() == 1 })
	b := r.goGet("/v1/b")
	testkit.WaitFor(t, "b queued", 30*time.Second, func() bool { return r.p.Stats().Queued == 1 })
	res := r.get(context.Background(), "/v1/c")
	if res.code != http.StatusTooManyRequests || res.hdr.Get("Retry-After") == "" {
		t.Fatalf("queue full: got %d, Retry-After %q; want 429 with Retry-After", res.code, res.hdr.Get("Retry-After"))
	}
	var e apiError
	if err := json.Unmarshal([]byte(res.body), &e); err != nil || e.Error.Code != 429 || !strings.Contains(e.Error.Message, "queue is full") {
		t.Fatalf("429 body %q: want an OpenAI error naming the full queue (%v)", res.body, err)
	}
	g.release <- struct{}{}
	g.release <- struct{}{}
	mustOK(t, <-a)
	mustOK(t, <-b)
	if got := metricValue(t, r.reg, "vllm_guard_proxy_rejected_total", "reason", reasonQueueFull); got != 1 {
		t.Fatalf("rejected{queue_full} = %v, want 1", got)
	}
	if got := metricValue(t, r.reg, "vllm_guard_proxy_requests_total", "code", "429"); got != 1 {
		t.Fatalf("requests{code=429} = %v, want 1", got)
	}
}

func TestQueueTimeoutIs429(t *testing.T) {
	g := newGate()
	cfg := proxyConfig()
	cfg.QueueTimeout = config.Duration{Duration: 100 * time.Millisecond}
	r := newRig(t, cfg, 1, g.handler)
	a := r.goGet("/v1/a")
	testkit.WaitFor(t, "a upstream", 30*time.Second, func() bool { return g.n() == 1 })
	start := time.Now()
	res := r.get(context.Background(), "/v1/b")
	if res.code != http.StatusTooManyRequests || res.hdr.Get("Retry-After") == "" {
		t.Fatalf("queue timeout: got %d %q; want 429 with Retry-After", res.code, res.body)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("answered after %s, before the 100ms queue timeout", waited)
	}
	g.release <- struct{}{}
	mustOK(t, <-a)
	if s := r.p.Stats(); s.RejectedBy[reasonQueueTimeout] != 1 || s.Queued != 0 || !s.Engaged {
		t.Fatalf("stats %+v: want one queue_timeout, empty queue, engaged", s)
	}
}

func TestNotReadyWaitsThen503(t *testing.T) {
	g := newGate()
	cfg := proxyConfig()
	cfg.Resume = false // the proxy before issue 30: queue_timeout bounds the wait (hold_test.go: the hold)
	cfg.QueueTimeout = config.Duration{Duration: 150 * time.Millisecond}
	r := newRig(t, cfg, 4, g.handler)
	r.up.set(func(f *fakeUp) { f.ready = false })
	r.p.Notify()
	start := time.Now()
	res := r.get(context.Background(), "/v1/completions")
	if res.code != http.StatusServiceUnavailable || res.hdr.Get("Retry-After") == "" {
		t.Fatalf("not ready: got %d %q; want 503 with Retry-After", res.code, res.body)
	}
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Fatalf("503 after %s: the request did not wait out the queue timeout", waited)
	}
	if g.n() != 0 {
		t.Fatal("a request reached vLLM while it was not ready")
	}
	if s := r.p.Stats(); s.RejectedBy[reasonNotReady] != 1 || s.Engaged {
		t.Fatalf("stats %+v: want one not_ready rejection and admission not engaged", s)
	}
}

func TestNotReadyThenReadyInTime(t *testing.T) {
	g := newGate()
	g.release <- struct{}{}
	r := newRig(t, proxyConfig(), 4, g.handler)
	r.up.set(func(f *fakeUp) { f.ready = false })
	r.p.Notify()
	res := r.goGet("/v1/completions")
	testkit.WaitFor(t, "the request waits", 30*time.Second, func() bool { return r.p.Stats().Queued == 1 })
	if g.n() != 0 {
		t.Fatal("forwarded while not ready")
	}
	r.up.set(func(f *fakeUp) { f.ready = true })
	r.p.Notify()
	mustOK(t, <-res)
}

func TestPressureHalvesTheLimit(t *testing.T) {
	g := newGate()
	r := newRig(t, proxyConfig(), 4, g.handler)
	r.up.set(func(f *fakeUp) { f.pressure = true })
	r.p.Notify()
	if l := r.p.Stats().Limit; l != 2 {
		t.Fatalf("limit under pressure %d, want 2 (4 halved)", l)
	}
	var done []<-chan result
	for i := range 4 {
		done = append(done, r.goGet(fmt.Sprintf("/v1/%d", i)))
	}
	testkit.WaitFor(t, "2 upstream, 2 queued", 30*time.Second, func() bool { return g.n() == 2 && r.p.Stats().Queued == 2 })
	r.up.set(func(f *fakeUp) { f.pressure = false })
	r.p.Notify()
	testkit.WaitFor(t, "all 4 upstream once the alert cleared", 30*time.Second, func() bool { return g.n() == 4 })
	for range 4 {
		g.release <- struct{}{}
	}
	for _, ch := range done {
		mustOK(t, <-ch)
	}
}

func TestLimitFollowsTheRung(t *testing.T) {
	g := newGate()
	cfg := proxyConfig()
	cfg.InflightFactor = 1.5
	r := newRig(t, cfg, 2, g.handler)
	if l := r.p.Stats().Limit; l != 3 {
		t.Fatalf("limit %d, want 3 (2 × 1.5)", l)
	}
	var done []<-chan result
	for i := range 6 {
		done = append(done, r.goGet(fmt.Sprintf("/v1/%d", i)))
	}
	testkit.WaitFor(t, "3 upstream", 30*time.Second, func() bool { return g.n() == 3 && r.p.Stats().Queued == 3 })
	r.up.set(func(f *fakeUp) { f.seqs = 4 })
	r.p.Notify()
	testkit.WaitFor(t, "6 upstream after the rung went up", 30*time.Second, func() bool { return g.n() == 6 })
	if l := r.p.Stats().Limit; l != 6 {
		t.Fatalf("limit %d, want 6", l)
	}
	// Down a rung: the new limit holds for the next requests.
	r.up.set(func(f *fakeUp) { f.seqs = 1 })
	r.p.Notify()
	for range 6 {
		g.release <- struct{}{}
	}
	for _, ch := range done {
		mustOK(t, <-ch)
	}
	a, b := r.goGet("/v1/a"), r.goGet("/v1/b")
	testkit.WaitFor(t, "one upstream, one queued under limit 1", 30*time.Second, func() bool { return g.n() == 7 && r.p.Stats().Queued == 1 })
	g.release <- struct{}{}
	g.release <- struct{}{}
	mustOK(t, <-a)
	mustOK(t, <-b)
	if got := metricValue(t, r.reg, "vllm_guard_proxy_limit", "", ""); got != 1 {
		t.Fatalf("proxy_limit %v, want 1", got)
	}
}

// metricValue reads one series of a counter or gauge from a scrape of
// reg; label "" means the series without labels. A missing series is 0.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	n, v := scrape(t, reg, name, label, value)
	if n < 0 {
		t.Fatalf("metric %s not registered", name)
	}
	return v
}

// scrape returns how many series name has (-1: not registered) and the
// value of the one with label=value.
func scrape(t *testing.T, reg *prometheus.Registry, name, label, value string) (series int, v float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			match := label == "" && len(m.Label) == 0
			for _, lp := range m.Label {
				match = match || (lp.GetName() == label && lp.GetValue() == value)
			}
			if match {
				v = m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			}
		}
		return len(mf.Metric), v
	}
	return -1, 0
}

func TestClientDisconnectFreesSlotAndCancelsUpstream(t *testing.T) {
	cancelled := make(chan struct{}, 1)
	arrived := make(chan struct{}, 1)
	r := newRig(t, proxyConfig(), 1, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/quick" {
			io.WriteString(w, "quick")
			return
		}
		arrived <- struct{}{}
		<-req.Context().Done()
		cancelled <- struct{}{}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() { done <- r.get(ctx, "/v1/slow") }()
	<-arrived
	cancel()
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream request was not cancelled when the client left")
	}
	if res := <-done; res.err == nil {
		t.Fatalf("client request succeeded after cancel: %d", res.code)
	}
	testkit.WaitFor(t, "the slot freed", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
	mustOK(t, r.get(context.Background(), "/v1/quick"))
	testkit.WaitFor(t, "499 counted", 30*time.Second, func() bool { return metricValue(t, r.reg, "vllm_guard_proxy_requests_total", "code", "499") == 1 })
}

func TestClientLeavesWhileQueued(t *testing.T) {
	g := newGate()
	r := newRig(t, proxyConfig(), 1, g.handler)
	a := r.goGet("/v1/a")
	testkit.WaitFor(t, "a upstream", 30*time.Second, func() bool { return g.n() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() { done <- r.get(ctx, "/v1/b") }()
	testkit.WaitFor(t, "b queued", 30*time.Second, func() bool { return r.p.Stats().Queued == 1 })
	cancel()
	<-done
	testkit.WaitFor(t, "queue empty", 30*time.Second, func() bool { return r.p.Stats().Queued == 0 })
	g.release <- struct{}{}
	mustOK(t, <-a)
	if g.n() != 1 {
		t.Fatal("a request whose client left was forwarded")
	}
	testkit.WaitFor(t, "no slot held", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
}

// sseClient reads a stream event by event.
type sseClient struct {
	resp *http.Response
	rd   *bufio.Reader
}

func (r *rig) stream(t *testing.T, path string) *sseClient {
	t.Helper()
	resp, err := r.client.Post(r.front.URL+path, "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("stream: HTTP %d", resp.StatusCode)
	}
	return &sseClient{resp: resp, rd: bufio.NewReader(resp.Body)}
}

// next returns the next event's data, or the read error.
func (c *sseClient) next() (string, error) {
	var data []string
	for {
		line, err := c.rd.ReadString('\n')
		if err != nil {
			return strings.Join(data, "\n"), err
		}
		line = strings.TrimRight(line, "\n")
		if line == "" {
			if data != nil {
				return strings.Join(data, "\n"), nil
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, v)
		}
	}
}

func TestSSEPassesEventsOneByOne(t *testing.T) {
	const events = 5
	got := make(chan int, events)
	r := newRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			// The next event waits until the client has this one: a
			// proxy that buffers would deadlock here.
			select {
			case n := <-got:
				if n != i {
					panic(fmt.Sprintf("client saw %d, sent %d", n, i))
				}
			case <-time.After(30 * time.Second):
				io.WriteString(w, "data: buffered\n\n")
				return
			case <-req.Context().Done():
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	c := r.stream(t, "/v1/completions")
	for i := range events {
		ev, err := c.next()
		if err != nil || ev != fmt.Sprintf("{\"n\":%d}", i) {
			t.Fatalf("event %d: %q (err %v): the proxy held events back", i, ev, err)
		}
		got <- i
	}
	if ev, err := c.next(); ev != "[DONE]" || err != nil {
		t.Fatalf("last event %q (err %v), want [DONE]", ev, err)
	}
}

// dieAfter is an upstream that sends a prefix and then dies: its
// connection closes under the response.
func dieAfter(prefix string, sse bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if sse {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		}
		if prefix != "" || sse {
			io.WriteString(w, prefix)
			w.(http.Flusher).Flush()
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
	}
}

func TestStreamCutEndsWithErrorEvent(t *testing.T) {
	for name, prefix := range map[string]string{
		"between events": "data: {\"n\":0}\n\n",
		"mid event":      "data: {\"n\":0}\n\ndata: {\"n\"",
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, proxyConfig(), 4, dieAfter(prefix, true))
			c := r.stream(t, "/v1/chat/completions")
			if ev, err := c.next(); ev != `{"n":0}` || err != nil {
				t.Fatalf("first event %q (err %v)", ev, err)
			}
			ev, err := c.next()
			if name == "mid event" {
				if !strings.HasPrefix(ev, `{"n"`) {
					t.Fatalf("cut event %q: want the partial event closed on its own", ev)
				}
				ev, err = c.next()
			}
			if err != nil {
				t.Fatalf("reading the error event: %v (a bare reset instead of an event)", err)
			}
			var e apiError
			if json.Unmarshal([]byte(ev), &e) != nil || e.Error.Type != "server_error" || e.Error.Code != 503 || e.Error.Message == "" {
				t.Fatalf("error event %q: want OpenAI's error shape, server_error, 503", ev)
			}
			if rest, err := io.ReadAll(c.rd); err != nil || strings.TrimSpace(string(rest)) != "" {
				t.Fatalf("after the error event: %q, %v; want a clean end", rest, err)
			}
			testkit.WaitFor(t, "slot freed", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
		})
	}
}

func TestUpstreamDeathBeforeAnswerIs503JSON(t *testing.T) {
	r := newRig(t, proxyConfig(), 4, dieAfter("", false))
	res := r.get(context.Background(), "/v1/completions")
	if res.code != http.StatusServiceUnavailable || res.hdr.Get("Retry-After") == "" || !strings.Contains(res.hdr.Get("Content-Type"), "json") {
		t.Fatalf("got %d %v %q; want 503 JSON with Retry-After", res.code, res.hdr, res.body)
	}
	var e apiError
	if err := json.Unmarshal([]byte(res.body), &e); err != nil || e.Error.Code != 503 {
		t.Fatalf("body %q: %v", res.body, err)
	}
}

func TestBodyTooLargeIs413(t *testing.T) {
	upstreamSaw := make(chan int, 10)
	cfg := proxyConfig()
	cfg.MaxBodyBytes = 64
	r := newRig(t, cfg, 4, func(w http.ResponseWriter, req *http.Request) {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return // the proxy cut the body
		}
		upstreamSaw <- len(b)
		io.WriteString(w, "ok")
	})
	big := strings.Repeat("x", 100)
	// Known length: refused before any slot or upstream.
	resp, err := r.client.Post(r.front.URL+"/v1/completions", "application/json", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("Content-Length 100 over 64: got %d, want 413", resp.StatusCode)
	}
	// Chunked: cut while streaming to vLLM.
	resp, err = r.client.Post(r.front.URL+"/v1/completions", "application/json", io.MultiReader(strings.NewReader(big)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked body of 100 over 64: got %d, want 413", resp.StatusCode)
	}
	// Small bodies pass.
	resp, err = r.client.Post(r.front.URL+"/v1/completions", "application/json", strings.NewReader("small"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || <-upstreamSaw != 5 {
		t.Fatalf("small body: got %d", resp.StatusCode)
	}
	if got := r.p.Stats().RejectedBy[reasonBodyTooLarge]; got != 2 {
		t.Fatalf("body_too_large rejections %d, want 2", got)
	}
	testkit.WaitFor(t, "slots free", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
}

func TestRefusedConnectionWaitsForVLLM(t *testing.T) {
	// A port with nobody on it: vLLM died and the supervisor has not
	// noticed yet (still "ready").
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := newRig(t, proxyConfig(), 4, func(w http.ResponseWriter, _ *http.Request) {})
	r.up.set(func(f *fakeUp) { f.url = "http://" + addr })
	r.p.Notify()
	res := make(chan result, 1)
	go func() {
		resp, err := r.client.Post(r.front.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi"}`))
		if err != nil {
			res <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- result{code: resp.StatusCode, body: string(b)}
	}()
	testkit.WaitFor(t, "a refused connection retried", 30*time.Second, func() bool { return r.p.Stats().UpstreamRetries > 0 })
	// vLLM is back on the same port.
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("re-listen on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		w.Write(b)
	})}
	go srv.Serve(l2)
	defer srv.Close()
	got := <-res
	if got.code != 200 || got.body != `{"prompt":"hi"}` {
		t.Fatalf("after vLLM came back: %d %q (err %v); want 200 with the body echoed", got.code, got.body, got.err)
	}
}

func TestServeDrainsAndRefusesQueued(t *testing.T) {
	g := newGate()
	up := httptest.NewServer(http.HandlerFunc(g.handler))
	defer up.Close()
	fu := &fakeUp{url: up.URL, ready: true, seqs: 1}
	p := New(proxyConfig(), fu, nil, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, l) }()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(path string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			resp, err := client.Post("http://"+l.Addr().String()+path, "application/json", nil)
			if err != nil {
				ch <- result{err: err}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ch <- result{code: resp.StatusCode, body: string(b), hdr: resp.Header}
		}()
		return ch
	}
	a := get("/v1/a")
	testkit.WaitFor(t, "a upstream", 30*time.Second, func() bool { return g.n() == 1 })
	b := get("/v1/b")
	testkit.WaitFor(t, "b queued", 30*time.Second, func() bool { return p.Stats().Queued == 1 })
	cancel()
	if res := <-b; res.code != http.StatusServiceUnavailable || res.hdr.Get("Retry-After") == "" {
		t.Fatalf("queued at shutdown: %d %q, want 503 with Retry-After", res.code, res.body)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) with a request in flight", err)
	default:
	}
	g.release <- struct{}{}
	mustOK(t, <-a)
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func TestMetricsExposition(t *testing.T) {
	g := newGate()
	g.release <- struct{}{}
	r := newRig(t, proxyConfig(), 8, g.handler)
	mustOK(t, r.get(context.Background(), "/v1/x"))
	// The proxy counts a request once its handler returns, which may be
	// after the client has read the answer.
	testkit.WaitFor(t, "the request counted", 30*time.Second, func() bool {
		return metricValue(t, r.reg, "vllm_guard_proxy_request_duration_seconds", "", "") == 1
	})
	for _, name := range []string{
		"vllm_guard_proxy_requests_total", "vllm_guard_proxy_inflight", "vllm_guard_proxy_queue_depth",
		"vllm_guard_proxy_rejected_total", "vllm_guard_proxy_request_duration_seconds", "vllm_guard_proxy_limit",
		"vllm_guard_proxy_buffered_body_bytes", "vllm_guard_proxy_resumed_total", "vllm_guard_proxy_resume_failed_total",
	} {
		if n, _ := scrape(t, r.reg, name, "", ""); n <= 0 {
			t.Errorf("metric %s: %d series", name, n)
		}
	}
	if got := metricValue(t, r.reg, "vllm_guard_proxy_request_duration_seconds", "", ""); got != 1 {
		t.Errorf("request duration histogram has %v observations, want 1", got)
	}
	if n, _ := scrape(t, r.reg, "vllm_guard_proxy_rejected_total", "", ""); n != len(reasons) {
		t.Errorf("proxy_rejected_total has %d reasons, want %d from the start", n, len(reasons))
	}
	if got := metricValue(t, r.reg, "vllm_guard_proxy_limit_bound", "bound", "rung"); got != 1 {
		t.Errorf("proxy_limit_bound{rung} = %v, want 1", got)
	}
	if got := metricValue(t, r.reg, "vllm_guard_proxy_requests_total", "code", "200"); got != 1 {
		t.Errorf("requests{200} = %v", got)
	}
}

// A 503 while the guard still calls vLLM ready (its engine died) is vLLM's
// answer: passed on, not retried.
func TestA503WhileReadyIsPassedOn(t *testing.T) {
	var calls atomic.Int32
	r := newRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	resp, err := r.client.Post(r.front.URL+"/v1/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || calls.Load() != 1 {
		t.Fatalf("%d after %d calls; want vLLM's 503, once", resp.StatusCode, calls.Load())
	}
}

// Probes, scrapes and listings pass straight through (issue 17 item 4):
// with every slot taken and the queue full, /health, /metrics, /v1/models,
// /version and /ping still reach vLLM at once, take no slot, and are never
// queued or refused for load.
func TestProbesAndScrapesPassThrough(t *testing.T) {
	g := newGate()
	cfg := proxyConfig()
	cfg.QueueSize = 1
	r := newRig(t, cfg, 1, func(w http.ResponseWriter, req *http.Request) {
		if IsInference(req) {
			g.handler(w, req)
			return
		}
		io.WriteString(w, "through "+req.Method+" "+req.URL.Path)
	})
	held := r.goGet("/v1/completions")
	testkit.WaitFor(t, "the only slot taken", 30*time.Second, func() bool { return g.n() == 1 })
	queued := r.goGet("/v1/chat/completions")
	testkit.WaitFor(t, "the queue full", 30*time.Second, func() bool { return r.p.Stats().Queued == 1 })

	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/health"}, {http.MethodGet, "/metrics"}, {http.MethodGet, "/v1/models"},
		{http.MethodGet, "/version"}, {http.MethodGet, "/ping"}, {http.MethodPost, "/ping"}, {http.MethodGet, "/load"},
	} {
		req, _ := http.NewRequest(c.method, r.front.URL+c.path, nil)
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "through " + c.method + " " + c.path; resp.StatusCode != http.StatusOK || string(b) != want {
			t.Errorf("%s %s with every slot taken: %d %q, want 200 %q", c.method, c.path, resp.StatusCode, b, want)
		}
	}
	if st := r.p.Stats(); st.Inflight != 1 || st.Queued != 1 || st.Admitted != 1 || st.Rejected != 0 {
		t.Errorf("after the pass-through requests: %+v, want the one inference request in flight and one queued, nothing refused", st)
	}
	// One more inference request is refused: the queue is full.
	if res := r.get(context.Background(), "/v1/embeddings"); res.code != http.StatusTooManyRequests {
		t.Errorf("inference request with the queue full: %d, want 429", res.code)
	}
	g.release <- struct{}{}
	g.release <- struct{}{}
	mustOK(t, <-held)
	mustOK(t, <-queued)
}

// While vLLM is down a pass-through request is answered at once with 503,
// not held until vLLM comes back as an inference request is.
func TestPassThroughWhileVLLMIsDown(t *testing.T) {
	r := newRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {})
	r.upstream.Close() // vLLM is gone: its port refuses connections
	r.up.set(func(f *fakeUp) { f.ready = false })
	res := r.get(context.Background(), "/health")
	if res.code != http.StatusServiceUnavailable || res.hdr.Get("Retry-After") == "" || !strings.Contains(res.body, "not up now") {
		t.Fatalf("GET /health with vLLM down: %d %q, want 503 with Retry-After saying vLLM is not up", res.code, res.body)
	}
	if st := r.p.Stats(); st.Admitted != 0 || st.Rejected != 0 {
		t.Errorf("a pass-through request counted in admission: %+v", st)
	}
}

func TestIsInference(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         bool
	}{
		{"POST", "/v1/completions", true}, {"POST", "/v1/chat/completions", true}, {"POST", "/v1/embeddings", true},
		{"POST", "/v1/responses", true}, {"POST", "/v1/audio/transcriptions", true}, {"POST", "/v2/rerank", true},
		{"POST", "/pooling", true}, {"POST", "/classify", true}, {"POST", "/score", true}, {"POST", "/rerank", true},
		{"POST", "/tokenize", true}, {"POST", "/detokenize", true}, {"POST", "/invocations", true},
		{"GET", "/v1/models", false}, {"GET", "/health", false}, {"GET", "/metrics", false}, {"GET", "/version", false},
		{"GET", "/ping", false}, {"POST", "/ping", false}, {"GET", "/v1/completions", false}, {"POST", "/health", false},
	} {
		req, _ := http.NewRequest(c.method, "http://vllm"+c.path, nil)
		if got := IsInference(req); got != c.want {
			t.Errorf("IsInference(%s %s) = %v, want %v", c.method, c.path, got, c.want)
		}
	}
}

var testLog *zap.Logger

func init() {
	if os.Getenv("PROXY_TEST_LOG") != "" {
		testLog, _ = zap.NewDevelopment()
	}
}
