package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vllm-guard/vllm-guard/config"
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
	waitFor(t, "2 requests upstream", func() bool { return g.n() == 2 })
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
