package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Issue 42: the guard owns vLLM's life, so a client of the proxy never
// reaches vLLM's sleep, wake, pause, weight or profiler routes, however it
// spells them, while vLLM itself (in dev mode, as a sleeping standby runs)
// serves them on its own port. Inference through the proxy goes on.
func TestClientsCannotSleepOrWakeVLLMThroughTheProxy(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["VLLM_SERVER_DEV_MODE"] = "1"
	proxyPort := testkit.FreePort(t)
	s.extra = fmt.Sprintf("\n[proxy]\nlisten = \"127.0.0.1:%d\"\n", proxyPort)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)

	ask := func(base, method, path string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	vllm := fmt.Sprintf("http://127.0.0.1:%d", s.port)
	proxy := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
	// The oracle: vLLM in dev mode serves the route on its own port.
	if code, body := ask(vllm, http.MethodGet, "/is_sleeping"); code != http.StatusOK || !strings.Contains(body, `"is_sleeping":false`) {
		t.Fatalf("vLLM's own GET /is_sleeping: %d %q, want 200 and awake (the simulator's dev mode)", code, body)
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, "/sleep?level=1"},
		{http.MethodPost, "/wake_up"},
		{http.MethodPost, "//sleep"},
		{http.MethodPost, "/v1/../sleep"},
		{http.MethodPost, "/%73leep"},
		{"post", "/sleep/"},
		{http.MethodPost, "/SLEEP"},
		{http.MethodPost, "/collective_rpc"},
		{http.MethodPost, "/pause"},
		{http.MethodPost, "/update_weights"},
		{http.MethodPost, "/reset_prefix_cache"},
		{http.MethodPost, "/start_profile"},
		{http.MethodGet, "/is_sleeping"},
	} {
		code, body := ask(proxy, c.method, c.path)
		if code != http.StatusForbidden || !strings.Contains(body, "vllm-guard owns") {
			t.Errorf("%s %s through the proxy: %d %q, want the guard's 403", c.method, c.path, code, body)
		}
	}
	// Nothing reached vLLM: it is awake and serves through the proxy.
	if code, body := ask(vllm, http.MethodGet, "/is_sleeping"); !strings.Contains(body, `"is_sleeping":false`) {
		t.Fatalf("vLLM after the refused requests: %d %q, want awake", code, body)
	}
	req, _ := http.NewRequest(http.MethodPost, proxy+"/v1/completions",
		strings.NewReader(`{"model":"test-model","prompt":"still served","max_tokens":2}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a completion through the proxy after the refusals: %d, want 200", resp.StatusCode)
	}
	if d := statusDoc(t, s); d.Proxy == nil || d.Proxy.RejectedBy["operator_route"] != 13 {
		t.Errorf("status's rejected_by_reason: %+v, want operator_route 13", d.Proxy)
	}
}
