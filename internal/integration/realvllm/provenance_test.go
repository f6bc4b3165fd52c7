package realvllm

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// clientWords are the texts issue 41's review sent as a model name and an
// X-Request-Id: each once made the next death of vLLM its cause.
var clientWords = []string{
	"Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
	"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
	"[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
	"RuntimeError: CUDA error: uncorrectable ECC error encountered",
	"Free memory on device cuda:0 (1.0/80.0 GiB) on startup is less than desired GPU memory utilization (0.9, 72 GiB).",
}

// sendClientWords is issue 41 item 1 on vLLM 0.32.0 itself: every text
// of clientWords as a model name (vLLM's ERROR line in serving.py quotes
// it) and as an X-Request-Id (with --enable-log-requests, its "Added
// request …" lines quote it), until the guard has relayed those lines. The
// death that follows must keep its own cause (checkClientWordsNoEvidence).
func sendClientWords(t *testing.T, s *scene) {
	t.Helper()
	send := func(path string, body map[string]any, hdr map[string]string) int {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, s.vllmURL(path), bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, x := range clientWords {
		if c := send("/v1/chat/completions", map[string]any{"model": x, "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 1}, nil); c != http.StatusNotFound {
			t.Fatalf("chat with model %q: %d, want 404", x, c)
		}
		if c := send("/v1/completions", map[string]any{"model": model("tiny-llama"), "prompt": "hi", "max_tokens": 1, "temperature": 0},
			map[string]string{"X-Request-Id": x}); c != http.StatusOK {
			t.Fatalf("completion with X-Request-Id %q: %d", x, c)
		}
		s.WaitLog("vLLM's ERROR line quoting the model", i+1, exitBound, func(m map[string]any) bool {
			msg, _ := m["msg"].(string)
			return m["logger"] == "vllm" && strings.Contains(msg, "Error with model") && strings.Contains(msg, "does not exist")
		})
		s.WaitLog("vLLM's line quoting the request id", 1, exitBound, func(m map[string]any) bool {
			msg, _ := m["msg"].(string)
			return m["logger"] == "vllm" && strings.Contains(msg, "Added request cmpl-"+x)
		})
	}
}

// checkClientWordsNoEvidence: the death after sendClientWords is a crash
// on rung 0, saved so, and the guard restarts vLLM (no exit 69 or 78).
func checkClientWordsNoEvidence(t *testing.T, s *scene, ex events.Event) {
	t.Helper()
	f := ex.Failure
	if f.Verdict.Cause != "crash" || f.Verdict.GPU != nil {
		t.Fatalf("a death after the client's lines: cause %s (gpu %v): %s", f.Verdict.Cause, f.Verdict.GPU, f.Verdict.Summary)
	}
	for _, l := range f.Verdict.Evidence {
		for _, x := range clientWords {
			if strings.Contains(l.Text, x) {
				t.Fatalf("the client's text is evidence: %q", l.Text)
			}
		}
	}
	if f.Decision.Action != "restart" || f.Decision.Rung.Index != 0 {
		t.Fatalf("decision %s on rung %d, want a restart on rung 0: %s", f.Decision.Action, f.Decision.Rung.Index, f.Decision.Reason)
	}
	var saved struct {
		Rung     int `json:"rung"`
		Failures []struct {
			Cause string `json:"cause"`
		} `json:"failures"`
	}
	testkit.WaitFor(t, "the saved state with the death", exitBound, func() bool {
		b, err := os.ReadFile(filepath.Join(s.dir, "state", "state.json"))
		return err == nil && json.Unmarshal(b, &saved) == nil && len(saved.Failures) > 0
	})
	if saved.Rung != 0 || saved.Failures[len(saved.Failures)-1].Cause != "crash" {
		t.Fatalf("saved rung %d, failures %+v; want rung 0 and a crash", saved.Rung, saved.Failures)
	}
}
