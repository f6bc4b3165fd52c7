package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The memory of a running request, the vLLM counters that say what runs,
// and a burst that runs the engine out of memory as the requests arrive.
//
// The arithmetic, on a 16 GiB device (512 MiB reserved) with the API
// process's 256 MiB and utilization 0.9 (a 14.4 GiB budget): 870.4 MiB
// above the budget. A request of 2 000 prompt tokens running costs
// 100 MiB + 2 000 × 16 KiB = 131.25 MiB: 6 fit (787.5 MiB), the 7th does not.
const (
	burstSeqMiB   = 100
	burstTokenKiB = 16
	burstPrompt   = 2000
	burstSafe     = 6
)

func burstEnv(dir string) map[string]string {
	return merge(fast, map[string]string{
		"FAKENVML_STATE":          dir,
		"FAKEVLLM_WEIGHTS_GIB":    "2",
		"FAKEVLLM_SEQ_COST_MIB":   fmt.Sprint(burstSeqMiB),
		"FAKEVLLM_TOKEN_COST_KIB": fmt.Sprint(burstTokenKiB),
		// Tokens come slowly: every request stays running for the test.
		"FAKEVLLM_TOKEN_INTERVAL": "50ms",
		// The periodic recomputation is off (an hour): only the requests
		// themselves can move the engine's memory. A burst that runs it
		// out of memory in this test does so as the requests are
		// admitted, never at a later tick — so within any GPU sampling
		// interval of the guard.
		"FAKEVLLM_TICK": "1h",
	})
}

// openStream starts a streaming completion of burstPrompt tokens and
// returns once its first token arrived (the prefill ran), with the body
// to close. It reports false when the stream ended before a first token.
func openStream(ctx context.Context, url string) (*http.Response, bool) {
	b, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("abcd", burstPrompt), "max_tokens": 2000, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(string(b)))
	// No client timeout: the stream is meant to outlive the test's steps.
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return nil, false
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			resp.Body.Close()
			return nil, false
		}
		if strings.HasPrefix(line, "data: {") && strings.Contains(line, `"choices"`) {
			return resp, true
		}
	}
}

func TestRunningRequestsMoveMemoryAndCounters(t *testing.T) {
	t.Parallel()
	dir := stateDir(t, 16*gib)
	p, url := startReady(t, burstEnv(dir), "org/model", "--max-num-seqs", "64")
	_, l := p.waitLine("Model loading took", 10*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	budget := memModel{Total: 16 * gib, Util: 0.9}.budget()
	perRequest := int64(burstSeqMiB*mib + burstPrompt*burstTokenKiB*kib)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 1; i <= burstSafe; i++ {
		resp, ok := openStream(ctx, url)
		if !ok {
			t.Fatalf("request %d ended before its first token:\n%s", i, p.dump())
		}
		defer resp.Body.Close()
		// Each admitted request adds its memory at once (the tick is off).
		want := budget + int64(i)*perRequest
		testkit.WaitFor(t, fmt.Sprintf("the engine to hold budget + %d requests", i), 30*time.Second, func() bool {
			m, ok := readProc(t, dir, engine)
			return ok && m[0] == want
		})
		if v := metricValue(t, url, "vllm:num_requests_running"); v != float64(i) {
			t.Errorf("%d requests streaming: vllm:num_requests_running %v", i, v)
		}
		if v := metricValue(t, url, "vllm:prompt_tokens_total"); v != float64(i*burstPrompt) {
			t.Errorf("%d requests prefilled: vllm:prompt_tokens_total %v, want %d", i, v, i*burstPrompt)
		}
	}
	// None has finished: the per-request histogram has no observation yet.
	if v := metricValue(t, url, "vllm:request_prompt_tokens_count"); v != 0 {
		t.Errorf("vllm:request_prompt_tokens_count %v before any request finished", v)
	}
	if p.has("OutOfMemoryError") {
		t.Fatalf("the engine ran out of memory with %d requests, which fit", burstSafe)
	}
}

func TestFinishedRequestsFillThePromptHistogram(t *testing.T) {
	t.Parallel()
	_, url := startReady(t, fast, "org/model")
	for _, prompt := range []string{strings.Repeat("abcd", 3), strings.Repeat("abcd", 700)} {
		resp := postJSON(t, url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2})
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("completion: status %d", resp.StatusCode)
		}
	}
	for name, want := range map[string]float64{
		"vllm:request_prompt_tokens_count":                                                 2,
		"vllm:request_prompt_tokens_sum":                                                   703,
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="org/model",le="2.0"}`:    0,
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="org/model",le="5.0"}`:    1,
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="org/model",le="500.0"}`:  1,
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="org/model",le="1000.0"}`: 2,
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="org/model",le="+Inf"}`:   2,
		"vllm:prompt_tokens_total":                                                         703,
	} {
		if got := metricSeries(t, url, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// metricSeries is the value of one exact series (name with its labels),
// or of the first series of a name given without labels.
func metricSeries(t *testing.T, url, series string) float64 {
	t.Helper()
	if !strings.Contains(series, "{") {
		return metricValue(t, url, series)
	}
	resp, err := httpClient().Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("series %s: value %q: %v", series, v, err)
			}
			return f
		}
	}
	t.Fatalf("series %s not in /metrics", series)
	return 0
}

// A burst of 3 × the safe concurrency at once from idle: the engine runs
// out of memory while the requests are admitted, with the periodic tick
// off — nothing smooths the rise.
func TestBurstRunsOutOfMemoryAsRequestsArrive(t *testing.T) {
	t.Parallel()
	dir := stateDir(t, 16*gib)
	p, url := startReady(t, burstEnv(dir), "org/model", "--max-num-seqs", "64")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	start := time.Now()
	for range 3 * burstSafe {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, ok := openStream(ctx, url); ok {
				resp.Body.Close()
			}
		}()
	}
	_, oom := p.waitLine("torch.OutOfMemoryError: CUDA out of memory.", 20*time.Second)
	t.Logf("burst of %d (safe %d): out of memory %s after the first request was sent (the guard samples every 1s by default)",
		3*burstSafe, burstSafe, time.Since(start).Round(time.Millisecond))
	if oom.stream != "stderr" {
		t.Errorf("OOM line on %s: %q", oom.stream, oom.text)
	}
	p.waitLine("EngineCore encountered a fatal error.", 10*time.Second)
}
