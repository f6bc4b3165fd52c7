package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vllm-guard/vllm-guard/internal/benchnginx"
)

// The proxy's overhead on loopback, side by side in one run: direct to a
// tiny Go upstream, through this proxy, and through nginx (Debian's
// package, a plain reverse proxy with buffering off and a keepalive
// upstream). Goals: p50 added latency ≤ 0.2 ms, p99 ≤ 1 ms, throughput ≥ 90 %
// of direct, first SSE byte delay ≤ 1 ms, and not slower than nginx.
//
// Each sub-benchmark is one fixed measurement (it ignores b.N); the
// metrics are the result.

const (
	smallBody   = `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" ok","finish_reason":"length"}]}`
	sseEvents   = 20
	latencyRuns = 2000 // sequential requests per target, interleaved
	sseRuns     = 400
	tputWorkers = 16
	tputWindow  = 700 * time.Millisecond
)

func benchUpstream(b *testing.B) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/small", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, smallBody)
	})
	// A request that takes 1 ms upstream, as any generation does: the
	// throughput ratio without the loopback test's CPU saturation.
	mux.HandleFunc("/v1/small1ms", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, smallBody)
	})
	mux.HandleFunc("/v1/sse", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range sseEvents {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\" t%d\"}]}\n\n", i)
			f.Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	srv := &http.Server{Handler: mux}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(l)
	srv.Addr = l.Addr().String()
	b.Cleanup(func() { srv.Close() })
	return srv
}

// startNginx runs nginx as a plain reverse proxy to upstream and returns
// its base URL.
func startNginx(b *testing.B, upstream string) string {
	bin, err := benchnginx.Find()
	if err != nil {
		b.Fatalf("%v: this benchmark compares the proxy with it", err)
	}
	dir := b.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd, err := benchnginx.Write(bin, dir, upstream, addr, 0)
	if err != nil {
		b.Fatal(err)
	}
	out := &syncWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatalf("start nginx: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return "http://" + addr
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			b.Fatalf("nginx exited at start: %s %s", out.String(), log)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("nginx does not listen on %s after 10s", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type syncWriter struct {
	mu sync.Mutex
	b  []byte
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *syncWriter) String() string { w.mu.Lock(); defer w.mu.Unlock(); return string(w.b) }

type benchTarget struct {
	name   string
	url    string
	client *http.Client
}

func newTargets(b *testing.B) []*benchTarget {
	up := benchUpstream(b)
	p := New(proxyConfig(), &fakeUp{url: "http://" + up.Addr, ready: true, seqs: 4096}, prometheus.NewRegistry(), nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { p.Serve(ctx, l); close(served) }()
	b.Cleanup(func() { cancel(); <-served })
	nginx := startNginx(b, up.Addr)
	var ts []*benchTarget
	for _, t := range []struct{ name, url string }{{"direct", "http://" + up.Addr}, {"proxy", "http://" + l.Addr().String()}, {"nginx", nginx}} {
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: tputWorkers * 2, DisableCompression: true}}
		b.Cleanup(c.CloseIdleConnections)
		ts = append(ts, &benchTarget{name: t.name, url: t.url, client: c})
	}
	return ts
}

// do sends one request and returns its duration and the delay to the
// first body byte.
func (t *benchTarget) do(path string) (total, firstByte time.Duration, err error) {
	start := time.Now()
	resp, err := t.client.Post(t.url+path, "application/json", nil)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.Peek(1); err != nil {
		return 0, 0, fmt.Errorf("%s%s: first byte: %w", t.url, path, err)
	}
	firstByte = time.Since(start)
	if _, err := io.Copy(io.Discard, rd); err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != 200 {
		return 0, 0, fmt.Errorf("%s%s: HTTP %d", t.url, path, resp.StatusCode)
	}
	return time.Since(start), firstByte, nil
}

func pct(ds []time.Duration, q float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Millisecond)
}

// throughput is requests per second with tputWorkers concurrent clients.
func (t *benchTarget) throughput(b *testing.B, path string) float64 {
	var n atomic.Int64
	stop := time.Now().Add(tputWindow)
	var wg sync.WaitGroup
	for range tputWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if _, _, err := t.do(path); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		}()
	}
	start := time.Now()
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

func measure(b *testing.B, ts []*benchTarget, path string, runs int, first bool) {
	total := map[string][]time.Duration{}
	fb := map[string][]time.Duration{}
	for i := range runs + 50 {
		for _, t := range ts { // interleaved, so drift hits all alike
			d, f, err := t.do(path)
			if err != nil {
				b.Fatal(err)
			}
			if i >= 50 { // warm-up: connections, pools
				total[t.name] = append(total[t.name], d)
				fb[t.name] = append(fb[t.name], f)
			}
		}
	}
	tput := map[string]float64{}
	for _, t := range ts {
		tput[t.name] = t.throughput(b, path)
	}
	series := total
	what := "latency"
	if first {
		series, what = fb, "first-byte"
	}
	for _, name := range []string{"proxy", "nginx"} {
		b.ReportMetric(pct(series[name], 0.50)-pct(series["direct"], 0.50), name+"-p50-added-"+what+"-ms")
		b.ReportMetric(pct(series[name], 0.99)-pct(series["direct"], 0.99), name+"-p99-added-"+what+"-ms")
		b.ReportMetric(tput[name]/tput["direct"], name+"-throughput-ratio")
	}
	b.ReportMetric(pct(series["direct"], 0.50), "direct-p50-"+what+"-ms")
	b.ReportMetric(tput["direct"], "direct-req/s")
	if !first {
		// The same with a 1 ms upstream: on a 2-core machine the plain
		// loopback test above is CPU-bound, and any proxy (nginx too)
		// takes half of the CPU the direct path had to itself.
		slow := map[string]float64{}
		for _, t := range ts {
			slow[t.name] = t.throughput(b, path+"1ms")
		}
		b.ReportMetric(slow["proxy"]/slow["direct"], "proxy-throughput-ratio-1ms-upstream")
		b.ReportMetric(slow["nginx"]/slow["direct"], "nginx-throughput-ratio-1ms-upstream")
	}
}

func BenchmarkProxyOverhead(b *testing.B) {
	ts := newTargets(b)
	b.Run("small", func(b *testing.B) { measure(b, ts, "/v1/small", latencyRuns, false) })
	b.Run("sse", func(b *testing.B) { measure(b, ts, "/v1/sse", sseRuns, true) })
}
