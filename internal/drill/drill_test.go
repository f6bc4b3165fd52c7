package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// Stream fixtures: what vLLM and the guard's proxy send.
var (
	streamOK = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" the\",\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" fox\",\"finish_reason\":\"length\"}]}\n\n" +
		"data: [DONE]\n\n"
	streamChatOK = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" the\"}}]}\n\n" +
		"data: [DONE]\n\n"
	streamVLLMDead = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" the\"}]}\n\n" +
		"data: {\"object\":\"error\",\"message\":\"EngineCore encountered an issue.\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}\n\n" +
		"data: [DONE]\n\n"
	streamProxyCut = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" the\"}]}\n\n" +
		"data: {\"error\":{\"message\":\"vLLM stopped in the middle of this response\",\"type\":\"server_error\",\"param\":null,\"code\":503}}\n\n"
	streamNoDone = "data: {\"choices\":[{\"text\":\" the\"}]}\n\n"
)

func TestReadStream(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		done       bool
		errEvent   string
		tokens     int
	}{
		{"ok", streamOK, true, "", 2},
		{"chat ok (role chunk is no token)", streamChatOK, true, "", 1},
		{"vLLM engine death", streamVLLMDead, true, "EngineCore encountered an issue.", 1},
		{"proxy cut event", streamProxyCut, false, "vLLM stopped in the middle of this response", 1},
		{"no [DONE]", streamNoDone, false, "", 1},
		{"CRLF", strings.ReplaceAll(streamOK, "\n", "\r\n"), true, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens := 0
			done, errEvent, err := readStream(strings.NewReader(tc.body), func() { tokens++ })
			if err != nil || done != tc.done || errEvent != tc.errEvent || tokens != tc.tokens {
				t.Fatalf("done %v err event %q tokens %d (err %v); want %v %q %d", done, errEvent, tokens, err, tc.done, tc.errEvent, tc.tokens)
			}
		})
	}
}

func FuzzReadStream(f *testing.F) {
	for _, s := range []string{streamOK, streamChatOK, streamVLLMDead, streamProxyCut, streamNoDone, "data:", "data: {\"error\":null}\n", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tokens := 0
		done, _, err := readStream(bytes.NewReader(b), func() { tokens++ })
		if err != nil {
			t.Fatalf("reading from memory failed: %v", err)
		}
		if done && !bytes.Contains(b, []byte("[DONE]")) {
			t.Fatal("done without [DONE]")
		}
		if tokens > bytes.Count(b, []byte("data:")) {
			t.Fatalf("%d tokens from %d events", tokens, bytes.Count(b, []byte("data:")))
		}
	})
}

func TestPromptHasTheRequestedLength(t *testing.T) {
	for _, n := range []int{1, 7, 2000} {
		p := prompt(n, "w1-2")
		if len(p) != 4*n {
			t.Fatalf("prompt of %d tokens has %d characters, want %d", n, len(p), 4*n)
		}
	}
	if prompt(100, "a") == prompt(100, "b") {
		t.Fatal("prompts of different requests are equal: a prefix cache would make them cheap")
	}
	var chat struct {
		Messages []struct{ Content string } `json:"messages"`
		Stream   bool                       `json:"stream"`
	}
	if err := json.Unmarshal(requestBody(Options{Model: "m", Chat: true, Stream: true, PromptTokens: 10, MaxTokens: 5}, "x"), &chat); err != nil ||
		len(chat.Messages) != 1 || len(chat.Messages[0].Content) != 40 || !chat.Stream {
		t.Fatalf("chat body: %+v (%v)", chat, err)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--url", "http://127.0.0.1:1"},
		{"--model", "m"},
		{"--url", "localhost:8000", "--model", "m"},
		{"--url", "http://x", "--model", "m", "--concurrency", "0"},
		{"--url", "http://x", "--model", "m", "--bogus"},
		{"--url", "http://x", "--model", "m", "extra"},
		{"--url", "http://x", "--model", "m", "--instance", "../x"},
		{"--url", "http://x", "--model", "m", "--instance", "a", "--socket", "/s.sock"},
	} {
		var out, errb bytes.Buffer
		if code := command(context.Background(), args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage:") {
			t.Errorf("%v: exit %d, stderr %q; want 2 with the usage", args, code, errb.String())
		}
	}
	var out bytes.Buffer
	if code := command(context.Background(), []string{"--help"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "--prompt-tokens") {
		t.Errorf("--help: exit %d, %q", code, out.String())
	}
	o, _, _, ok := parseArgs([]string{"--url", "http://x", "--model", "m", "--instance", "gpu2"}, io.Discard, io.Discard)
	if !ok || o.Socket != "/run/vllm-guard/gpu2.sock" {
		t.Errorf("--instance gpu2: socket %q, ok %v; want the instance's socket", o.Socket, ok)
	}
}

// fakeOpenAI answers in turn: ok, queued ok, 429, 503, a cut stream and a
// 500, so that every outcome shows up.
func fakeOpenAI(t *testing.T, stream bool) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model  string `json:"model"`
			Prompt string `json:"prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "m" || len(req.Prompt) != 40 {
			http.Error(w, "bad request", 400)
			return
		}
		switch n.Add(1) % 6 {
		case 0, 1:
			if n.Load()%6 == 1 {
				w.Header().Set(QueueWaitHeader, "12.5")
			}
			if stream {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, streamOK)
				return
			}
			io.WriteString(w, `{"choices":[{"text":" the fox"}]}`)
		case 2:
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"queue full"}}`, 429)
		case 3:
			http.Error(w, `{"error":{"message":"not ready"}}`, 503)
		case 4:
			if stream {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, streamProxyCut)
				return
			}
			http.Error(w, "engine dead", 500)
		case 5:
			io.WriteString(w, `{"choices":[]}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestDrillCountsOutcomesAndWritesJSON(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			srv := fakeOpenAI(t, stream)
			jsonPath := filepath.Join(t.TempDir(), "drill.json")
			args := []string{"--url", srv.URL, "--model", "m", "--concurrency", "3", "--prompt-tokens", "10",
				"--max-tokens", "4", "--duration", "200ms", "--ramp", "20ms", "--json", jsonPath}
			if stream {
				args = append(args, "--stream")
			}
			var out, errb bytes.Buffer
			code := command(context.Background(), args, &out, &errb)
			if code != 1 {
				t.Fatalf("exit %d, want 1 (FAIL: 503s and 5xx without a guard)\n%s%s", code, out.String(), errb.String())
			}
			b, err := os.ReadFile(jsonPath)
			if err != nil {
				t.Fatal(err)
			}
			var rep Report
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatal(err)
			}
			sum := 0
			for _, n := range rep.Outcomes {
				sum += n
			}
			if rep.Requests < 6 || sum != rep.Requests {
				t.Fatalf("%d requests, outcomes sum to %d", rep.Requests, sum)
			}
			want5 := Outcome5xx
			if stream {
				want5 = OutcomeStreamCut
			}
			for _, oc := range []Outcome{OutcomeOK, Outcome429, Outcome503, want5} {
				if rep.Outcomes[oc] == 0 {
					t.Errorf("no %s outcome in %v", oc, rep.Outcomes)
				}
			}
			if rep.Outcomes[Outcome4xx] != 0 || rep.Outcomes[OutcomeConnError] != 0 {
				t.Errorf("unexpected outcomes %v (examples %v)", rep.Outcomes, rep.Examples)
			}
			if !rep.Admission || rep.Queued == 0 {
				t.Errorf("admission engaged %v, queued %d: want both from the 429s and the queue header", rep.Admission, rep.Queued)
			}
			if rep.Verdict != VerdictFail || rep.OOMs != nil || rep.Guard != nil {
				t.Errorf("verdict %s, ooms %v, guard %v; want FAIL, unknown, none", rep.Verdict, rep.OOMs, rep.Guard)
			}
			if rep.LatencyMS.Count == 0 || rep.LatencyMS.P50 <= 0 || rep.TTFTMS.P99 < rep.TTFTMS.P50 {
				t.Errorf("latency %+v ttft %+v", rep.LatencyMS, rep.TTFTMS)
			}
			for _, want := range []string{"429", "503", "verdict: FAIL", "unknown"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestDrillPassesWhenNothingFails(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[{"text":"x"}]}`)
	}))
	defer srv.Close()
	var out bytes.Buffer
	code := command(context.Background(), []string{"--url", srv.URL, "--model", "m", "--concurrency", "2", "--duration", "100ms"}, &out, io.Discard)
	if code != 0 || !strings.Contains(out.String(), "verdict: PASS") {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}

func TestConnectionRefusedIsAConnectionError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	rep, err := Run(context.Background(), Options{URL: url, Model: "m", Concurrency: 1, PromptTokens: 1, MaxTokens: 1,
		Duration: 50 * time.Millisecond, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcomes[OutcomeConnError] == 0 || rep.Verdict != VerdictFail {
		t.Fatalf("outcomes %v verdict %s", rep.Outcomes, rep.Verdict)
	}
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func TestAnalyzeOOMsAndLeadTimes(t *testing.T) {
	warn := control.ActiveAlert{Name: "gpu_memory_warn", Since: at(2)}
	pred := control.ActiveAlert{Name: "oom_predicted", Since: at(3)}
	samples := []sample{
		// Baseline: an OOM from before the drill is not counted.
		{at: at(0), state: "ready", ooms: 1, failTime: at(-100), gpuFraction: 0.80},
		{at: at(2.5), state: "ready", ooms: 1, failTime: at(-100), alerts: []control.ActiveAlert{warn}, gpuFraction: 0.91},
		{at: at(3.5), state: "ready", ooms: 1, failTime: at(-100), alerts: []control.ActiveAlert{warn, pred}, gpuFraction: 0.96},
		{at: at(5), state: "backoff", ooms: 2, failTime: at(4.5), gpuFraction: 0.20},
		{at: at(9), state: "ready", ooms: 2, failTime: at(4.5), gpuFraction: 0.75},
		// A second OOM with no alert in between; its failure time is
		// seen only as a counter step (the guard restarted once more).
		{at: at(12), state: "backoff", ooms: 3, failTime: at(4.5), gpuFraction: 0.30},
	}
	r := analyze(samples, 1, "timeout")
	if len(r.OOMs) != 2 || !r.OOMs[0].Time.Equal(at(4.5)) || !r.OOMs[1].Time.Equal(at(12)) {
		t.Fatalf("OOMs %+v; want at 4.5 s and 12 s", r.OOMs)
	}
	if r.OOMs[0].Alert != "gpu_memory_warn" || *r.OOMs[0].LeadSeconds != 2.5 {
		t.Fatalf("first OOM warned by %q %v; want gpu_memory_warn 2.5 s before", r.OOMs[0].Alert, r.OOMs[0].LeadSeconds)
	}
	if r.OOMs[1].Alert != "" {
		t.Fatalf("second OOM attributed to %q: the alerts before it belong to the first OOM", r.OOMs[1].Alert)
	}
	if len(r.Alerts) != 2 || *r.Alerts[1].LeadSeconds != 1.5 {
		t.Fatalf("alerts %+v; want 2, oom_predicted 1.5 s before the OOM", r.Alerts)
	}
	if r.PeakGPUFraction != 0.96 || strings.Join(r.States, ",") != "ready,backoff,ready,backoff" || r.SampleErrors != 1 {
		t.Fatalf("peak %v states %v errors %d", r.PeakGPUFraction, r.States, r.SampleErrors)
	}
	rep := &Report{Outcomes: map[Outcome]int{OutcomeOK: 1}, Guard: r}
	rep.judge()
	if rep.Verdict != VerdictFail || *rep.OOMs != 2 {
		t.Fatalf("verdict %s (%v): an unwarned OOM must fail", rep.Verdict, rep.Reasons)
	}
	rep = &Report{Outcomes: map[Outcome]int{OutcomeOK: 1, Outcome5xx: 4}, Guard: analyze(samples[:5], 0, "")}
	rep.judge()
	if rep.Verdict != VerdictPass || *rep.OOMs != 1 {
		t.Fatalf("verdict %s (%v): a warned OOM passes, even with 5xx answers", rep.Verdict, rep.Reasons)
	}
}

// scriptBackend is a guard whose status follows a script of documents.
type scriptBackend struct {
	mu   sync.Mutex
	docs []control.Doc
	i    int
}

func (b *scriptBackend) Doc() control.Doc {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.docs[min(b.i, len(b.docs)-1)]
	b.i++
	return d
}
func (b *scriptBackend) Restart(context.Context, string) error           { return nil }
func (b *scriptBackend) ResetProfile(context.Context, string) error      { return nil }
func (b *scriptBackend) Incidents(int, func(state.Incident) error) error { return nil }
func (b *scriptBackend) Alive() (bool, string)                           { return true, "" }

func doc(st status.State, ooms int, fail time.Time, frac float64, alerts ...gpumon.Alert) control.Doc {
	d := control.Doc{Guard: status.Status{State: st, Restarts: map[cause.Cause]int{cause.CauseOOM: ooms}},
		GPU: gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{Fraction: frac}}, Active: alerts}}
	if !fail.IsZero() {
		d.Guard.LastFailure = &status.Failure{Time: fail, Verdict: cause.Verdict{Cause: cause.CauseOOM}}
	}
	return d
}

func TestDrillSamplesTheGuardOverItsSocket(t *testing.T) {
	now := time.Now()
	warn := gpumon.Alert{Name: "gpu_memory_critical", Active: true, At: now.Add(-time.Second)}
	b := &scriptBackend{docs: []control.Doc{
		doc(status.StateReady, 0, time.Time{}, 0.85),
		doc(status.StateReady, 0, time.Time{}, 0.98, warn),
		doc(status.StateBackoff, 1, now, 0.10),
	}}
	sock := filepath.Join(t.TempDir(), "guard.sock")
	srv, err := control.ListenSocket(sock, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "engine dead", 500)
	}))
	defer api.Close()
	rep, err := Run(context.Background(), Options{URL: api.URL, Model: "m", Concurrency: 1, PromptTokens: 1, MaxTokens: 1,
		Duration: 250 * time.Millisecond, Timeout: time.Second, Socket: sock, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g := rep.Guard
	if g == nil || g.Samples < 3 || len(g.OOMs) != 1 || g.OOMs[0].Alert != "gpu_memory_critical" || g.PeakGPUFraction != 0.98 {
		t.Fatalf("guard report %+v", g)
	}
	if rep.Verdict != VerdictFail || !strings.Contains(strings.Join(rep.Reasons, ";"), "no request succeeded") {
		t.Fatalf("verdict %s %v: nothing succeeded, so FAIL despite the warned OOM", rep.Verdict, rep.Reasons)
	}
	var out bytes.Buffer
	WriteTable(&out, rep)
	for _, want := range []string{"gpu_memory_critical", "OOMs               1", "warned by gpu_memory_critical"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDrillWithoutReachableGuard(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "{}")
	}))
	defer api.Close()
	rep, err := Run(context.Background(), Options{URL: api.URL, Model: "m", Concurrency: 1, PromptTokens: 1, MaxTokens: 1,
		Duration: 100 * time.Millisecond, Timeout: time.Second, Socket: filepath.Join(t.TempDir(), "none.sock"), Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Guard == nil || rep.Guard.Samples != 0 || rep.Guard.SampleErrors == 0 || rep.OOMs != nil || rep.Verdict != VerdictPass {
		t.Fatalf("guard %+v ooms %v verdict %s %v", rep.Guard, rep.OOMs, rep.Verdict, rep.Reasons)
	}
	if !strings.Contains(strings.Join(rep.Reasons, ";"), "could not be read") {
		t.Fatalf("reasons %v: want the unreadable status named", rep.Reasons)
	}
}

// With an API key every request carries it as a Bearer token.
func TestDrillSendsAPIKey(t *testing.T) {
	var got atomic.Pointer[string]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		got.Store(&h)
		w.Write([]byte(`{"choices":[{"text":"x"}]}`))
	}))
	defer srv.Close()
	o := Options{URL: srv.URL, Model: "m", Timeout: 5 * time.Second, APIKey: "sk-drill"}
	r, _ := doRequest(context.Background(), srv.Client(), srv.URL+"/v1/completions", []byte(`{}`), o)
	if g := got.Load(); g == nil || *g != "Bearer sk-drill" || r.outcome != OutcomeOK {
		t.Fatalf("Authorization %v, outcome %v", g, r.outcome)
	}
}
