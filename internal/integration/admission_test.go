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

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
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
	// admNoProgress: a test fails when nothing at all happens for this
	// long (a hung guard), never on how long a step took.
	admNoProgress = 20 * time.Second
	// admWait bounds a wait for one event (the guard ready, the cost model
	// confident): it only ends a test that would never pass.
	admWait = 2 * time.Minute
)

func admissionScene(t *testing.T) (*scene, string) {
	s := newScene(t)
	proxyPort := testkit.FreePort(t)
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
queue_timeout = "30s"
# resume is on, as by default: every stream here is resumable. These tests
# measure how fast the memory bound learns with the race-enabled guard on a
# loaded machine, which the proxy's per-chunk reading of such streams must
# not starve of CPU (docs/measured.md: with each chunk decoded and encoded
# again, the ramp reached 57-81 in flight, not 107).
`, admMaxNumSeqs, admSample, proxyPort)
	return s, fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
}

// outcomes of a load run, by kind.
type admLoad struct {
	ok, refused, refusedNoRetryAfter, cut, other atomic.Int64
	// served is signalled (without blocking) after each request served.
	served chan struct{}
	// started is closed when the last client has started.
	started chan struct{}
}

func newAdmLoad() *admLoad {
	return &admLoad{served: make(chan struct{}, 1), started: make(chan struct{})}
}

// waitServed returns once n more requests have been served since the call,
// or when the guard's events say it stopped (the caller checks why).
func (l *admLoad) waitServed(t *testing.T, s *scene, n int64) {
	t.Helper()
	want := l.ok.Load() + n
	for l.ok.Load() < want {
		select {
		case <-l.served:
		case <-s.Exited():
			return
		case <-time.After(admNoProgress):
			t.Fatalf("no request served for %s (%s)", admNoProgress, l)
		}
	}
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
		select {
		case l.served <- struct{}{}:
		default:
		}
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
	defer c.CloseIdleConnections()
	var wg sync.WaitGroup
	// The ramp is the shape of the load: client i starts at i × ramp / n.
	var tick <-chan time.Time
	if ramp > 0 {
		t := time.NewTicker(ramp / time.Duration(n))
		defer t.Stop()
		tick = t.C
	}
	for i := range n {
		if tick != nil && i > 0 {
			select {
			case <-tick:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l.one(ctx, c, url)
			}
		}()
	}
	close(l.started)
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

func admReady(ev events.Event) bool { return ev.Kind == events.KindReady }

func admOOM(ev events.Event) bool {
	return ev.Kind == events.KindExited && ev.Failure != nil && ev.Failure.Verdict.Cause == "oom"
}

func admExit(ev events.Event) bool { return ev.Kind == events.KindExited }

func confidentMemoryBound(ev events.Event) bool {
	return ev.Kind == events.KindAdmission && ev.Admission.Confident && ev.Admission.Bound == "memory"
}

// loadUntil runs l until until returns (then stops the clients and waits
// for them to end).
func loadUntil(l *admLoad, url string, n int, ramp time.Duration, until func()) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.run(url, n, ramp, stop); close(done) }()
	defer func() { close(stop); <-done }()
	until()
}

// Clients ramp from 0 to 160 (the point of failure is 118) through the
// proxy of a guard that has never seen this vLLM: the cost model becomes
// confident on the way up, and the memory bound holds admissions below the
// failure point; the rest wait in the queue. At steady state the proxy
// admits (its limit, bound by memory) at least 90 % of the true safe
// concurrency and never more; no reading ever has more in flight than
// that. How many of the admitted slots the clients keep filled is the
// machine's speed, not the guard's decision: that figure is measured by
// `make bench-admission`, not asserted here.
func TestAdmissionRampThroughTheProxy(t *testing.T) {
	t.Parallel()
	s, url := admissionScene(t)
	s.start()
	s.WaitEvent("vLLM ready", 1, admWait, admReady)
	load := newAdmLoad()
	var best admStatus
	most := 0
	loadUntil(load, url, admClients, 16*time.Second, func() {
		s.WaitEvent("a confident cost model bounding the proxy", 1, admWait, confidentMemoryBound)
		<-load.started
		// Steady state: every client started; the status after each 20
		// requests served, until the memory bound admits 90 % of the true
		// safe concurrency (or 30 readings show it does not).
		for range 30 {
			load.waitServed(t, s, 20)
			if s.CountEvents(admExit) > 0 {
				return
			}
			st := s.proxyStatus()
			most = max(most, st.Proxy.Inflight)
			if st.Proxy.Bound == "memory" && st.Proxy.Limit > best.Proxy.Limit {
				best = st
			}
			if best.Proxy.Limit*10 >= admTrueSafe*9 {
				return
			}
		}
	})
	if n := s.CountEvents(admExit); n != 0 {
		t.Fatalf("vLLM exited %d times (%d OOMs) through the proxy; %s", n, s.CountEvents(admOOM), load)
	}
	if load.cut.Load() != 0 || load.refusedNoRetryAfter.Load() != 0 || load.other.Load() != 0 || load.ok.Load() == 0 {
		t.Fatalf("ramp: %s", load)
	}
	if best.Proxy.Limit*10 < admTrueSafe*9 || best.Proxy.Limit > admTrueSafe || most > admTrueSafe {
		t.Fatalf("steady state: the memory bound admits %d (%s; %d in flight at most), want ≥ 90 %% of the true safe %d and never more",
			best.Proxy.Limit, best.Proxy.Why, most, admTrueSafe)
	}
	t.Logf("ramp: %s; steady state: limit %d by memory (true safe %d), %d in flight at most: %s", load, best.Proxy.Limit, admTrueSafe, most, best.Proxy.Why)
}

// burst sends 160 clients at once and holds them while 320 requests are
// served (two each); it returns the load's outcome.
func burst(t *testing.T, s *scene, url string) *admLoad {
	t.Helper()
	load := newAdmLoad()
	loadUntil(load, url, admClients, 0, func() {
		<-load.started
		load.waitServed(t, s, 2*admClients)
	})
	return load
}

// A burst of 160 at once after a warm-up that made the model confident: no
// OOM. The model is saved: a restarted guard admits by memory from its
// first request, and the same burst on it runs nothing out of memory either.
func TestAdmissionBurstAfterWarmUp(t *testing.T) {
	t.Parallel()
	s, url := admissionScene(t)
	s.start()
	s.WaitEvent("vLLM ready", 1, admWait, admReady)
	warm := newAdmLoad()
	// Clients arrive one every 100 ms: the model sees 60 levels of
	// concurrency on the way up.
	loadUntil(warm, url, 60, 6*time.Second, func() {
		s.WaitEvent("a confident cost model bounding the proxy", 1, admWait, confidentMemoryBound)
	})
	load := burst(t, s, url)
	if n := s.CountEvents(admExit); n != 0 || load.cut.Load() != 0 || load.ok.Load() == 0 {
		t.Fatalf("burst after warm-up: vLLM exited %d times (%d OOMs); %s", n, s.CountEvents(admOOM), load)
	}
	t.Logf("burst after warm-up: %s", load)
	s.stopCleanly(15*time.Second, 15*time.Second)

	r := s.restart()
	r.WaitEvent("vLLM ready after the restart", 1, admWait, admReady)
	if st := r.proxyStatus(); st.Proxy.Bound != "memory" {
		t.Fatalf("the restarted guard does not admit by memory from its start: bound %q (%s)", st.Proxy.Bound, st.Proxy.Why)
	}
	load = burst(t, r, url)
	if n := r.CountEvents(admExit); n != 0 || load.cut.Load() != 0 || load.ok.Load() == 0 {
		t.Fatalf("burst on the restarted guard: vLLM exited %d times (%d OOMs); %s", n, r.CountEvents(admOOM), load)
	}
	t.Logf("burst on the restarted guard: %s", load)
}

// A burst on a cold guard may run vLLM out of memory once (nothing was
// learned yet and concurrency rises faster than one sample); after it the
// proxy reopens step by step, learning as it goes, and the next burst runs
// nothing out of memory.
func TestAdmissionBurstOnAColdGuard(t *testing.T) {
	t.Parallel()
	s, url := admissionScene(t)
	s.start()
	s.WaitEvent("vLLM ready", 1, admWait, admReady)
	first := newAdmLoad()
	loadUntil(first, url, admClients, 0, func() {
		// Until vLLM ran out of memory and came back, or ten requests a
		// client were served without (the burst did not run it out).
		want := 10 * int64(admClients)
		for {
			changed := s.Changed() // taken before the look: an event after it wakes the wait
			if s.CountEvents(admReady) >= 2 || first.ok.Load() >= want {
				break
			}
			select {
			case <-changed:
			case <-first.served:
			case <-s.Exited():
				return
			case <-time.After(admNoProgress):
				t.Fatalf("nothing happened for %s in the first burst: %s", admNoProgress, first)
			}
		}
	})
	oomsFirst := s.CountEvents(admOOM)
	if n := s.CountEvents(admExit); n > 1 || n != oomsFirst {
		t.Fatalf("first burst: vLLM exited %d times, %d of them OOM; want at most one OOM; %s", n, oomsFirst, first)
	}
	if oomsFirst == 1 {
		s.WaitEvent("vLLM back after the OOM", 2, admWait, admReady)
	}
	second := burst(t, s, url)
	if n := s.CountEvents(admExit); n != oomsFirst || second.cut.Load() != 0 || second.ok.Load() == 0 {
		t.Fatalf("second burst: vLLM exited %d more times (%d OOMs in all); first %s; second %s", n-oomsFirst, s.CountEvents(admOOM), first, second)
	}
	t.Logf("first burst: %s (%d OOM); second: %s", first, oomsFirst, second)
}
