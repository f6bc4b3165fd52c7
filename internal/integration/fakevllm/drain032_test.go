package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// v1Drain is the newest era (vLLM 0.32.0) with a token pace that lets a
// long stream outlive any cut the tests choose.
func v1Drain(cut string) map[string]string {
	return merge(fast, map[string]string{"FAKEVLLM_ERA": "v1", "FAKEVLLM_TOKEN_INTERVAL": "20ms", "FAKEVLLM_DRAIN_CUT": cut})
}

// restLines reads what is left of a stream, every line as sent.
func restLines(br *bufio.Reader) (lines []string) {
	for {
		line, err := br.ReadString('\n')
		if s := strings.TrimRight(line, "\n"); s != "" {
			lines = append(lines, s)
		}
		if err != nil {
			return lines
		}
	}
}

// inOrder checks that the lines of one stream containing each of want
// appear in that order.
func inOrder(t *testing.T, p *simProc, stream string, want ...string) {
	t.Helper()
	i := 0
	for _, l := range p.snapshot() {
		if i < len(want) && l.stream == stream && strings.Contains(l.text, want[i]) {
			i++
		}
	}
	if i < len(want) {
		t.Errorf("on %s, no %q after %q (want, in order: %q)", stream, want[i], want[max(0, i-1)], want)
	}
}

func countLines(p *simProc, substr string) int {
	n := 0
	for _, l := range p.snapshot() {
		if strings.Contains(l.text, substr) {
			n++
		}
	}
	return n
}

// vLLM 0.32.0 as observed: during the drain a new request fails at once
// with a 500 (not a 200 abort, not a 503), whatever its endpoint.
func TestDrain032NewRequestsAre500(t *testing.T) {
	t.Parallel()
	// The cut never comes within the test: the stream keeps the drain open.
	p, url := startReady(t, v1Drain("1h"), "org/model", "--shutdown-timeout", "3600", "--api-key", "k")
	hdr := bearer("k")
	b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 3000, "stream": true})
	req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer k")
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	p.signal(syscall.SIGTERM)
	p.waitLine("[core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM", 10*time.Second)
	const want = `{"error":{"message":"cannot schedule new futures after shutdown","type":"InternalServerError","param":null,"code":500}}`
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"late","max_tokens":1}`},
		{"/v1/completions", `{"prompt":"late","max_tokens":1,"stream":true}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`},
		{"/tokenize", `{"prompt":"hello"}`},
	} {
		if code, body := do(t, "POST", url+c.path, c.body, hdr); code != 500 || body != want {
			t.Errorf("POST %s %s during the drain: %d %s, want 500 %s", c.path, c.body, code, body, want)
		}
	}
	// The API key is still checked first; /health still answers.
	if code, _ := do(t, "POST", url+"/v1/completions", `{"prompt":"late"}`, nil); code != 401 {
		t.Errorf("without the key during the drain: %d, want 401", code)
	}
	if code, _ := do(t, "GET", url+"/health", "", nil); code != 200 {
		t.Errorf("/health during the drain: %d, want 200", code)
	}
}

// Requests in flight run for FAKEVLLM_DRAIN_CUT, then a stream gets the
// engine's error event and [DONE], a plain request a 500; the server
// logs vLLM 0.32.0's shutdown lines and exits 0; a second SIGTERM is
// ignored.
func TestDrain032CutsWhatIsInFlight(t *testing.T) {
	t.Parallel()
	p, url := startReady(t, v1Drain("300ms"), "org/model", "--shutdown-timeout", "60")
	// 3000 tokens at 20 ms each cannot end before a 300 ms cut.
	_, br := streamReq(t, url, 3000)
	plain := make(chan [2]any, 1)
	go func() {
		resp, err := httpClient().Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":3000}`))
		if err != nil {
			plain <- [2]any{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		var b strings.Builder
		bufio.NewReader(resp.Body).WriteTo(&b)
		plain <- [2]any{resp.StatusCode, b.String()}
	}()
	testkit.WaitFor(t, "both requests running", 30*time.Second, func() bool {
		_, m := do(t, "GET", url+"/metrics", "", nil)
		return runningIs(m, "2.0")
	})
	p.signal(syscall.SIGTERM)
	p.waitLine("[shutdown] EngineCore: trigger received signal=SIGTERM", 10*time.Second)
	p.signal(syscall.SIGTERM) // a second signal: ignored

	lines := restLines(br)
	wantEvent := `data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", "type": "InternalServerError", "param": null, "code": 500}}`
	if n := len(lines); n < 2 || lines[n-2] != wantEvent || lines[n-1] != "data: [DONE]" {
		t.Errorf("the stream in flight ended with %q, want %q then data: [DONE]", lines[max(0, len(lines)-2):], wantEvent)
	}
	got := <-plain
	wantBody := `{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}`
	if got[0] != 500 || got[1] != wantBody {
		t.Errorf("the plain request in flight: %v %v, want 500 %s", got[0], got[1], wantBody)
	}
	if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
		t.Errorf("exit %v, want 0", st)
	}
	p.waitOutputEnd(10 * time.Second)
	inOrder(t, p, "stdout",
		"[launcher.py:254] [shutdown] API server: shutdown triggered",
		"[launcher.py:270] [shutdown] API server: stopping engine client mode=drain timeout=60s",
		"[core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM",
		"[shutdown] Executor: waiting for worker exit count=0",
		"[shutdown] MPClient: complete",
		"[shutdown] API server: engine client stopped")
	inOrder(t, p, "stderr", "INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
		"INFO:     Application shutdown complete.", "INFO:     Finished server process [")
	if n := countLines(p, "shutdown triggered"); n != 1 {
		t.Errorf("%d shutdown triggered lines, want 1 (a second signal is ignored)", n)
	}
	for _, l := range p.snapshot() {
		if strings.Contains(l.text, "[shutdown] API server:") && !strings.HasPrefix(l.text, "(APIServer pid=") ||
			strings.Contains(l.text, "[shutdown] EngineCore:") && !strings.HasPrefix(l.text, "(EngineCore") {
			t.Errorf("line %q lacks its process prefix", l.text)
		}
		if strings.Contains(l.text, "[shutdown]") && !strings.Contains(l.text, " INFO ") {
			t.Errorf("line %q is not INFO", l.text)
		}
	}
}

// runningIs reports whether vllm:num_requests_running has value v.
func runningIs(metrics, v string) bool {
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "vllm:num_requests_running{") {
			return strings.HasSuffix(l, " "+v)
		}
	}
	return false
}

// A request that ends within the cut completes normally.
func TestDrain032LetsAShortStreamFinish(t *testing.T) {
	t.Parallel()
	p, url := startReady(t, v1Drain("1h"), "org/model", "--shutdown-timeout", "30")
	_, br := streamReq(t, url, 40)
	p.signal(syscall.SIGTERM)
	lines := restLines(br)
	events := 0
	for _, l := range lines {
		if strings.Contains(l, `"error"`) {
			t.Errorf("error event %q in a stream that ended within the cut", l)
		}
		if strings.HasPrefix(l, "data: {") {
			events++
		}
	}
	if events != 39 || len(lines) == 0 || lines[len(lines)-1] != "data: [DONE]" {
		t.Errorf("the stream in flight: %d more events, last %q; want 39 and data: [DONE]", events, lines[max(0, len(lines)-1):])
	}
	if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
		t.Errorf("exit %v, want 0", st)
	}
	if !p.has("[shutdown] API server: shutdown triggered") {
		t.Error("no shutdown triggered line")
	}
}

// /tokenize and /detokenize are common routes, open without the key.
func TestTokenize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, model string }{{"generative", "org/model"}, {"pooling", "org/bge-small"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1"}), c.model, "--api-key", "k", "--served-model-name", "m")
			code, body := do(t, "POST", url+"/tokenize", `{"model":"m","prompt":"hello world, how are you"}`, nil)
			var tok struct {
				Count       int    `json:"count"`
				MaxModelLen int    `json:"max_model_len"`
				Tokens      []int  `json:"tokens"`
				TokenStrs   *[]any `json:"token_strs"`
			}
			if err := json.Unmarshal([]byte(body), &tok); code != 200 || err != nil {
				t.Fatalf("POST /tokenize: %d %s (%v), want 200", code, body, err)
			}
			if tok.Count != 6 || len(tok.Tokens) != tok.Count || tok.MaxModelLen != 4096 || tok.TokenStrs != nil || !strings.Contains(body, `"token_strs":null`) {
				t.Errorf("POST /tokenize: %s, want count 6, six tokens, max_model_len 4096, token_strs null", body)
			}
			ids, _ := json.Marshal(tok.Tokens)
			code, body = do(t, "POST", url+"/detokenize", `{"model":"m","tokens":`+string(ids)+`}`, nil)
			var de struct {
				Prompt *string `json:"prompt"`
			}
			if err := json.Unmarshal([]byte(body), &de); code != 200 || err != nil || de.Prompt == nil || *de.Prompt == "" {
				t.Errorf("POST /detokenize: %d %s, want 200 with a prompt", code, body)
			}
			if code, _ := do(t, "POST", url+"/tokenize", `{"model":"other","prompt":"x"}`, nil); code != 404 {
				t.Errorf("POST /tokenize for another model: %d, want 404", code)
			}
		})
	}
}
