package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// served is a proxy run by Serve on a real listener (its connection caps
// apply), in front of an httptest upstream.
type served struct {
	p    *Proxy
	up   *fakeUp
	addr string
}

func serveProxy(t *testing.T, cfg config.Proxy, seqs int, h http.HandlerFunc) *served {
	t.Helper()
	upstream := httptest.NewServer(h)
	fu := &fakeUp{url: upstream.URL, ready: true, seqs: seqs}
	p := New(cfg, fu, nil, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		<-done
		upstream.Close()
	})
	return &served{p: p, up: fu, addr: l.Addr().String()}
}

// dial opens a raw connection from a loopback address 127.0.0.ip.
func (s *served) dial(t *testing.T, ip byte) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, ip)}}
	c, err := d.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes a raw request on c and reads the answer.
func roundTrip(c net.Conn, br *bufio.Reader, raw string) (*http.Response, string, error) {
	if _, err := io.WriteString(c, raw); err != nil {
		return nil, "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

const postHi = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"prompt\":\"hi\"}"

// Idle keep-alive connections cannot shut clients out of the proxy (issue
// 24: 1,030 of them did): with every place taken by connections that
// finished their request, and more that never finish their headers, a new
// client is answered.
func TestIdleConnectionsDoNotShutClientsOut(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxConnections = 8
	s := serveProxy(t, cfg, 4, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[]}`)
	})
	for i := range cfg.MaxConnections {
		c := s.dial(t, 2)
		resp, body, err := roundTrip(c, bufio.NewReader(c), postHi)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d's own request: %v %q %v", i, resp, body, err)
		}
	}
	for range 4 {
		io.WriteString(s.dial(t, 3), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
	}
	for i := range 3 {
		c := s.dial(t, 1)
		resp, body, err := roundTrip(c, bufio.NewReader(c), postHi)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("client %d with %d idle connections open: %v %q %v; want 200", i, cfg.MaxConnections, resp, body, err)
		}
	}
}

// One client address holds at most max_connections_per_client connections
// with a request in progress; others still get in.
func TestPerClientConnectionCap(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxConnections, cfg.MaxConnectionsPerClient = 8, 2
	g := newGate()
	s := serveProxy(t, cfg, 4, g.handler)
	var held []net.Conn
	for range 2 {
		c := s.dial(t, 2)
		io.WriteString(c, postHi)
		held = append(held, c)
	}
	testkit.WaitFor(t, "2 requests upstream", 30*time.Second, func() bool { return g.n() == 2 })
	c := s.dial(t, 2)
	if resp, body, err := roundTrip(c, bufio.NewReader(c), postHi); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a third connection from an address with 2 requests in progress: %v %q %v; want 503", resp, body, err)
	}
	for range 3 {
		g.release <- struct{}{} // the two held and the next
	}
	c = s.dial(t, 1)
	if resp, body, err := roundTrip(c, bufio.NewReader(c), postHi); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("another address: %v %q %v; want 200", resp, body, err)
	}
	for _, c := range held {
		http.ReadResponse(bufio.NewReader(c), nil)
	}
}

// rawRequest sends raw on a new connection to the rig's front and returns
// the connection and its reader.
func (r *rig) raw(t *testing.T, raw string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", r.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// holdOnly is an upstream that holds requests to /v1/hold at the gate and
// answers every other request at once with its method, path and body size.
func holdOnly(g *gate) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/hold" {
			g.handler(w, r)
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, n)
	}
}

// oneSlotHeld is a rig with one slot, no queue, and that slot taken.
func oneSlotHeld(t *testing.T) (*rig, *gate) {
	cfg := proxyConfig()
	cfg.QueueSize = 0
	g := newGate()
	r := newRig(t, cfg, 1, holdOnly(g))
	freeOnFailure(t, g)
	held := r.goGet("/v1/hold")
	testkit.WaitFor(t, "the slot taken", 30*time.Second, func() bool { return g.n() == 1 })
	t.Cleanup(func() { g.release <- struct{}{}; <-held })
	return r, g
}

// Paths are cleaned and methods compared in any case before the inference
// check, so //v1/completions and "post" take a slot like the rest (issue
// 24: they went round admission), and vLLM sees the path checked.
func TestInferenceCheckSeesThePathVLLMRoutes(t *testing.T) {
	r, _ := oneSlotHeld(t)
	for _, line := range []string{"POST //v1/completions", "post /v1/completions", "POST /x/../v1/chat/completions", "Post /v1/./embeddings"} {
		_, br := r.raw(t, line+" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s with the only slot taken and no queue: %d, want 429", line, resp.StatusCode)
		}
	}
	if got := r.p.Stats().RejectedBy[reasonQueueFull]; got != 4 {
		t.Errorf("queue_full %d, want 4", got)
	}
}

func TestCleanedPathForwarded(t *testing.T) {
	r := newRig(t, proxyConfig(), 1, holdOnly(newGate()))
	_, br := r.raw(t, "post //v1//completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "POST /v1/completions 2" {
		t.Errorf("vLLM saw %q, want POST /v1/completions with the body", b)
	}
}

// A client that waits for 100 Continue is told to send its body only once
// it is admitted: refused, it never sends it (issue 24).
func TestExpectContinueOnlyAfterAdmission(t *testing.T) {
	r, g := oneSlotHeld(t)
	_, br := r.raw(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 15\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("with no slot free: first answer %d, want 429 (no 100 Continue)", resp.StatusCode)
	}
	// With a slot free: 100 Continue, then the answer once the body came.
	g.release <- struct{}{}
	testkit.WaitFor(t, "the slot free", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
	c, br := r.raw(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 15\r\n\r\n")
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("admitted: %v %v, want 100 Continue", resp, err)
	}
	io.WriteString(c, `{"prompt":"hi"}`)
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after the body: %v %v, want 200", resp, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "POST /v1/completions 15" {
		t.Errorf("vLLM saw %q", b)
	}
	g.release <- struct{}{} // for oneSlotHeld's cleanup, already answered
}

// A WebSocket upgrade to an inference path (realtime) takes a slot: with
// none free it is refused, not passed through.
func TestUpgradeTakesASlot(t *testing.T) {
	r, _ := oneSlotHeld(t)
	_, br := r.raw(t, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a WebSocket upgrade with no slot free: %d, want 429", resp.StatusCode)
	}
}

// A body with no length passed straight through (not inference) obeys
// max_body_bytes too: vLLM never gets more.
func TestChunkedPassThroughBodyCapped(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxBodyBytes = 1 << 10
	var got atomic.Int64
	r := newRig(t, cfg, 1, func(w http.ResponseWriter, req *http.Request) {
		n, _ := io.Copy(io.Discard, req.Body)
		got.Store(n)
	})
	req, _ := http.NewRequest(http.MethodPut, r.front.URL+"/load", io.MultiReader(strings.NewReader(strings.Repeat("x", 8<<10))))
	req.ContentLength = -1 // chunked
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || got.Load() > cfg.MaxBodyBytes {
		t.Errorf("8 KiB chunked through a 1 KiB limit: %d, vLLM read %d bytes; want 413 and at most 1 KiB", resp.StatusCode, got.Load())
	}
}

// Bodies held at once stay within max_buffered_bytes, each held once
// (issue 24: 1,000 concurrent 1 MiB requests took the guard to 2.9 GiB):
// with 3 MiB of room, a fourth and fifth 1 MiB body are refused 503 with
// Retry-After while three are held (one in flight, two queued).
func TestBufferedBodiesWithinBudget(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxBodyBytes, cfg.MaxBufferedBytes = 1<<20, 3<<20
	cfg.MaxBufferedBytesPerClient = cfg.MaxBufferedBytes // the whole budget: one address here
	g := newGate()
	r := newRig(t, cfg, 1, func(w http.ResponseWriter, req *http.Request) {
		n, _ := io.Copy(io.Discard, req.Body)
		g.handler(w, req)
		fmt.Fprint(w, " ", n)
	})
	freeOnFailure(t, g)
	body := `{"prompt": "` + strings.Repeat("a", 1<<20-14) + `"}`
	// One at a time, so the order is the test's and not the scheduler's:
	// five bodies read at once each hold part of the budget as they
	// arrive, and which of them finds it full depends on who reads first.
	held := make(chan result, 3)
	for i, want := range []struct{ inflight, queued int }{{1, 0}, {1, 1}, {1, 2}} {
		go func() { held <- r.post(context.Background(), body) }()
		testkit.WaitFor(t, fmt.Sprintf("body %d held (%d in flight, %d queued)", i+1, want.inflight, want.queued), 30*time.Second, func() bool {
			s := r.p.Stats()
			return s.Inflight == want.inflight && s.Queued == want.queued
		})
	}
	if got := r.p.budget.inUse(); got != 3<<20 {
		t.Errorf("%d bytes held for three 1 MiB bodies, want exactly 3 MiB (one copy each)", got)
	}
	for range 2 {
		res := r.post(context.Background(), body)
		if res.code != http.StatusServiceUnavailable || res.hdr.Get("Retry-After") == "" || !strings.Contains(res.body, "max_buffered_bytes") {
			t.Errorf("over the budget: %d %q (Retry-After %q); want 503 naming max_buffered_bytes, with Retry-After", res.code, res.body, res.hdr.Get("Retry-After"))
		}
	}
	testkit.WaitFor(t, "the refused bodies' parts given back: the three bodies' 3 MiB held", 30*time.Second, func() bool { return r.p.budget.inUse() == 3<<20 })
	if got := metricValue(t, r.reg, "vllm_guard_proxy_rejected_total", "reason", reasonBufferFull); got != 2 {
		t.Errorf("rejected{buffer_full} = %v, want 2", got)
	}
	for range 3 {
		g.release <- struct{}{}
	}
	for range 3 {
		if res := <-held; res.code != http.StatusOK || !strings.HasSuffix(res.body, " 1048576") {
			t.Errorf("held body: %d %q, want 200 with all 1 MiB sent", res.code, res.body)
		}
	}
	testkit.WaitFor(t, "the budget given back", 30*time.Second, func() bool { return r.p.budget.inUse() == 0 })
}

// base64 image and audio data is not prompt text: an 800 KiB image with a
// short question is admitted under a memory bound that a quarter of its
// bytes as tokens would exceed (issue 24: refused 413 as 273,110 tokens).
func TestImageIsNotPromptText(t *testing.T) {
	g := newGate()
	g.release <- struct{}{}
	r := newAdmissionRig(t, memoryBound(), holdOnly(g))
	res := r.post(context.Background(), string(imageMessage(800<<10)))
	if res.err != nil || res.code != http.StatusOK {
		t.Fatalf("an 800 KiB image: %d %q (%v), want 200", res.code, res.body, res.err)
	}
}

// A slow uploader holds no slot: its body is read before admission, so
// with one slot another client is answered while the upload stalls.
func TestSlowUploaderHoldsNoSlot(t *testing.T) {
	cfg := proxyConfig()
	cfg.QueueTimeout = config.Duration{Duration: 2 * time.Second}
	r := newRig(t, cfg, 1, holdOnly(newGate()))
	c, _ := r.raw(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n")
	if _, err := c.Write(make([]byte, 1<<20)); err != nil { // half, then nothing
		t.Fatal(err)
	}
	testkit.WaitFor(t, "half the body held", 30*time.Second, func() bool { return r.p.budget.inUse() >= 1<<20 })
	if res := r.post(context.Background(), `{"prompt": "hi"}`); res.code != http.StatusOK {
		t.Errorf("with a slow upload in progress: %d %q, want 200", res.code, res.body)
	}
	c.Close()
	testkit.WaitFor(t, "the stalled body's bytes given back", 30*time.Second, func() bool { return r.p.budget.inUse() == 0 })
}

// A body larger than the old replay cap (1 MiB), refused by a vLLM draining
// for a planned restart, is sent again once vLLM is back, from the one copy
// held (issue 24: vLLM's refusal reached the client).
func TestLargeBodyResentAfterPlannedRestart(t *testing.T) {
	var calls atomic.Int32
	var r *rig
	r = newRig(t, proxyConfig(), 1, func(w http.ResponseWriter, req *http.Request) {
		n, _ := io.Copy(io.Discard, req.Body)
		if calls.Add(1) == 1 {
			r.up.set(func(f *fakeUp) { f.ready = false }) // the guard stops calling it ready
			r.p.Notify()
			// vLLM 0.32.0 during its drain (seen on the real server).
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":{"message":"cannot schedule new futures after shutdown","type":"InternalServerError","param":null,"code":500}}`)
			return
		}
		fmt.Fprint(w, n)
	})
	body := `{"prompt": "` + strings.Repeat("a", 2<<20) + `"}`
	res := r.goPost(body)
	testkit.WaitFor(t, "the refused request waiting for vLLM", 30*time.Second, func() bool { return r.p.Stats().UpstreamRetries == 1 })
	r.up.set(func(f *fakeUp) { f.ready = true })
	r.p.Notify()
	got := <-res
	if got.code != http.StatusOK || got.body != fmt.Sprint(len(body)) {
		t.Fatalf("a %d-byte body refused while draining: %d %q; want 200 with the whole body sent again", len(body), got.code, got.body)
	}
}

// An admitted upgrade goes through and holds its slot while the upgraded
// connection lives.
func TestUpgradeHoldsItsSlotWhileOpen(t *testing.T) {
	r := newRig(t, proxyConfig(), 1, func(w http.ResponseWriter, req *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		b, err := brw.ReadByte()
		if err == nil {
			c.Write([]byte{b})
		}
	})
	c, br := r.raw(t, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade with a slot free: %v %v, want 101", resp, err)
	}
	if s := r.p.Stats(); s.Inflight != 1 {
		t.Errorf("while upgraded: %d in flight, want 1", s.Inflight)
	}
	c.Write([]byte{'x'})
	if b, err := br.ReadByte(); err != nil || b != 'x' {
		t.Fatalf("upgraded stream: %q %v", b, err)
	}
	c.Close()
	testkit.WaitFor(t, "the slot freed", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
}

// A client that waits for 100 Continue (curl does for bodies over 1 MiB)
// is admitted on a guess from its length, capped at the room, and counted
// once its body is read: an 800 KiB image is not refused 413 as 273,110
// tokens, and the tokens in flight are the counted ones.
func TestExpectContinueImageCountedAfterAdmission(t *testing.T) {
	g := newGate()
	r := newAdmissionRig(t, memoryBound(), holdOnly(g))
	freeOnFailure(t, g)
	body := imageMessage(800 << 10)
	c, br := r.raw(t, fmt.Sprintf("POST /v1/hold HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body)))
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("admitted: %v %v, want 100 Continue", resp, err)
	}
	c.Write(body)
	testkit.WaitFor(t, "the request upstream", 30*time.Second, func() bool { return g.n() == 1 })
	if s := r.p.Stats(); s.PromptTokensInflight != 6 || s.MemoryInflightBytes >= s.MemoryRoomBytes {
		t.Errorf("in flight: %v tokens, %v of %v bytes; want the 6 counted tokens, not the guess", s.PromptTokensInflight, s.MemoryInflightBytes, s.MemoryRoomBytes)
	}
	g.release <- struct{}{}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("an 800 KiB image after 100 Continue: %v %v, want 200", resp, err)
	}
	testkit.WaitFor(t, "nothing in flight", 30*time.Second, func() bool { s := r.p.Stats(); return s.Inflight == 0 && s.MemoryInflightBytes == 0 })
}

// A slow uploader holds budget for about what it sent, not for what it
// announced: 64 KiB of an announced 16 MiB holds at most 128 KiB.
func TestSlowUploaderHoldsWhatItSent(t *testing.T) {
	r := newRig(t, proxyConfig(), 1, holdOnly(newGate()))
	c, _ := r.raw(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 16777216\r\n\r\n")
	c.Write(make([]byte, 64<<10))
	testkit.WaitFor(t, "64 KiB held", 30*time.Second, func() bool { return r.p.budget.inUse() >= 64<<10 })
	if got := r.p.budget.inUse(); got > 128<<10 {
		t.Errorf("64 KiB sent of 16 MiB announced: %d bytes of budget held, want at most 128 KiB", got)
	}
	c.Close()
	testkit.WaitFor(t, "the budget given back", 30*time.Second, func() bool { return r.p.budget.inUse() == 0 })
}
