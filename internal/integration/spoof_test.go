package integration

// Issue 32 item 2: no client field is evidence. vLLM's uvicorn trusts
// 127.0.0.1 and prints X-Forwarded-For's client in its access line (the
// simulator does as it does); a client that wrote vLLM's OOM there once
// made the next crash an `oom` (rung down, limits cut).

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

const spoofedXFF = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB, 127.0.0.1"

func TestSpoofedForwardedForIsNeverEvidence(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	proxyPort := testkit.FreePort(t)
	s.extra = fmt.Sprintf("\n[restart]\ninitial_delay = \"100ms\"\n\n[proxy]\nlisten = \"127.0.0.1:%d\"\n", proxyPort)
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)

	post := func(base, path string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader([]byte(`{"model": "test-model", "prompt": "hi", "max_tokens": 1}`)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", spoofedXFF)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s%s: %d", base, path, resp.StatusCode)
		}
	}
	// Through the proxy the client's header is dropped: vLLM sees the
	// proxy's X-Forwarded-For, 127.0.0.1, and prints that.
	post(fmt.Sprintf("http://127.0.0.1:%d", proxyPort), "/v1/completions")
	s.WaitLog("the proxied request's access line", 1, 30*time.Second, msgContains(`127.0.0.1:0 - "POST /v1/completions HTTP/1.1" 200`))
	if n := s.CountLogs(msgContains("CUDA out of memory")); n != 0 {
		t.Errorf("the client's X-Forwarded-For went through the proxy: %d lines of vLLM's log carry it", n)
	}
	// Straight at vLLM from this host the access line carries the text.
	post(fmt.Sprintf("http://127.0.0.1:%d", s.port), "/v1/completions")
	s.WaitLog("the spoofed access line", 1, 30*time.Second, msgContains(`Tried to allocate 20.00 MiB:0 - "POST /v1/completions HTTP/1.1" 200`))

	// Then vLLM dies: a crash, not an OOM, and the rung stays.
	if err := syscall.Kill(ready.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e := s.WaitEvent("vLLM's death", 1, 30*time.Second, isExited)
	if c := e.Failure.Verdict.Cause; c == "oom" {
		t.Errorf("the death after a spoofed access line was classified oom: %s", verdictText(e))
	}
	if strings.Contains(verdictText(e), "CUDA out of memory") {
		t.Errorf("a client's access line is evidence: %s", verdictText(e))
	}
	s.WaitEvent("ready after the restart", 2, 60*time.Second, isReady)
	if l := s.WaitEvent("the relaunch", 2, time.Second, isStarting); rungOf(l) != 0 {
		t.Errorf("relaunched on rung %d; want 0 (a crash steps no rung down)", rungOf(l))
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}
