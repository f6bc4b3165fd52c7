package control

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

func get(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func TestHTTPEndpoints(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "vllm_guard_ready 1\n")
	})
	s, err := ListenHTTP("127.0.0.1:0", NewHTTPHandler(b, metrics), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := "http://" + s.Addr().String()

	if code, body := get(t, "GET", base+"/livez"); code != 200 || body != "ok\n" {
		t.Errorf("/livez alive: %d %q", code, body)
	}
	if code, body := get(t, "GET", base+"/readyz"); code != 200 || !strings.Contains(body, `"state":"ready"`) {
		t.Errorf("/readyz ready: %d %s", code, body)
	}

	// Loading: alive, not ready; /readyz says why.
	b.setState(status.StateStarting, "loading weights")
	if code, _ := get(t, "GET", base+"/livez"); code != 200 {
		t.Errorf("/livez while vLLM loads: %d, want 200", code)
	}
	code, body := get(t, "GET", base+"/readyz")
	var r Readiness
	if err := json.Unmarshal([]byte(body), &r); code != 503 || err != nil || r.State != status.StateStarting || r.Reason != "loading weights" {
		t.Errorf("/readyz while loading: %d %s (%v)", code, body, err)
	}
	var raw map[string]any
	json.Unmarshal([]byte(body), &raw)
	if len(raw) != 2 || raw["state"] == nil || raw["reason"] == nil {
		t.Errorf("/readyz body %s: want exactly {state, reason}", body)
	}

	// Gave up: not alive, even though the loop runs.
	b.setState(status.StateFailed, "crash loop: 10 failed starts in 1h")
	if code, body := get(t, "GET", base+"/livez"); code != 503 || !strings.Contains(body, "gave up: crash loop") {
		t.Errorf("/livez after giving up: %d %q", code, body)
	}
	b.setState(status.StateBackoff, "after crash: backoff 5s")
	if code, _ := get(t, "GET", base+"/livez"); code != 200 {
		t.Errorf("/livez in backoff: %d, want 200", code)
	}

	// A wedged loop: not alive.
	b.mu.Lock()
	b.alive, b.why = false, "main loop has not ticked for 45s"
	b.mu.Unlock()
	if code, body := get(t, "GET", base+"/livez"); code != 503 || !strings.Contains(body, "main loop has not ticked for 45s") {
		t.Errorf("/livez wedged: %d %q", code, body)
	}

	if code, body := get(t, "GET", base+"/status"); code != 200 {
		t.Errorf("/status: %d", code)
	} else if d, err := DecodeDoc(strings.NewReader(body)); err != nil || d.Version != "v0.4.0" {
		t.Errorf("/status document: %v %+v", err, d.Version)
	}
	if code, body := get(t, "GET", base+"/metrics"); code != 200 || body != "vllm_guard_ready 1\n" {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, _ := get(t, "POST", base+"/readyz"); code != 405 {
		t.Errorf("POST /readyz: %d, want 405", code)
	}
	if code, _ := get(t, "HEAD", base+"/livez"); code != 503 {
		t.Errorf("HEAD /livez: %d, want the GET answer", code)
	}
	// Actions are the socket's alone.
	if code, _ := get(t, "POST", base+"/restart"); code != 404 {
		t.Errorf("POST /restart over HTTP: %d, want 404", code)
	}
}

func TestHTTPNoMetricsHandler(t *testing.T) {
	s, err := ListenHTTP("127.0.0.1:0", NewHTTPHandler(newFakeBackend(status.StateReady), nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if code, _ := get(t, "GET", "http://"+s.Addr().String()+"/metrics"); code != 404 {
		t.Errorf("/metrics with no handler: %d", code)
	}
}
