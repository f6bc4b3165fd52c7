package connlimit

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// The descriptor budget keeps a reserve for supervision whatever the limit.
func TestCaps(t *testing.T) {
	for _, tc := range []struct {
		nofile         uint64
		proxyMax       int
		proxy, control int
	}{
		{128, 1024, 28, 8},        // ulimit -n 128: 64 kept back, 8 control, (64-8)/2 proxy
		{1024, 1024, 352, 64},     // 256 kept back
		{1 << 20, 1024, 1024, 64}, // the configured max rules
		{8, 1024, 1, 4},           // absurdly low: still one of each
	} {
		p, c := Caps(tc.nofile, tc.proxyMax)
		if p != tc.proxy || c != tc.control {
			t.Errorf("Caps(%d, %d) = %d, %d; want %d, %d", tc.nofile, tc.proxyMax, p, c, tc.proxy, tc.control)
		}
		if tc.nofile >= 64 && uint64(2*p+c) > tc.nofile-min(Reserve, tc.nofile/2) {
			t.Errorf("Caps(%d): %d proxy and %d control connections eat into the reserve", tc.nofile, p, c)
		}
	}
}

// Connections over the cap get a 503 and are closed at accept; a place
// freed by a close is taken by the next connection.
func TestListenerRefusesOverTheCap(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewPerSource(inner, 2, 0)
	defer l.Close()
	accepted := make(chan net.Conn)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2 := dial(), dial()
	s1, s2 := <-accepted, <-accepted
	if l.Open() != 2 {
		t.Fatalf("open = %d, want 2", l.Open())
	}

	over := dial()
	resp, err := http.ReadResponse(bufio.NewReader(over), nil)
	if err != nil {
		t.Fatalf("the connection over the cap got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "too many open connections") {
		t.Errorf("over the cap: %d %q; want 503 saying too many open connections", resp.StatusCode, body)
	}
	if n, _ := over.Read(make([]byte, 1)); n != 0 {
		t.Error("the connection over the cap was left open")
	}
	over.Close()
	if l.Refused() != 1 {
		t.Errorf("refused = %d, want 1", l.Refused())
	}

	s1.Close()
	s1.Close() // a second Close gives nothing back twice
	c3 := dial()
	s3 := <-accepted
	if l.Open() != 2 {
		t.Errorf("open = %d after one close and one accept, want 2", l.Open())
	}
	for _, c := range []net.Conn{c1, c2, c3, s2, s3} {
		c.Close()
	}
	l.Close()
	<-done
}

// With an http.Server's ConnState hook: a newcomer over the cap takes the
// place of the oldest idle connection; one client address with every place
// of its share working on a request is refused its next connection, while
// another address still gets in.
func TestIdleGivesWayAndPerSourceCap(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewPerSource(inner, 4, 2)
	hold := make(chan struct{})
	entered := make(chan struct{}, 10)
	srv := &http.Server{ConnState: l.ConnState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-hold
		}
		io.WriteString(w, "ok")
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	defer func() { srv.Close(); <-done }()
	addr := inner.Addr().String()
	from := func(ip byte) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, ip)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ask := func(c net.Conn, path string) (int, error) {
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// 127.0.0.2 holds its two places with requests in progress.
	busy := []net.Conn{from(2), from(2)}
	for _, c := range busy {
		io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		<-entered
	}
	if code, err := ask(from(2), "/"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("a third connection from a source with two requests in progress: %d %v; want 503", code, err)
	}
	// 127.0.0.3 fills the other two places and leaves them idle.
	idle := []net.Conn{from(3), from(3)}
	for _, c := range idle {
		if code, err := ask(c, "/"); err != nil || code != http.StatusOK {
			t.Fatalf("idle-to-be: %d %v", code, err)
		}
	}
	// The listener is full; a newcomer takes an idle place.
	if code, err := ask(from(1), "/"); err != nil || code != http.StatusOK {
		t.Errorf("a newcomer with only idle connections in the way: %d %v; want 200", code, err)
	}
	if l.Evicted() != 1 || l.Refused() != 1 {
		t.Errorf("evicted %d, refused %d; want 1 and 1", l.Evicted(), l.Refused())
	}
	close(hold)
	for _, c := range append(busy, idle...) {
		c.Close()
	}
}
