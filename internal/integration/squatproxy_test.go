package integration

import (
	"fmt"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// Issue 40 item 2: the proxy's own connections reach vLLM's listener only.
// After a death, a process that takes vLLM's port during the restart gets
// no client's request through the proxy (no key, no prompt): a pass-through
// request is answered 503 by the guard, an inference request is held, and
// both are served once vLLM is back on its own listener.
func TestSquatterOnVLLMsPortGetsNoClientRequestThroughTheProxy(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	const key = "sk-client-40"
	withKey(s, key)
	portWait(s, "1s")
	proxyPort := testkit.FreePort(t)
	s.extra = fmt.Sprintf("\n[restart]\ninitial_delay = \"2s\"\n[proxy]\nlisten = \"127.0.0.1:%d\"\n", proxyPort)
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)
	if err := syscall.Kill(ready.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("the backoff after the crash", 1, 30*time.Second, inState("backoff"))
	q := listenSquatter(t, "tcp4", "127.0.0.1:"+strconv.Itoa(s.port))
	pid := strconv.Itoa(os.Getpid())
	s.WaitEvent("the wait for the port", 1, 30*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindState && strings.Contains(e.Reason, "is held by pid "+pid)
	})

	base := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
	ask := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// A pass-through request with the client's key: answered by the
	// guard, never by the listener on the port.
	if code, body := ask(http.MethodGet, "/v1/models", ""); code != http.StatusServiceUnavailable {
		t.Errorf("GET /v1/models while another process holds vLLM's port: %d %q, want the guard's 503", code, body)
	}
	// An inference request: held while vLLM is away.
	const prompt = `{"model": "test-model", "prompt": "the squatter must not read this", "max_tokens": 2}`
	type answer struct {
		code int
		body string
	}
	held := make(chan answer, 1)
	go func() {
		code, body := ask(http.MethodPost, "/v1/completions", prompt)
		held <- answer{code, body}
	}()
	s.Until("the request held (Awaiting or queued at the proxy)", 30*time.Second, func() bool {
		d := statusDoc(t, s)
		return (d.Proxy != nil && d.Proxy.Held+d.Proxy.Queued > 0) || len(q.requests()) > 0
	})
	if got := q.requests(); len(got) != 0 {
		t.Fatalf("the listener on vLLM's port got clients' requests: %q", got)
	}
	q.close()
	s.WaitEvent("ready again on vLLM's own listener", 2, 60*time.Second, isReady)
	if a := <-held; a.code != http.StatusOK {
		t.Fatalf("the held request: %d %q, want vLLM's answer once it is back", a.code, a.body)
	}
	if got := q.requests(); len(got) != 0 {
		t.Fatalf("the listener on vLLM's port got clients' requests: %q", got)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}
