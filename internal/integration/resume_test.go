package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Issue 30 through the real guard: vLLM dies of an OOM (the simulator's
// NCCL out of memory at runtime, once) while non-streaming requests are in
// flight through the proxy, and more requests come while it reloads. Every
// one of them gets one 200: those in flight are sent again once vLLM is
// back, those that came meanwhile are held past queue_timeout.
func TestNoClientSeesAnOOM(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	proxyPort := testkit.FreePort(t)
	s.env["FAKEVLLM_FAULT"] = "nccl_oom_after=2s"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "oom-fired")
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "20ms" // 200 tokens: 4 s, past the OOM
	s.env["FAKEVLLM_LOAD_WEIGHTS"] = "3s"     // the reload outlasts the second wave's sending
	s.extra = fmt.Sprintf(`
[restart]
initial_delay = "300ms"
[proxy]
listen = "127.0.0.1:%d"
queue_timeout = "1s"
`, proxyPort)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)

	url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", proxyPort)
	client := &http.Client{Timeout: 2 * time.Minute}
	type answer struct {
		wave, code int
		body       string
		err        error
	}
	answers := make(chan answer, 8)
	send := func(wave int) {
		go func() {
			resp, err := client.Post(url, "application/json",
				strings.NewReader(`{"model":"test-model","prompt":"hello there","max_tokens":200}`))
			if err != nil {
				answers <- answer{wave: wave, err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers <- answer{wave: wave, code: resp.StatusCode, body: string(b), err: err}
		}()
	}
	for range 4 {
		send(1) // in flight at the OOM
	}
	s.WaitEvent("vLLM's death", 1, 60*time.Second, isExited)
	for range 4 {
		send(2) // while vLLM reloads
	}
	for range 8 {
		a := <-answers
		if a.err != nil || a.code != http.StatusOK || !strings.Contains(a.body, `"choices"`) {
			t.Errorf("wave %d: %d %q (err %v); want one 200 with the completion", a.wave, a.code, a.body, a.err)
		}
	}
	if n := s.CountEvents(isReady); n < 2 {
		t.Fatalf("%d ready events; want the restart after the OOM", n)
	}
	out, err := exec.Command(bins.guard, "status", "--json", "--socket", filepath.Join(s.dir, "guard.sock")).Output()
	var doc struct {
		Proxy *struct {
			Resumed  uint64            `json:"resumed"`
			Rejected uint64            `json:"rejected"`
			By       map[string]uint64 `json:"rejected_by_reason"`
		} `json:"proxy"`
	}
	if json.Unmarshal(out, &doc); doc.Proxy == nil || doc.Proxy.Resumed < 1 || doc.Proxy.Rejected != 0 {
		t.Fatalf("status (%v): %s; want requests resumed, none refused", err, out)
	}
	// The incident record of the OOM says what became of the requests it
	// touched, once they have all finished: the four in flight replayed,
	// those that came while vLLM reloaded served after the hold.
	req := waitIncidentRequests(t, s)
	if req.Pending != 0 || req.NonStreaming == nil || req.NonStreaming.Touched != 4 || req.NonStreaming.Replayed != 4 ||
		req.Replayed+req.ServedAfterHold != req.Touched || req.Touched < 4 ||
		(req.ArrivedWhileDown != nil && req.ArrivedWhileDown.ServedAfterHold != req.ArrivedWhileDown.Touched) {
		t.Fatalf("the OOM's record: requests %+v; want the 4 in flight replayed, every arrival served after the hold, nothing pending", req)
	}
}

// waitIncidentRequests waits for the one incident record on disk to hold
// what became of the requests its death touched (the guard rewrites the
// record once the last of them has finished).
func waitIncidentRequests(t *testing.T, s *scene) state.DeathRequests {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(s.dir, "state", "incidents", "*.json"))
		if len(files) > 1 {
			t.Fatalf("incident records %v; want one", files)
		}
		if len(files) == 1 {
			var inc state.Incident
			b, err := os.ReadFile(files[0])
			if err == nil {
				err = json.Unmarshal(b, &inc)
			}
			if err != nil {
				t.Fatalf("incident record %s: %v (read mid-write?)", files[0], err)
			}
			if inc.Requests != nil {
				return *inc.Requests
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no account of the OOM's requests in its incident record after 60 s")
		}
	}
}

// One giant request that runs vLLM out of memory on every start is sent
// twice, then refused with an error that says why (resume_limit 2), the
// incident record names it, and vLLM serves everyone else.
func TestGiantRequestSentTwiceThenRefused(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	proxyPort := testkit.FreePort(t)
	// 8 MiB a prompt token: a 3,000-token prompt needs 24 GiB, more than
	// the room of any rung the two deaths reach; a short one 24 MiB.
	s.env["FAKEVLLM_TOKEN_COST_KIB"] = "8192"
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "20ms" // the giant is in flight when the engine counts its prompt
	s.extra = fmt.Sprintf(`
[restart]
initial_delay = "300ms"
[proxy]
listen = "127.0.0.1:%d"
`, proxyPort)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", proxyPort)
	client := &http.Client{Timeout: 2 * time.Minute}
	post := func(prompt string) (int, string) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 50})
		resp, err := client.Post(url, "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := post(strings.Repeat("abcd", 3000))
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "resume_limit") {
		t.Fatalf("the giant request: %d %q; want 422 naming resume_limit", code, body)
	}
	// The proxy sees a death as its connection closes, before the guard's
	// exit event: wait for the second, then the restart after it.
	s.WaitEvent("the second death", 2, 60*time.Second, isExited)
	s.WaitEvent("ready after the second death", 3, 60*time.Second, isReady)
	if code, body := post("hello there"); code != http.StatusOK {
		t.Fatalf("a short request after the giant: %d %q; want 200", code, body)
	}
	if n := s.CountEvents(isExited); n != 2 {
		t.Fatalf("%d deaths of vLLM; want 2 (the giant sent twice, not a third time)", n)
	}
	out, _ := exec.Command(bins.guard, "status", "--json", "--socket", filepath.Join(s.dir, "guard.sock")).Output()
	var doc struct {
		Proxy *struct {
			LastSuspect *struct {
				BodyBytes int64 `json:"body_bytes"`
				Deaths    int   `json:"deaths"`
			} `json:"last_suspect"`
		} `json:"proxy"`
		LastIncident *struct {
			Suspects []struct {
				BodyBytes int64 `json:"body_bytes"`
			} `json:"suspect_requests"`
		} `json:"last_incident"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || doc.Proxy == nil || doc.Proxy.LastSuspect == nil || doc.Proxy.LastSuspect.Deaths != 2 {
		t.Fatalf("status (%v): %s; want the suspect request named", err, out)
	}
	if doc.LastIncident == nil || len(doc.LastIncident.Suspects) != 1 {
		t.Fatalf("the last incident does not name the suspect request: %s", out)
	}
}
