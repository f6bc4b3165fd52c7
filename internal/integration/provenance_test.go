package integration

// Issue 41 item 1: vLLM quotes its clients in its own lines. A model named
// "Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus." made the
// next SIGKILL a gpu_fault (give up, exit 69, and systemd's
// RestartPreventExitStatus kept it down); a model named after a CUDA OOM
// stepped the rung down and saved it; "[Errno 98] … address already in
// use" gave exit 78; an X-Request-Id did the same through "Added request
// …". Through the running guard over the simulator (which prints those
// lines as vLLM 0.32.0 does), for every line family a client reaches,
// hostile and random contents leave the cause of a SIGKILL a crash, the
// rung and the saved state as they were, and the guard running.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// causeWords are every cause's signature words, as vLLM, PyTorch, NCCL,
// the kernel and the libraries print them, and whole lines of each.
var causeWords = []string{
	"Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
	"NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE (double bit error)",
	"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
	"RuntimeError: CUDA error: out of memory",
	"Cuda failure 2 'out of memory'",
	"[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
	"OSError: [Errno 98] Address already in use",
	"ValueError: Free memory on device cuda:0 (1.0/80.0 GiB) on startup is less than desired GPU memory utilization (0.9, 72 GiB).",
	"ValueError: To serve at least one request with the models's max seq len (8192), (1.00 GiB KV cache is needed, which is larger than the available KV cache memory (0.5 GiB).",
	"Available KV cache memory: -1.5 GiB",
	"RuntimeError: CUDA error: uncorrectable ECC error encountered",
	"pynvml.NVMLError_GPUIsLost: GPU is lost",
	"unspecified launch failure",
	"uncorrectable NVLink error",
	"ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
	"Memory cgroup out of memory: Killed process 1 (python3)",
	"Cannot allocate memory",
	"exited with code 137 OOMKilled",
	"Watchdog caught collective operation timeout",
	"ray.exceptions.RayChannelTimeoutError: System error: Timed out waiting for object available to read.",
	"No available shared memory broadcast block found in 60 seconds.",
	"vllm serve: error: unrecognized arguments: --x",
	"huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. Repository Not Found",
	"ModuleNotFoundError: No module named 'vllm'",
	"PermissionError: [Errno 1] Operation not permitted",
	"Address family not supported by protocol",
	"EngineCore failed to start.",
	"Worker proc VllmWorker-0 died unexpectedly, shutting down executor.",
	"Fatal Python error: Segmentation fault",
	"Traceback (most recent call last):",
	"(EngineCore_DP0 pid=1) ERROR 12-06 07:00:00 [core.py:1512] torch.OutOfMemoryError: CUDA out of memory.",
	"\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n    f()\ntorch.OutOfMemoryError: CUDA out of memory.",
	"\nERROR 12-06 07:00:00 [gpu_worker.py:239] Free memory on device cuda:0 (1.0/80.0 GiB) on startup is less than desired GPU memory utilization (0.9, 72 GiB).",
}

// hostileText is one word of causeWords or a random mix of them with
// quotes, brackets, newlines and printable noise.
func hostileText(r *rand.Rand) string {
	var b strings.Builder
	for range 1 + r.IntN(3) {
		switch r.IntN(4) {
		case 0, 1:
			b.WriteString(causeWords[r.IntN(len(causeWords))])
		case 2:
			b.WriteString([]string{"'", "`", "\"", ": ", "(", ")", "] ", "\n", "    ", "\\"}[r.IntN(10)])
		default:
			for range r.IntN(24) {
				b.WriteByte(byte(32 + r.IntN(95)))
			}
		}
	}
	if b.Len() == 0 {
		// An empty model name is vLLM's default model (200, no ERROR line).
		b.WriteString(causeWords[r.IntN(len(causeWords))])
	}
	return b.String()
}

// headerSafe is what a client can put in one header value.
func headerSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 32 || r == 127 {
			return ' '
		}
		return r
	}, s)
}

// savedState is the part of state.json the policy decides.
type savedState struct {
	Rung          int             `json:"rung"`
	UtilStepsBack int             `json:"util_steps_back"`
	Profile       json.RawMessage `json:"profile"`
	Failures      []struct {
		Cause string `json:"cause"`
	} `json:"failures"`
}

func readSaved(t *testing.T, dir string) savedState {
	t.Helper()
	var st savedState
	b, err := os.ReadFile(filepath.Join(dir, "state", "state.json"))
	if os.IsNotExist(err) {
		return st
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("state.json: %v", err)
	}
	return st
}

// sendHostile sends the client's texts through every family the
// simulator prints: the model name (serving.py:274's ERROR line), the
// X-Request-Id (async_llm.py:578's "Added request"), the path and
// X-Forwarded-For (uvicorn's access line). It returns the id of the last
// request, whose "Added request" line is the last to wait for.
func sendHostile(t *testing.T, port int, texts []string) string {
	t.Helper()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	do := func(method, path, body string, hdr map[string]string) int {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	last := ""
	for i, x := range texts {
		model, _ := json.Marshal(x)
		if c := do(http.MethodPost, "/v1/chat/completions", `{"model": `+string(model)+`, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}`,
			map[string]string{"X-Forwarded-For": headerSafe(x) + ", 127.0.0.1"}); c != http.StatusNotFound {
			t.Fatalf("chat with model %q: %d, want 404", x, c)
		}
		do(http.MethodGet, "/"+url.PathEscape(x)+"?q="+url.QueryEscape(x), "", nil)
		id := fmt.Sprintf("rid%d-%s", i, headerSafe(x))
		if c := do(http.MethodPost, "/v1/completions", `{"model": "test-model", "prompt": "hi", "max_tokens": 1}`,
			map[string]string{"X-Request-Id": id}); c != http.StatusOK {
			t.Fatalf("completion with X-Request-Id %q: %d", id, c)
		}
	}
	// A plain id last, to wait on: the hostile ones reach the log as the
	// client sent them, but the header's trimming, the log's escaping and
	// its masking of key-shaped text make them no reliable marker.
	last = fmt.Sprintf("rid-end-%d", len(texts))
	if c := do(http.MethodPost, "/v1/completions", `{"model": "test-model", "prompt": "hi", "max_tokens": 1}`,
		map[string]string{"X-Request-Id": last}); c != http.StatusOK {
		t.Fatalf("completion with X-Request-Id %q: %d", last, c)
	}
	return last
}

func TestClientTextNeverChangesTheCause(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	if s := os.Getenv("PROVENANCE_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (PROVENANCE_SEED=%d repeats it)", seed, seed)
	r := rand.New(rand.NewPCG(uint64(seed), 41))
	s := quick(newScene(t))
	s.env["FAKEVLLM_ERA"] = "v1" // vLLM 0.32.0's lines
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--enable-log-requests\"]", bins.fakevllm)
	s.extra = "\n[restart]\ninitial_delay = \"100ms\"\n"
	s.start()

	// The review's own request first (a model named after XID 79), then
	// every cause's words, then random mixes.
	rounds := [][]string{{causeWords[0]}, causeWords, nil}
	for range 20 {
		rounds[2] = append(rounds[2], hostileText(r))
	}
	for n, texts := range rounds {
		ready := s.WaitEvent("ready", n+1, 60*time.Second, isReady)
		before := readSaved(t, s.dir)
		last := sendHostile(t, s.port, texts)
		// The client's lines are in the guard's ring before the death.
		s.WaitLog("the last request's line", 1, 30*time.Second, msgContains("Added request cmpl-"+last+"."))
		if n == 1 && s.CountLogs(msgContains("Error with model error=ErrorInfo(message='The model `Xid (PCI:0000:3b:00): 79")) == 0 {
			t.Fatal("the simulator printed no ERROR line quoting the model name")
		}

		if err := syscall.Kill(ready.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		e := s.WaitEvent("vLLM's death", n+1, 30*time.Second, isExited)
		f := e.Failure
		if f.Verdict.Cause != "crash" {
			t.Errorf("round %d: a SIGKILL after the client's lines was classified %s: %s", n, f.Verdict.Cause, verdictText(e))
		}
		if f.Verdict.GPU != nil {
			t.Errorf("round %d: the verdict names a GPU fault: %+v", n, *f.Verdict.GPU)
		}
		if f.Decision.Action != "restart" || f.Decision.ExitCode != 0 {
			t.Errorf("round %d: decision %s (exit %d), want a restart: %s", n, f.Decision.Action, f.Decision.ExitCode, f.Decision.Reason)
		}
		if f.Decision.Rung.Index != 0 {
			t.Errorf("round %d: next rung %d, want 0", n, f.Decision.Rung.Index)
		}
		for _, l := range f.Verdict.Evidence {
			for _, x := range texts {
				if x != "" && strings.Contains(l.Text, strings.TrimSpace(strings.SplitN(x, "\n", 2)[0])) && strings.TrimSpace(x) != "" && len(x) > 12 {
					t.Errorf("round %d: the client's text is evidence: %q", n, l.Text)
				}
			}
		}
		// The state is written off the loop: wait for this death in it.
		var after savedState
		testkit.WaitFor(t, "the saved state with this death", 30*time.Second, func() bool {
			after = readSaved(t, s.dir)
			return len(after.Failures) > len(before.Failures)
		})
		if after.Rung != before.Rung || after.UtilStepsBack != before.UtilStepsBack || (before.Profile != nil && !bytes.Equal(after.Profile, before.Profile)) {
			t.Errorf("round %d: saved state changed: rung %d→%d, util steps %d→%d, profile %s→%s", n,
				before.Rung, after.Rung, before.UtilStepsBack, after.UtilStepsBack, before.Profile, after.Profile)
		}
		if k := len(after.Failures); k == 0 || after.Failures[k-1].Cause != "crash" {
			t.Errorf("round %d: saved failures %+v, want the last a crash", n, after.Failures)
		}
		if l := s.WaitEvent("the relaunch", n+2, 30*time.Second, isStarting); rungOf(l) != 0 {
			t.Errorf("round %d: relaunched on rung %d, want 0", n, rungOf(l))
		}
	}
	if n := s.CountEvents(func(e events.Event) bool { return e.Kind == events.KindStopped }); n != 0 {
		t.Errorf("the guard stopped %d time(s) before it was asked", n)
	}
	s.WaitEvent("ready after the last restart", len(rounds)+1, 60*time.Second, isReady)
	s.stopCleanly(30*time.Second, 5*time.Second)
}
