package control

// Issue 41 item 4: /livez and /readyz answer whatever other clients do.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/connlimit"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// countingBackend counts the /livez handlers that ran.
type countingBackend struct {
	*fakeBackend
	alive atomic.Int64
}

func (c *countingBackend) Alive() (bool, string) {
	c.alive.Add(1)
	return c.fakeBackend.Alive()
}

// dialFrom opens a connection to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// probe asks path on a new connection from src and returns the status,
// whether the guard closes the connection after it, and the body.
func probe(t *testing.T, src, addr, path string) (int, bool, string) {
	t.Helper()
	c := dialFrom(t, src, addr)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // against a hang; a guard answers at once
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s from %s: %v", path, src, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Close, string(body)
}

// Every place of the port taken by `GET /livez` with a body announced and
// never sent, from four addresses (each at its share): /livez and /readyz
// from a fifth still answer 200, and the flood's requests are answered at
// once, their connections closed. Before, each held its place for the
// 10 s read timeout and the probes got 503.
func TestLivezAnswersUnderSlowBodies(t *testing.T) {
	b := &countingBackend{fakeBackend: newFakeBackend(status.StateReady)}
	s, err := ListenHTTP("127.0.0.1:0", NewHTTPHandler(b, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()
	_, capN := connlimit.Caps(connlimit.NoFile(), 0)
	per := max(capN/4, 2)
	var flood []net.Conn
	for i := range capN {
		c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i/per), addr)
		io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\nx")
		flood = append(flood, c)
	}
	// Every flood request was read and its handler ran: before, each
	// then held its place reading the rest of the body.
	testkit.WaitFor(t, "the flood's requests read", 30*time.Second, func() bool { return b.alive.Load() >= int64(capN) })
	for _, path := range []string{"/livez", "/readyz"} {
		if code, _, body := probe(t, "127.0.0.250", addr, path); code != http.StatusOK {
			t.Errorf("%s with %d slow bodies held: %d %q; want 200", path, capN, code, body)
		}
	}
	for i, c := range flood {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("slow body %d: no answer: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !resp.Close {
			t.Errorf("slow body %d: %d, close %v; want 200 and the connection closed", i, resp.StatusCode, resp.Close)
		}
		if _, err := br.ReadByte(); err == nil {
			t.Errorf("slow body %d: the connection stayed open", i)
		}
	}
}

// blockingMetrics holds every /metrics request until release is closed.
type blockingMetrics struct {
	in      atomic.Int64
	release chan struct{}
}

func (m *blockingMetrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.in.Add(1)
	<-m.release
	io.WriteString(w, "# none\n")
}

// Every place of the port working on a request that does not end (a
// scrape read slowly, from four addresses): /livez and /readyz are still
// answered, on a connection of the reserve that is closed after its
// answer; nothing else is served there. Before, the probes got 503.
func TestReserveAnswersProbesWhenEveryPlaceWorks(t *testing.T) {
	m := &blockingMetrics{release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(m.release)
		}
	}
	defer release()
	s, err := ListenHTTP("127.0.0.1:0", NewHTTPHandler(newFakeBackend(status.StateReady), m), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()
	_, capN := connlimit.Caps(connlimit.NoFile(), 0)
	per := max(capN/4, 2)
	for i := range capN {
		c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i/per), addr)
		io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
	}
	testkit.WaitFor(t, "every place working", 30*time.Second, func() bool { return m.in.Load() >= int64(capN) })
	for i := range 2 * healthReserve {
		for _, path := range []string{"/livez", "/readyz"} {
			code, closed, body := probe(t, "127.0.0.250", addr, path)
			if code != http.StatusOK || !closed {
				t.Fatalf("%s (%d) with every place working: %d, closed %v, %q; want 200 on a closed connection", path, i, code, closed, body)
			}
		}
	}
	if code, _, body := probe(t, "127.0.0.250", addr, "/status"); code != http.StatusServiceUnavailable {
		t.Errorf("/status on the reserve: %d %q; want 503 (only the probes are answered there)", code, body)
	}
	release()
	testkit.WaitFor(t, "a place free again", 30*time.Second, func() bool {
		code, _, _ := probe(t, "127.0.0.250", addr, "/status")
		return code == http.StatusOK
	})
}
