package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// connCounter counts a server's open connections.
type connCounter struct{ open atomic.Int64 }

func (c *connCounter) track(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		c.open.Add(1)
	case http.StateClosed, http.StateHijacked:
		c.open.Add(-1)
	}
}

// churn sends n requests through a proxy, concurrency at a time, a third
// of them abandoned by their client at a random moment (queued, waiting
// for headers, or mid-stream), and checks that goroutines and connections
// come back to where they were.
func churn(t testing.TB, n, concurrency, limit int) {
	var upConns, frontConns connCounter
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 5 {
				if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(100 * time.Microsecond):
				}
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	upstream.Config.ConnState = upConns.track
	upstream.Start()
	defer upstream.Close()
	cfg := proxyConfig()
	cfg.QueueSize = concurrency
	p := New(cfg, &fakeUp{url: upstream.URL, ready: true, seqs: limit}, prometheus.NewRegistry(), nil)
	front := httptest.NewUnstartedServer(p)
	front.Config.ConnState = frontConns.track
	front.Start()
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}

	settle := func() {
		client.CloseIdleConnections()
		p.tr.CloseIdleConnections()
	}
	settle()
	base := runtime.NumGoroutine()

	var wg sync.WaitGroup
	var next atomic.Int64
	var ok, abandoned atomic.Int64
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for next.Add(1) <= int64(n) {
				path := "/v1/completions"
				if rng.IntN(2) == 0 {
					path += "/stream"
				}
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					d := time.Duration(rng.IntN(600)) * time.Microsecond
					time.AfterFunc(d, cancel)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+path, strings.NewReader(`{"prompt":"x"}`))
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err == nil && resp.StatusCode == 200 {
					ok.Add(1)
				} else if ctx.Err() != nil {
					abandoned.Add(1)
				} else if err != nil {
					t.Errorf("request failed without its client leaving: %v", err)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if ok.Load() == 0 || abandoned.Load() == 0 {
		t.Fatalf("%d ok, %d abandoned: the test did not exercise both paths", ok.Load(), abandoned.Load())
	}
	var s Stats
	var g int
	// Each look settles the runtime first: one every 5 ms.
	back := testkit.PollEvery(10*time.Second, 5*time.Millisecond, func() bool {
		settle()
		s = p.Stats()
		g = runtime.NumGoroutine()
		return s.Inflight == 0 && s.Queued == 0 && g <= base && upConns.open.Load() == 0 && frontConns.open.Load() == 0
	})
	if !back {
		buf := make([]byte, 1<<20)
		t.Fatalf("after %d requests (%d ok, %d abandoned): %d goroutines (baseline %d), %d upstream and %d client connections open, stats %+v\n%s",
			n, ok.Load(), abandoned.Load(), g, base, upConns.open.Load(), frontConns.open.Load(), s, buf[:runtime.Stack(buf, true)])
	}
	t.Logf("%d requests: %d ok, %d abandoned by their client; back to %d goroutines, no connection open", n, ok.Load(), abandoned.Load(), base)
}

func TestNoLeakAfterRandomDisconnects(t *testing.T) {
	churn(t, 3000, 16, 4)
}

// BenchmarkProxyChurn100k is the leak check at full size (too slow
// for every `go test -race`): 100 000 requests, a third abandoned by their
// client at a random moment; it fails unless goroutines and connections
// come back to their baseline. `make bench` runs it.
func BenchmarkProxyChurn100k(b *testing.B) {
	churn(b, 100000, 64, 16)
}
