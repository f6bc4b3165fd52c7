package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// rawRequest sends raw over a new connection to r's front and reads the
// answer.
func rawRequest(t *testing.T, r *rig, raw string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", r.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a bound against a hang
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Issue 32 item 5: a request's trailers are dropped, never forwarded; one
// the transport would refuse to write (Content-Length) no longer fails the
// request with a 502, and a malformed one is the client's 400, without a
// warning per request. For a pass-through request and an inference one.
func TestRequestTrailersAreDropped(t *testing.T) {
	type seen struct {
		body    string
		trailer http.Header
	}
	got := make(chan seen, 8)
	r := newRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		got <- seen{string(b), req.Trailer}
		w.Write([]byte(`{}`))
	})
	core, logs := observer.New(zap.DebugLevel)
	r.p.log = zap.New(core)
	for _, path := range []string{"/v1/completions", "/health"} {
		for _, trailer := range []string{"X-Check: 1", "Content-Length: 5", "Host: elsewhere"} {
			code, body := rawRequest(t, r, "POST "+path+" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Check\r\n\r\n"+
				"5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n"+trailer+"\r\n\r\n")
			if code != http.StatusOK {
				t.Errorf("%s with trailer %q: %d %s; want 200", path, trailer, code, body)
				continue
			}
			s := <-got
			if s.body != `{"a":1}` || len(s.trailer) != 0 {
				t.Errorf("%s with trailer %q: vLLM got body %q, trailers %v; want the body and no trailer", path, trailer, s.body, s.trailer)
			}
		}
		code, body := rawRequest(t, r, "POST "+path+" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\nX-Bad: a\x01b\r\n\r\n")
		if code != http.StatusBadRequest || !strings.Contains(body, "request body could not be read") {
			t.Errorf("%s with a malformed trailer: %d %s; want 400 saying the body could not be read", path, code, body)
		}
		if path == "/v1/completions" {
			// Read whole before admission: vLLM never sees it. (A
			// pass-through body streams: vLLM sees it cut.)
			select {
			case s := <-got:
				t.Errorf("an inference request with a malformed trailer reached vLLM: %+v", s)
			default:
			}
		}
	}
	if n := logs.FilterLevelExact(zap.WarnLevel).Len() + logs.FilterLevelExact(zap.ErrorLevel).Len(); n != 0 {
		t.Errorf("%d warnings for clients' trailers: %v", n, logs.All())
	}
}

// Issue 32 item 5: during the guard's final stop this instance serves
// nothing new. A request waiting in the queue, and one that arrives, are
// answered 503 at once with Connection: close (they were held until the
// stop ended, 5 s and more); a request in flight goes on to its answer.
func TestFinalStopRefusesNewRequestsAtOnce(t *testing.T) {
	cfg := proxyConfig()
	cfg.QueueTimeout.Duration = time.Hour // without the refusal, a wait past the test's bound
	g := newGate()
	r := newRig(t, cfg, 1, g.handler)
	inflight := r.goGet("/v1/completions")
	testkit.WaitFor(t, "the first request at vLLM", 30*time.Second, func() bool { return g.n() == 1 })
	queued := r.goGet("/v1/chat/completions")
	testkit.WaitFor(t, "the second request queued", 30*time.Second, func() bool { return r.p.Stats().Queued == 1 })

	r.p.Stopping()
	closed := map[string]bool{} // path: the answer closed its connection
	var mu sync.Mutex
	get := func(method, path string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			req, _ := http.NewRequest(method, r.front.URL+path, strings.NewReader(`{"prompt":"x"}`))
			resp, err := r.client.Do(req)
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			mu.Lock()
			closed[path] = resp.Close
			mu.Unlock()
			ch <- result{code: resp.StatusCode, hdr: resp.Header, body: string(b)}
		}()
		return ch
	}
	for what, ch := range map[string]<-chan result{
		"the queued request":      queued,
		"a new inference request": get(http.MethodPost, "/v1/completions"),
		"a new pass-through GET":  get(http.MethodGet, "/health"),
	} {
		select {
		case res := <-ch:
			if res.err != nil || res.code != http.StatusServiceUnavailable || !strings.Contains(res.body, "will not serve") {
				t.Errorf("%s during the final stop: %d %q (%v); want 503 saying this instance will not serve it", what, res.code, res.body, res.err)
			}
			path := map[string]string{"a new inference request": "/v1/completions", "a new pass-through GET": "/health"}[what]
			mu.Lock()
			kept := path != "" && !closed[path]
			mu.Unlock()
			if res.err == nil && kept {
				t.Errorf("%s during the final stop: the connection is kept; want Connection: close", what)
			}
		case <-time.After(30 * time.Second): // a bound: the refusal is at once
			t.Fatalf("%s during the final stop was held, not refused", what)
		}
	}
	if g.n() != 1 {
		t.Errorf("%d requests reached vLLM; want only the one in flight before the stop", g.n())
	}
	g.release <- struct{}{}
	mustOK(t, <-inflight)
}

// Issue 32 item 5: one client address holds at most its share of
// max_buffered_bytes (a quarter by default), so bandwidth alone (a body
// sent nearly whole, then a stall) cannot take the whole budget: its next
// body is refused 429, another address's goes through, and once the stalled
// body is gone the first address may send again.
func TestOneClientHoldsAtMostItsShareOfTheBodyBudget(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxBodyBytes, cfg.MaxBufferedBytes = 1<<20, 4<<20 // a share of 1 MiB
	r := newRig(t, cfg, 8, func(w http.ResponseWriter, req *http.Request) {
		n, _ := io.Copy(io.Discard, req.Body)
		fmt.Fprint(w, n)
	})
	if got := r.p.budget.perClient; got != 1<<20 {
		t.Fatalf("a client's share is %d bytes; want a quarter of max_buffered_bytes, 1 MiB", got)
	}
	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		tr := &http.Transport{DialContext: d.DialContext}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	post := func(c *http.Client, body string) (int, string) {
		resp, err := c.Post(r.front.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	small := `{"prompt": "` + strings.Repeat("a", 64<<10) + `"}`

	// 127.0.0.1 sends all of a 1 MiB body but its last bytes, and stalls.
	stall, err := net.Dial("tcp", r.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Close()
	fmt.Fprintf(stall, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 1<<20)
	if _, err := stall.Write([]byte(`{"prompt": "` + strings.Repeat("a", 1<<20-100))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the stalled body held", 30*time.Second, func() bool { return r.p.budget.inUse() == 1<<20 })

	if code, body := post(from("127.0.0.1"), small); code != http.StatusTooManyRequests || !strings.Contains(body, "max_buffered_bytes_per_client") {
		t.Errorf("a second body from the stalled client's address: %d %.200s; want 429 naming max_buffered_bytes_per_client", code, body)
	}
	if code, body := post(from("127.0.0.2"), small); code != http.StatusOK {
		t.Errorf("a body from another address: %d %.200s; want 200", code, body)
	}
	stall.Close()
	testkit.WaitFor(t, "the stalled body's share given back", 30*time.Second, func() bool { return r.p.budget.inUse() == 0 })
	if code, body := post(from("127.0.0.1"), small); code != http.StatusOK {
		t.Errorf("the first address once its stalled body is gone: %d %.200s; want 200", code, body)
	}
}

func TestClientOf(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.3:5":               "10.1.2.3/32",
		"[::ffff:10.1.2.3]:5":      "10.1.2.3/32",
		"[2001:db8:1:2:3:4:5:6]:5": "2001:db8:1:2::/64",
		"@":                        "invalid Prefix",
	} {
		if got := clientOf(in).String(); got != want {
			t.Errorf("clientOf(%q) = %s; want %s", in, got, want)
		}
	}
}

// Issue 40 item 4: behind a peer in trusted_proxies a body counts against
// the share of the client that peer forwards, as its requests in progress
// do: a stalled client of the balancer holds only its own share, and
// another client behind the same balancer still sends.
func TestBodyShareFollowsTheForwardedClient(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxBodyBytes, cfg.MaxBufferedBytes = 1<<20, 4<<20 // a share of 1 MiB
	cfg.TrustedProxies = []string{"127.0.0.1/32"}
	r := newRig(t, cfg, 8, func(w http.ResponseWriter, req *http.Request) {
		n, _ := io.Copy(io.Discard, req.Body)
		fmt.Fprint(w, n)
	})
	post := func(xff, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	small := `{"prompt": "` + strings.Repeat("a", 64<<10) + `"}`

	// The balancer's client 203.0.113.7 sends all of a 1 MiB body but its
	// last bytes, and stalls.
	stall, err := net.Dial("tcp", r.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Close()
	fmt.Fprintf(stall, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.7\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 1<<20)
	if _, err := stall.Write([]byte(`{"prompt": "` + strings.Repeat("a", 1<<20-100))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the stalled body held", 30*time.Second, func() bool { return r.p.budget.inUse() == 1<<20 })
	if code, body := post("203.0.113.8", small); code != http.StatusOK {
		t.Errorf("another client behind the same balancer: %d %.200s; want 200", code, body)
	}
	if code, body := post("203.0.113.7", small); code != http.StatusTooManyRequests || !strings.Contains(body, "max_buffered_bytes_per_client") {
		t.Errorf("a second body of the stalled client: %d %.200s; want 429 naming max_buffered_bytes_per_client", code, body)
	}
}
