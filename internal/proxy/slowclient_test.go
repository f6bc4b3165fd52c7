package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// dialStalled sends GET path through the proxy on a connection with a tiny
// receive buffer and never reads from it.
func dialStalled(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("POST " + path + " HTTP/1.1\r\nHost: guard\r\nContent-Length: 0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	return c
}

// Two clients that never read their (endless) answers hold both slots of a
// limit of 2. Each write to them stalls; after write_timeout without
// progress the proxy ends their requests, cancels them at vLLM and frees
// the slots, so a third client waiting in the queue is served (issue 15
// item 5: it got 429 after queue_timeout).
func TestStalledReadersLoseTheirSlots(t *testing.T) {
	cancelled := make(chan string, 2)
	chunk := []byte(strings.Repeat("data: x\n\n", 4096))
	cfg := proxyConfig()
	cfg.QueueSize = 4
	cfg.QueueTimeout = config.Duration{Duration: 30 * time.Second} // far beyond the write timeout
	cfg.WriteTimeout = config.Duration{Duration: 200 * time.Millisecond}
	r := newRig(t, cfg, 2, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/small" {
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := w.Write(chunk); err != nil {
				break
			}
			w.(http.Flusher).Flush()
		}
		<-req.Context().Done()
		cancelled <- req.URL.Path
	})
	addr := strings.TrimPrefix(r.front.URL, "http://")
	dialStalled(t, addr, "/v1/flood-1")
	dialStalled(t, addr, "/v1/flood-2")
	testkit.WaitFor(t, "both stalled clients to hold a slot", 30*time.Second, func() bool { return r.p.Stats().Inflight == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := r.get(ctx, "/v1/small")
	if res.err != nil || res.code != http.StatusOK || res.body != "ok" {
		t.Fatalf("third client: code %d body %q err %v; want 200 ok once the stalled clients lost their slots", res.code, res.body, res.err)
	}
	for range 2 {
		select {
		case <-cancelled:
		case <-ctx.Done():
			t.Fatal("the stalled clients' requests were not cancelled at the upstream")
		}
	}
	testkit.WaitFor(t, "the slots to be free", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
}

// Serve refuses connections over [proxy] max_connections at accept when
// every place is held by a request in progress: clients cannot take every
// descriptor. (Idle ones give way: TestIdleConnectionsDoNotShutClientsOut.)
func TestServeCapsConnections(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxConnections = 1
	g := newGate()
	s := serveProxy(t, cfg, 4, g.handler)
	busy := s.dial(t, 1)
	io.WriteString(busy, postHi)
	testkit.WaitFor(t, "the request upstream", 30*time.Second, func() bool { return g.n() == 1 })
	over := s.dial(t, 1)
	resp, err := http.ReadResponse(bufio.NewReader(over), nil)
	if err != nil {
		t.Fatalf("a connection over max_connections got no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("over max_connections: %d, want 503", resp.StatusCode)
	}
	g.release <- struct{}{}
	if resp, err := http.ReadResponse(bufio.NewReader(busy), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the request in progress: %v %v", resp, err)
	}
}
