package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Memory-aware admission (issue 18) over the real guard, the simulator and
// the stand-in NVML. The arithmetic, on the scene's 80 GiB device (512 MiB
// reserved) with the API process's 256 MiB: utilization 0.8 leaves
// 81 920 − 512 − 256 − 65 536 = 15 616 MiB above vLLM's budget; a running
// request of 2 000 prompt tokens costs 100 MiB + 2 000 × 16 KiB = 131.25 MiB,
// so 118 run safely and the 119th runs vLLM out of memory. The rung allows
// 256 (and 230 after an OOM): far past that point.
const (
	admSeqMiB      = 100
	admTokenKiB    = 16
	admPrompt      = 2000
	admClients     = 160
	admTrueSafe    = (81920 - 512 - 256 - 65536) * 1024 / (admSeqMiB*1024 + admPrompt*admTokenKiB) // 118
	admMaxNumSeqs  = 256
	admSample      = 100 * time.Millisecond
	admTokenPeriod = "100ms" // a request of 10 tokens streams for about a second
)

func admissionScene(t *testing.T) (*scene, string) {
	s := newScene(t)
	proxyPort := freePort(t)
	s.env["FAKEVLLM_SEQ_COST_MIB"] = fmt.Sprint(admSeqMiB)
	s.env["FAKEVLLM_TOKEN_COST_KIB"] = fmt.Sprint(admTokenKiB)
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = admTokenPeriod
	s.env["FAKEVLLM_TICK"] = "20ms"
	s.logLevel = "info"
	s.skipVLLM = true
	s.extra = fmt.Sprintf(`
[profile]
max_num_seqs = %d
max_num_seqs_factor = 0.9
gpu_memory_utilization = 0.8
min_gpu_memory_utilization = 0.8
headroom = 0.005
[restart]
initial_delay = "200ms"
[gpu]
sample_interval = "%s"
[proxy]
listen = "127.0.0.1:%d"
queue_size = 1024
queue_timeout = "3s"
`, admMaxNumSeqs, admSample, proxyPort)
	return s, fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
}

// outcomes of a load run, by kind.
type admLoad struct {
	ok, refused, refusedNoRetryAfter, cut, other atomic.Int64
}

func (l *admLoad) String() string {
	return fmt.Sprintf("ok %d, refused %d (without Retry-After %d), streams cut %d, other %d",
		l.ok.Load(), l.refused.Load(), l.refusedNoRetryAfter.Load(), l.cut.Load(), l.other.Load())
}

var admBody = func() []byte {
	b, _ := json.Marshal(map[string]any{"model": "test-model", "prompt": strings.Repeat("abcd", admPrompt), "max_tokens": 10, "stream": true})
	return b
}()

// one streams a completion and classifies the outcome.
func (l *admLoad) one(ctx context.Context, c *http.Client, url string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(admBody))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			l.other.Add(1)
		}
		return
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		l.refused.Add(1)
		if resp.Header.Get("Retry-After") == "" {
			l.refusedNoRetryAfter.Add(1)
		}
		return
	case resp.StatusCode != http.StatusOK:
		l.other.Add(1)
		return
	}
	sc := bufio.NewScanner(resp.Body)
	done, failed := false, false
	for sc.Scan() {
		line := sc.Text()
		done = done || line == "data: [DONE]"
		failed = failed || strings.HasPrefix(line, `data: {"error"`)
	}
	switch {
	case ctx.Err() != nil && !done:
		// stopped by the test
	case done && !failed:
		l.ok.Add(1)
	default:
		l.cut.Add(1)
	}
}

// run starts n clients, the i-th after i × ramp / n, each sending request
// after request until stop is closed; it returns when all have ended.
func (l *admLoad) run(url string, n int, ramp time.Duration, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-stop; cancel() }()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ramp > 0 {
				select {
				case <-time.After(ramp * time.Duration(i) / time.Duration(n)):
				case <-ctx.Done():
					return
				}
			}
			for ctx.Err() == nil {
				l.one(ctx, c, url)
			}
		}()
	}
	wg.Wait()
	cancel()
}

type admStatus struct {
	Proxy struct {
		Limit    int    `json:"limit"`
		Inflight int    `json:"inflight"`
		Bound    string `json:"bound"`
		Why      string `json:"bound_reason"`
	} `json:"proxy"`
}

func (s *scene) proxyStatus() admStatus {
	s.t.Helper()
	out, err := exec.Command(bins.guard, "status", "--json", "--socket", filepath.Join(s.dir, "guard.sock")).Output()
	var st admStatus
	if err2 := json.Unmarshal(out, &st); err2 != nil {
		s.t.Fatalf("status --json: %v %v: %s", err, err2, out)
	}
	return st
}

func boundIs(b string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["msg"] == "proxy limit bound changed" && m["bound"] == b }
}

// Clients ramp from 0 to 160 (the point of failure is 118) through the
// proxy of a guard that has never seen this vLLM: the cost model becomes
// confident on the way up, and the memory bound holds admissions below the
// failure point; the rest wait or get 429 with Retry-After. At steady state
// the admitted concurrency is at least 90 % of the true safe concurrency.
func TestAdmissionRampThroughTheProxy(t *testing.T) {
	t.Parallel()
	s, url := admissionScene(t)
	s.start()
	s.waitLog("ready", 1, 30*time.Second, msg("vLLM ready"))
	var load admLoad
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { load.run(url, admClients, 4*time.Second, stop); close(done) }()
	s.waitLog("the memory bound", 1, 40*time.Second, boundIs("memory"))
	// Steady state: every client started and the limit saturated.
	var best admStatus
	for range 30 {
		st := s.proxyStatus()
		if st.Proxy.Inflight > best.Proxy.Inflight {
			best = st
		}
		if best.Proxy.Inflight*10 >= admTrueSafe*9 {
			break
		}
		select {
		case <-s.notify:
		case <-time.After(admSample):
		}
	}
	close(stop)
	<-done
	if n := s.count(field("cause", "oom")); n != 0 {
		t.Fatalf("%d OOMs through the proxy; %s", n, &load)
	}
	if load.cut.Load() != 0 || load.refusedNoRetryAfter.Load() != 0 || load.other.Load() != 0 {
		t.Fatalf("ramp: %s", &load)
	}
	if load.ok.Load() == 0 {
		t.Fatalf("ramp: nothing served: %s", &load)
	}
	if best.Proxy.Inflight*10 < admTrueSafe*9 || best.Proxy.Bound != "memory" {
		t.Fatalf("steady state: %d in flight (limit %d, bound %q: %s), want ≥ 90 %% of the true safe %d",
			best.Proxy.Inflight, best.Proxy.Limit, best.Proxy.Bound, best.Proxy.Why, admTrueSafe)
	}
	t.Logf("ramp: %s; steady state %d in flight of limit %d (true safe %d): %s", &load, best.Proxy.Inflight, best.Proxy.Limit, admTrueSafe, best.Proxy.Why)
}

// A burst of 160 at once after a warm-up that made the model confident: no
// OOM. The model is saved: a restarted guard admits by memory from its
// first request, and the same burst on it runs nothing out of memory either.
func TestAdmissionBurstAfterWarmUp(t *testing.T) {
	t.Parallel()
	s, url := admissionScene(t)
	s.start()
	s.waitLog("ready", 1, 30*time.Second, msg("vLLM ready"))
	var warm admLoad
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { warm.run(url, 60, 2*time.Second, stop); close(done) }()
	s.waitLog("a confident model", 1, 40*time.Second, msgContains("admission cost model confident"))
	close(stop)
	<-done
	burst := func(s *scene, what string) {
		var load admLoad
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { load.run(url, admClients, 0, stop); close(done) }()
		s.waitLog(what+": the memory bound", 1, 30*time.Second, boundIs("memory"))
		// Every client has had a request answered or queued by now; hold
		// the burst for as long as two requests take.
		select {
		case <-s.exited:
		case <-time.After(2 * time.Second):
		}
		close(stop)
		<-done
		if n := s.count(field("cause", "oom")); n != 0 {
			t.Fatalf("%s: %d OOMs; %s", what, n, &load)
		}
		if load.ok.Load() == 0 {
			t.Fatalf("%s: nothing served: %s", what, &load)
		}
		t.Logf("%s: %s", what, &load)
	}
	burst(s, "burst after warm-up")
	s.stopCleanly(15*time.Second, 15*time.Second)
	r := s.restart()
	r.waitLog("ready after the restart", 1, 30*time.Second, msg("vLLM ready"))
	burst(r, "burst on a restarted guard")
}

// A burst on a cold guard may run vLLM out of memory once (nothing was
// learned yet and concurrency rises faster than one sample); after it the
// proxy reopens step by step, learning as it goes, and the next burst runs
// nothing out of memory.
func TestAdmissionBurstOnAColdGuard(t *testing.T) {
	t.Parallel()
	s, url := admissionScene(t)
	s.start()
	s.waitLog("ready", 1, 30*time.Second, msg("vLLM ready"))
	var first admLoad
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { first.run(url, admClients, 0, stop); close(done) }()
	s.waitLog("the OOM", 1, 30*time.Second, field("cause", "oom"))
	s.waitLog("ready after the OOM", 2, 30*time.Second, msg("vLLM ready"))
	close(stop)
	<-done
	var second admLoad
	stop = make(chan struct{})
	done = make(chan struct{})
	go func() { second.run(url, admClients, 0, stop); close(done) }()
	s.waitLog("the memory bound", 1, 40*time.Second, boundIs("memory"))
	select {
	case <-s.exited:
	case <-time.After(2 * time.Second):
	}
	close(stop)
	<-done
	if n := s.count(field("cause", "oom")); n != 1 {
		t.Fatalf("%d OOMs over both bursts, want the first burst's one; first %s; second %s", n, &first, &second)
	}
	if second.ok.Load() == 0 || second.cut.Load() != 0 {
		t.Fatalf("second burst: %s", &second)
	}
	t.Logf("first burst: %s; second: %s", &first, &second)
}
