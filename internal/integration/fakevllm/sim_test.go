package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestPortRefusedWhileLoading(t *testing.T) {
	t.Parallel()
	port := testkit.FreePort(t)
	p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_FAULT": "hang_loading"}),
		"org/model", "--host", "127.0.0.1", "--port", strconv.Itoa(port))
	_, l := p.waitLine("Loading weights took", 10*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")

	// hang_loading never listens: the port is bound but refuses.
	_, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while loading: got %v, want connection refused", err)
	}
	// The engine is VLLM::EngineCore in the API's process group.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", engine))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(cmdline), "VLLM::EngineCore\x00") {
		t.Errorf("engine cmdline %q, want VLLM::EngineCore first", cmdline)
	}
	if pg, _ := syscall.Getpgid(engine); pg != p.cmd.Process.Pid {
		t.Errorf("engine pgid %d, want the API's group %d", pg, p.cmd.Process.Pid)
	}
	p.signal(syscall.SIGTERM)
	if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
		t.Errorf("exit after SIGTERM while loading: %v, want 0", st)
	}
	p.waitOutputEnd(10 * time.Second) // the engine went too
}

func TestStartupSequenceAndReady(t *testing.T) {
	t.Parallel()
	p, url := startReady(t, fast, "org/model", "--max-num-seqs", "32", "--gpu-memory-utilization=0.85")

	// In vLLM's order, each on its stream.
	want := []struct{ stream, text string }{
		{"stdout", "vLLM API server version 0.11.0"},
		{"stdout", "non-default args: {"},
		{"stdout", "Using max model len 4096"},
		{"stdout", "Initializing a V1 LLM engine"},
		{"stdout", "Starting to load model org/model"},
		{"stderr", "Loading safetensors checkpoint shards: 100% Completed | 3/3"},
		{"stdout", "Model loading took 15.0000 GiB"},
		{"stdout", "torch.compile takes"},
		{"stdout", "Available KV cache memory:"},
		{"stdout", "GPU KV cache size:"},
		{"stdout", "Maximum concurrency for 4,096 tokens per request"},
		{"stderr", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%"},
		{"stdout", "init engine (profile, create kv cache, warmup model) took"},
		{"stdout", "Starting vLLM API server 0 on http://127.0.0.1:"},
		{"stdout", "Route: /health, Methods: GET"},
		{"stderr", "INFO:     Started server process"},
		{"stderr", "INFO:     Waiting for application startup."},
		{"stderr", "INFO:     Application startup complete."},
	}
	// Two pipes: order holds within each stream, not across them.
	lines := p.snapshot()
	at := map[string]int{}
	for _, w := range want {
		found := false
		for i := at[w.stream]; i < len(lines); i++ {
			if lines[i].stream == w.stream && strings.Contains(lines[i].text, w.text) {
				at[w.stream] = i + 1
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("line %q missing on %s or out of order", w.text, w.stream)
		}
	}
	_, args := p.waitLine("non-default args:", time.Second)
	for _, s := range []string{"'max_num_seqs': 32", "'gpu_memory_utilization': 0.85"} {
		if !strings.Contains(args.text, s) {
			t.Errorf("non-default args line %q lacks %s", args.text, s)
		}
	}
	// v1-ansi: the prefix is ANSI-coloured even though stdout is a pipe.
	if !strings.Contains(args.raw, "\x1b[1;36m(APIServer pid=") {
		t.Errorf("v1-ansi line without coloured prefix: %q", args.raw)
	}
	// Budget 0.85×80 GiB − 15 GiB weights − 32×40 MiB = 51.75 GiB.
	if !p.has("Available KV cache memory: 51.75 GiB") {
		t.Errorf("KV cache line wrong:\n%s", p.dump())
	}
	resp, err := httpClient().Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"id":"org/model"`) {
		t.Errorf("/v1/models = %s, want org/model listed", body)
	}
}

func TestUnknownFlagIsUsageError(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(simBin(t), "serve", "org/model", "--max-num-seqz", "8")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v, want status 2", err)
	}
	if !strings.HasPrefix(stderr.String(), "usage: vllm serve [-h]") {
		t.Errorf("stderr does not start with the usage: %q", stderr.String())
	}
	if !strings.Contains(stderr.String(), "vllm serve: error: unrecognized arguments: --max-num-seqz 8\n") {
		t.Errorf("stderr lacks the argparse error: %q", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout not empty: %q", stdout.String())
	}
}

// Merged vLLM's vllm serve has no --task (--runner pooling and --convert
// replaced it): argparse refuses it like any unknown flag, value and all.
func TestMergedEraRefusesTask(t *testing.T) {
	t.Parallel()
	for _, argv := range [][]string{{"org/model", "--task", "embed"}, {"org/model", "--task=classify", "--runner", "pooling"}} {
		cmd := exec.Command(simBin(t), append([]string{"serve"}, argv...)...)
		cmd.Env = append(os.Environ(), "FAKEVLLM_ERA=v1")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("%q: exit %v, want status 2", argv, err)
		}
		want := "vllm serve: error: unrecognized arguments: " + strings.Join(argv[1:2], " ")
		if argv[1] == "--task" {
			want += " " + argv[2]
		}
		if !strings.Contains(stderr.String(), want+"\n") || stdout.Len() != 0 {
			t.Errorf("%q: stderr %q, stdout %q; want %q on stderr only", argv, stderr.String(), stdout.String(), want)
		}
	}
}

func postJSON(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := httpClient().Post(url, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

// sseEvents reads "data: ..." events until [DONE] or EOF.
func sseEvents(t *testing.T, r io.Reader) (events []map[string]any, done bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line %q lacks the data: prefix", line)
		}
		if data == "[DONE]" {
			return events, true
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("SSE event %q: %v", data, err)
		}
		events = append(events, ev)
	}
	return events, false
}

func TestCompletionsAndStreaming(t *testing.T) {
	t.Parallel()
	p, url := startReady(t, fast, "org/model", "--served-model-name", "served")

	t.Run("completion", func(t *testing.T) {
		resp := postJSON(t, url+"/v1/completions", map[string]any{"model": "served", "prompt": strings.Repeat("abcd", 10), "max_tokens": 5})
		defer resp.Body.Close()
		var out struct {
			Object  string `json:"object"`
			Model   string `json:"model"`
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
				Total      int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
		}
		if out.Object != "text_completion" || out.Model != "served" || len(out.Choices) != 1 || out.Choices[0].Text == "" || out.Choices[0].FinishReason != "length" {
			t.Errorf("completion shape: %+v", out)
		}
		if out.Usage.Prompt != 10 || out.Usage.Completion != 5 || out.Usage.Total != 15 {
			t.Errorf("usage %+v, want prompt 10 completion 5 total 15", out.Usage)
		}
		// uvicorn's access line, on stdout like uvicorn's access logger.
		_, l := p.waitLine(`"POST /v1/completions HTTP/1.1" 200 OK`, 5*time.Second)
		if l.stream != "stdout" || !strings.Contains(l.text, "(APIServer pid=") || !strings.Contains(l.text, "INFO:     127.0.0.1:") {
			t.Errorf("access line %+v", l)
		}
	})
	t.Run("completion stream", func(t *testing.T) {
		resp := postJSON(t, url+"/v1/completions", map[string]any{"model": "served", "prompt": "hi", "max_tokens": 4, "stream": true})
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Errorf("Content-Type %q", ct)
		}
		evs, done := sseEvents(t, resp.Body)
		if !done || len(evs) != 4 {
			t.Fatalf("got %d events, done=%v; want 4 then [DONE]", len(evs), done)
		}
		for i, ev := range evs {
			ch := ev["choices"].([]any)[0].(map[string]any)
			if ev["object"] != "text_completion" || ch["text"] == "" {
				t.Errorf("event %d shape: %v", i, ev)
			}
			if want := i == 3; (ch["finish_reason"] == "length") != want {
				t.Errorf("event %d finish_reason %v", i, ch["finish_reason"])
			}
		}
	})
	t.Run("chat stream", func(t *testing.T) {
		resp := postJSON(t, url+"/v1/chat/completions", map[string]any{
			"model": "served", "messages": []any{map[string]any{"role": "user", "content": "hello there"}},
			"max_tokens": 3, "stream": true, "stream_options": map[string]any{"include_usage": true}})
		defer resp.Body.Close()
		evs, done := sseEvents(t, resp.Body)
		// role chunk, 3 tokens, usage chunk.
		if !done || len(evs) != 5 {
			t.Fatalf("got %d events, done=%v; want 5 then [DONE]", len(evs), done)
		}
		first := evs[0]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
		if evs[0]["object"] != "chat.completion.chunk" || first["role"] != "assistant" {
			t.Errorf("first chunk %v", evs[0])
		}
		if u, ok := evs[4]["usage"].(map[string]any); !ok || u["completion_tokens"] != 3.0 {
			t.Errorf("usage chunk %v", evs[4])
		}
	})
	t.Run("chat", func(t *testing.T) {
		resp := postJSON(t, url+"/v1/chat/completions", map[string]any{
			"messages": []any{map[string]any{"role": "user", "content": "hello"}}, "max_tokens": 2})
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		msg := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
		if out["object"] != "chat.completion" || msg["role"] != "assistant" || msg["content"] == "" {
			t.Errorf("chat shape %v", out)
		}
	})
	t.Run("wrong model", func(t *testing.T) {
		resp := postJSON(t, url+"/v1/completions", map[string]any{"model": "other", "prompt": "x"})
		defer resp.Body.Close()
		var e apiError
		json.NewDecoder(resp.Body).Decode(&e)
		if resp.StatusCode != 404 || e.Type != "NotFoundError" || e.Message != "The model `other` does not exist." {
			t.Errorf("status %d error %+v", resp.StatusCode, e)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		resp, err := httpClient().Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, s := range []string{
			`vllm:num_requests_running{engine="0",model_name="served"} 0.0`,
			`vllm:num_requests_waiting{engine="0",model_name="served"} 0.0`,
			`vllm:kv_cache_usage_perc{engine="0",model_name="served"}`,
			`vllm:num_preemptions_total{engine="0",model_name="served"} 0.0`,
			`vllm:prompt_tokens_total{engine="0",model_name="served"}`,
			`vllm:generation_tokens_total{engine="0",model_name="served"}`,
			"fakevllm_true_seq_cost_bytes 41943040",
			"fakevllm_true_safe_max_num_seqs ",
			"fakevllm_gpu_used_bytes ",
		} {
			if !strings.Contains(string(body), s) {
				t.Errorf("/metrics lacks %q:\n%s", s, body)
			}
		}
	})
}

func metricValue(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := httpClient().Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func TestMaxNumSeqsQueuesFIFO(t *testing.T) {
	t.Parallel()
	_, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_TOKEN_INTERVAL": "20ms"}), "org/model", "--max-num-seqs", "1")

	// A long stream holds the only slot.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 3000, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(string(b)))
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	second := make(chan int, 1)
	go func() {
		r, err := httpClient().Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"y","max_tokens":2}`))
		if err != nil {
			second <- 0
			return
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		second <- r.StatusCode
	}()
	testkit.WaitFor(t, "one running and one waiting", 30*time.Second, func() bool {
		return metricValue(t, url, "vllm:num_requests_running") == 1 && metricValue(t, url, "vllm:num_requests_waiting") == 1
	})
	cancel() // the client goes away: its slot goes to the waiter
	select {
	case code := <-second:
		if code != 200 {
			t.Errorf("queued request: status %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("queued request never ran after the slot freed")
	}
}

// stateDir makes a stand-in NVML state with one device of total bytes.
func stateDir(t *testing.T, total int64) string {
	t.Helper()
	dir := t.TempDir()
	line := fmt.Sprintf("# test device\n%s %d %d NVIDIA Test GPU 16GB\n", defaultUUID, total, defaultReserved)
	if err := os.WriteFile(filepath.Join(dir, "devices"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readProc(t *testing.T, dir string, pid int) (map[int]int64, bool) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "procs", strconv.Itoa(pid)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	m, err := parseProcEntries(data)
	if err != nil {
		t.Fatalf("procs/%d: %v", pid, err)
	}
	return m, true
}

func TestRuntimeOOMWithBackgroundDemand(t *testing.T) {
	t.Parallel()
	// 16 GiB device, 0.5 GiB reserved, API 256 MiB, budget 0.9×16 = 14.4 GiB:
	// 0.85 GiB of room = 8 sequences of 100 MiB. Background holds 8; one
	// more request is the 9th and does not fit.
	dir := stateDir(t, 16*gib)
	p, url := startReady(t, merge(fast, map[string]string{
		"FAKENVML_STATE":           dir,
		"FAKEVLLM_WEIGHTS_GIB":     "2",
		"FAKEVLLM_SEQ_COST_MIB":    "100",
		"FAKEVLLM_BACKGROUND_SEQS": "8",
		"FAKEVLLM_TOKEN_INTERVAL":  "10ms",
	}), "org/model", "--max-num-seqs", "64")
	_, l := p.waitLine("Model loading took", 10*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	api := p.cmd.Process.Pid

	budget := memModel{Total: 16 * gib, Util: 0.9}.budget()
	testkit.WaitFor(t, "the engine to publish budget + 8 sequences", 30*time.Second, func() bool {
		m, ok := readProc(t, dir, engine)
		return ok && m[0] == budget+8*100*mib
	})
	if m, ok := readProc(t, dir, api); !ok || m[0] != 256*mib {
		t.Errorf("API procs file %v (exists %v), want 0 → 256 MiB", m, ok)
	}
	if v := metricValue(t, url, "vllm:num_requests_running"); v != 8 {
		t.Errorf("running %v, want the 8 background sequences", v)
	}
	if v := metricValue(t, url, "fakevllm_true_safe_max_num_seqs"); v != 8 {
		t.Errorf("true safe max_num_seqs %v, want 8", v)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		b, _ := json.Marshal(map[string]any{"prompt": "boom", "max_tokens": 1000})
		resp, err := httpClient().Post(url+"/v1/completions", "application/json", strings.NewReader(string(b)))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	_, oom := p.waitLine("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", 10*time.Second)
	if oom.stream != "stderr" || !strings.Contains(oom.text, "GPU 0 has a total capacity of 16.00 GiB") {
		t.Errorf("OOM line %+v", oom)
	}
	if pidFromPrefix(t, oom.text, "EngineCore_0") != engine {
		t.Errorf("OOM not printed by the engine: %q", oom.text)
	}
	p.waitLine("EngineCore encountered a fatal error.", 5*time.Second)
	p.waitLine("AsyncLLM output_handler failed.", 5*time.Second)
	p.waitLine("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", 5*time.Second)
	p.waitLine("INFO:     Finished server process", 5*time.Second)
	if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
		t.Errorf("exit after runtime OOM: %v, want 0 like vLLM", st)
	}
	<-done
	// Both exits were clean: the memory went with them.
	if _, ok := readProc(t, dir, engine); ok {
		t.Error("engine procs file left after it died of OOM")
	}
	if _, ok := readProc(t, dir, api); ok {
		t.Error("API procs file left after a clean exit")
	}
}

func TestFreeMemoryCheckFailsWhenAnotherProcessHoldsMemory(t *testing.T) {
	t.Parallel()
	dir := stateDir(t, 16*gib)
	// This test process is alive: its 4 GiB count. A dead pid's 100 GiB do not.
	os.MkdirAll(filepath.Join(dir, "procs"), 0o755)
	os.WriteFile(filepath.Join(dir, "procs", strconv.Itoa(os.Getpid())), []byte(fmt.Sprintf("0 %d\n", 4*gib)), 0o644)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "procs", strconv.Itoa(dead.Process.Pid)), []byte(fmt.Sprintf("0 %d\n", 100*gib)), 0o644)

	p := startSim(t, merge(fast, map[string]string{"FAKENVML_STATE": dir, "FAKEVLLM_WEIGHTS_GIB": "2"}),
		"org/model", "--port", "0", "--gpu-memory-utilization", "0.9")
	// free = 16 − 0.5 reserved − 0.25 API − 4 = 11.25 GiB < 0.9 × 16 = 14.4 GiB.
	_, l := p.waitLine("ValueError: Free memory on device (11.25/16.00 GiB) on startup is less than desired GPU memory utilization (0.9, 14.40 GiB).", 10*time.Second)
	if l.stream != "stderr" {
		t.Errorf("traceback on %s", l.stream)
	}
	p.waitLine("RuntimeError: Engine core initialization failed. See root cause above.", 5*time.Second)
	if st := p.waitExit(10 * time.Second); st.ExitCode() != 1 {
		t.Errorf("exit %v, want 1", st)
	}
	if _, ok := readProc(t, dir, p.cmd.Process.Pid); ok {
		t.Error("API procs file left after exit 1")
	}
}

func TestOrphanAfterLeavesEngineHoldingMemory(t *testing.T) {
	t.Parallel()
	dir := stateDir(t, 80*gib)
	p := startSim(t, merge(fast, map[string]string{"FAKENVML_STATE": dir, "FAKEVLLM_FAULT": "orphan_after=0s"}),
		"org/model", "--port", "0", "--host", "127.0.0.1")
	_, l := p.waitLine("Model loading took", 10*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	st := p.waitExit(10 * time.Second)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("API exit %v, want killed by SIGKILL", st)
	}
	// The orphan lives on, still VLLM::EngineCore, still holding the budget.
	if !pidAlive(engine) {
		t.Fatal("engine died with the API process; want an orphan")
	}
	m, ok := readProc(t, dir, engine)
	if !ok || m[0] < (memModel{Total: 80 * gib, Util: 0.9}).budget() {
		t.Errorf("orphan procs file %v (exists %v), want at least the 72 GiB budget", m, ok)
	}
	// The API's file stays too (SIGKILL: no cleanup) but its pid is dead.
	if _, ok := readProc(t, dir, p.cmd.Process.Pid); !ok {
		t.Error("API procs file vanished although it was SIGKILLed")
	}
	// Cleanup kills the process group, which still holds the orphan.
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	testkit.WaitFor(t, "the orphan to die with its group", 30*time.Second, func() bool { return !pidAlive(engine) })
}

func TestFaultMarkerFiresOnce(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "fired")
	env := merge(fast, map[string]string{"FAKEVLLM_FAULT": "crash_after=0s", "FAKEVLLM_FAULT_MARKER": marker})

	first := startSim(t, env, "org/model", "--port", "0", "--host", "127.0.0.1")
	first.waitLine("Worker proc VllmWorker-0 died unexpectedly", 10*time.Second)
	first.waitLine("EngineDeadError", 5*time.Second)
	if st := first.waitExit(10 * time.Second); st.ExitCode() != 0 {
		t.Errorf("first run exit %v, want 0 after an engine death", st)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("marker not created when the fault fired: %v", err)
	}

	second, url := startReady(t, env, "org/model")
	resp := postJSON(t, url+"/v1/completions", map[string]any{"prompt": "ok", "max_tokens": 2})
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("second run completion status %d", resp.StatusCode)
	}
	second.signal(syscall.SIGTERM)
	second.waitLine("Finished server process", 10*time.Second)
	if st := second.waitExit(10 * time.Second); st.ExitCode() != 0 {
		t.Errorf("second run exit after SIGTERM %v, want 0", st)
	}
	if second.has("died unexpectedly") {
		t.Error("the fault fired again although the marker exists")
	}
}

func TestStartupFailures(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
		code int
	}{
		{"missing model", nil, []string{"missing/model"}, "ValueError: Invalid repository ID or local directory specified: 'missing/model'.", 1},
		{"missing model v0", map[string]string{"FAKEVLLM_ERA": "v0"}, []string{"missing/model"}, "OSError: missing/model is not a local folder", 1},
		{"port in use", nil, []string{"org/model", "--host", "127.0.0.1", "--port", busyPort}, "OSError: [Errno 98] Address already in use", 1},
		{"kv smaller than max model len", nil, []string{"org/model", "--max-model-len", "10000000"}, "ValueError: To serve at least one request with the models's max seq len (10000000)", 1},
		{"kv smaller v0", map[string]string{"FAKEVLLM_ERA": "v0"}, []string{"org/model", "--max-model-len", "10000000"}, "ValueError: The model's max seq len (10000000) is larger than the maximum number of tokens that can be stored in KV cache", 1},
		{"no cache blocks", map[string]string{"FAKEVLLM_SEQ_COST_MIB": "1024"}, []string{"org/model"}, "ValueError: No available memory for the cache blocks.", 1},
		{"crash on start", map[string]string{"FAKEVLLM_FAULT": "crash_on_start"}, []string{"org/model"}, "RuntimeError: NCCL error: unhandled system error", 1},
		{"oom on start", map[string]string{"FAKEVLLM_FAULT": "oom_on_start"}, []string{"org/model", "--max-num-seqs", "512"}, "RuntimeError: CUDA out of memory occurred when warming up sampler with 512 dummy requests.", 1},
		{"bad utilization", nil, []string{"org/model", "--gpu-memory-utilization", "1.5"}, "ValueError: GPU memory utilization must be within (0, 1]", 1},
		{"no visible GPU", map[string]string{"CUDA_VISIBLE_DEVICES": ""}, []string{"org/model"}, "RuntimeError: No CUDA GPUs are available", 1},
		{"bad fault", map[string]string{"FAKEVLLM_FAULT": "explode"}, []string{"org/model"}, `unknown fault "explode"`, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := c.args
			if len(args) == 1 {
				args = append(args, "--port", "0")
			}
			p := startSim(t, merge(fast, c.env), args...)
			_, l := p.waitLine(c.want, 10*time.Second)
			if l.stream != "stderr" {
				t.Errorf("%q on %s, want stderr", c.want, l.stream)
			}
			if st := p.waitExit(10 * time.Second); st.ExitCode() != c.code {
				t.Errorf("exit %v, want %d", st, c.code)
			}
			p.waitOutputEnd(10 * time.Second) // no engine left behind
		})
	}
}

func TestEraV0(t *testing.T) {
	t.Parallel()
	p, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v0"}), "org/model")
	_, l := p.waitLine("# GPU blocks:", time.Second)
	// V0: "INFO 10-14 12:00:00 executor_base.py:110] # GPU blocks: ..."
	if !v0LineRE.MatchString(l.raw) {
		t.Errorf("v0 line %q does not match %v", l.raw, v0LineRE)
	}
	p.waitLine("Loading model weights took 15.0000 GB", time.Second)
	p.waitLine("Starting vLLM API server on http://127.0.0.1:", time.Second)
	if v := metricValue(t, url, "vllm:gpu_cache_usage_perc"); v != 0 {
		t.Errorf("v0 gpu_cache_usage_perc %v", v)
	}
}

func TestSegvAfter(t *testing.T) {
	t.Parallel()
	p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_FAULT": "segv_after=0s"}), "org/model", "--port", "0")
	p.waitLine("Fatal Python error: Segmentation fault", 10*time.Second)
	st := p.waitExit(10 * time.Second)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
		t.Fatalf("exit %v, want killed by SIGSEGV", st)
	}
}

func TestLogFloodWritesStats(t *testing.T) {
	t.Parallel()
	stats := filepath.Join(t.TempDir(), "stats.json")
	p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_FAULT": "log_flood=4,long_line,invalid_utf8", "FAKEVLLM_STATS_FILE": stats}),
		"org/model", "--port", "0")
	p.waitLine("Application startup complete.", 10*time.Second)
	p.waitLine("Received request cmpl-longline", 10*time.Second)
	p.waitLine("Avg prompt throughput", 10*time.Second)
	var s statsJSON
	testkit.WaitFor(t, "stats showing 1 MB written", 30*time.Second, func() bool {
		b, err := os.ReadFile(stats)
		return err == nil && json.Unmarshal(b, &s) == nil && s.Bytes > 1<<21
	})
	if s.Lines == 0 || s.MaxBlockMS < 0 {
		t.Errorf("stats %+v", s)
	}
	p.signal(syscall.SIGTERM)
	p.waitExit(10 * time.Second)
	found := false
	for _, l := range p.snapshot() {
		if strings.Contains(l.raw, "\xff\xfe") {
			found = true
		}
		if strings.Contains(l.raw, "cmpl-longline") && len(l.raw) < 1<<20 {
			t.Errorf("long line is %d bytes, want over 1 MiB", len(l.raw))
		}
	}
	if !found {
		t.Error("no invalid UTF-8 line")
	}
}

// faultRun starts a simulator with one fault and a marker, so the test
// can wait for the moment the fault fired. It returns once the server
// line names the URL (listen follows shortly; faults after ready fire
// after listen). With port 0 the simulator picks a free port.
func faultRun(t *testing.T, fault string, extra map[string]string, port int) (p *simProc, url, marker string) {
	t.Helper()
	marker = filepath.Join(t.TempDir(), "fired")
	p = startSim(t, merge(fast, map[string]string{"FAKEVLLM_FAULT": fault, "FAKEVLLM_FAULT_MARKER": marker}, extra),
		"org/model", "--host", "127.0.0.1", "--port", strconv.Itoa(port))
	if port == 0 {
		_, l := p.waitLine(" on http://127.0.0.1:", 20*time.Second)
		port, _ = strconv.Atoi(l.text[strings.LastIndex(l.text, ":")+1:])
	}
	return p, fmt.Sprintf("http://127.0.0.1:%d", port), marker
}

func waitMarker(t *testing.T, marker string) {
	t.Helper()
	testkit.WaitFor(t, "the fault to fire", 30*time.Second, func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
}

func get(url string, timeout time.Duration) (int, string, error) {
	c := httpClient()
	c.Timeout = timeout
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestServingFaults(t *testing.T) {
	t.Parallel()
	t.Run("ignore_sigterm", func(t *testing.T) {
		t.Parallel()
		p, url, marker := faultRun(t, "ignore_sigterm", nil, 0)
		p.signal(syscall.SIGTERM)
		waitMarker(t, marker) // the signal arrived and was ignored
		testkit.WaitFor(t, "/health 200 after an ignored SIGTERM", 30*time.Second, func() bool { c, _, _ := get(url+"/health", time.Second); return c == 200 })
		if p.has("Shutting down") {
			t.Error("shutdown lines printed although SIGTERM is ignored")
		}
	})
	t.Run("hang_after", func(t *testing.T) {
		t.Parallel()
		_, url, marker := faultRun(t, "hang_after=0s", nil, 0)
		waitMarker(t, marker)
		_, _, err := get(url+"/health", 300*time.Millisecond)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("/health while hung: %v, want a timeout", err)
		}
	})
	t.Run("health503_after", func(t *testing.T) {
		t.Parallel()
		_, url, marker := faultRun(t, "health503_after=0s", nil, 0)
		waitMarker(t, marker)
		if code, _, err := get(url+"/health", 5*time.Second); err != nil || code != 503 {
			t.Errorf("/health: %d %v, want 503", code, err)
		}
	})
	t.Run("never_ready", func(t *testing.T) {
		t.Parallel()
		_, url, _ := faultRun(t, "never_ready", nil, 0)
		testkit.WaitFor(t, "/health 200", 30*time.Second, func() bool { c, _, _ := get(url+"/health", time.Second); return c == 200 })
		if _, body, _ := get(url+"/v1/models", 5*time.Second); !strings.Contains(body, `"data":[]`) {
			t.Errorf("/v1/models %s, want an empty list", body)
		}
		resp := postJSON(t, url+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 1})
		resp.Body.Close()
		if resp.StatusCode != 500 {
			t.Errorf("completion status %d, want 500", resp.StatusCode)
		}
	})
	t.Run("close_stdout", func(t *testing.T) {
		t.Parallel()
		// The URL line goes to the closed stdout: pick the port here.
		p, url, _ := faultRun(t, "close_stdout", nil, testkit.FreePort(t))
		testkit.WaitFor(t, "/health 200", 30*time.Second, func() bool { c, _, _ := get(url+"/health", time.Second); return c == 200 })
		for _, l := range p.snapshot() {
			if l.stream == "stdout" {
				t.Fatalf("stdout line after close_stdout: %q", l.text)
			}
		}
	})
	t.Run("grandchild", func(t *testing.T) {
		t.Parallel()
		dir := stateDir(t, 80*gib)
		p, _, _ := faultRun(t, "grandchild", map[string]string{"FAKENVML_STATE": dir}, 0)
		_, l := p.waitLine("Model loading took", 5*time.Second)
		engine := pidFromPrefix(t, l.text, "EngineCore_0")
		var gc int
		testkit.WaitFor(t, "the grandchild's procs file", 30*time.Second, func() bool {
			ents, _ := os.ReadDir(filepath.Join(dir, "procs"))
			for _, e := range ents {
				pid, err := strconv.Atoi(e.Name())
				if err == nil && pid != engine && pid != p.cmd.Process.Pid {
					gc = pid
					return true
				}
			}
			return false
		})
		t.Cleanup(func() { syscall.Kill(gc, syscall.SIGKILL) })
		if m, ok := readProc(t, dir, gc); !ok || m[0] != gib {
			t.Errorf("grandchild holds %v, want 1 GiB", m)
		}
		if sid := procSession(t, gc); sid != gc {
			t.Errorf("grandchild session %d, want its own (%d)", sid, gc)
		}
		if pg, _ := syscall.Getpgid(gc); pg == p.cmd.Process.Pid {
			t.Error("grandchild still in the simulator's process group")
		}
		syscall.Kill(gc, syscall.SIGTERM)
		testkit.WaitFor(t, "the grandchild to release its memory", 30*time.Second, func() bool { _, ok := readProc(t, dir, gc); return !ok })
	})
}

func TestProgressLinesDuringLongPhases(t *testing.T) {
	t.Parallel()
	for _, silent := range []bool{false, true} {
		t.Run(fmt.Sprintf("silent=%v", silent), func(t *testing.T) {
			t.Parallel()
			env := merge(fast, map[string]string{"FAKEVLLM_COMPILE": "300ms", "FAKEVLLM_PROGRESS_EVERY": "50ms"})
			if silent {
				env["FAKEVLLM_SILENT_COMPILE"] = "1"
			}
			p := startSim(t, env, "org/model", "--port", "0")
			p.waitLine("torch.compile takes", 10*time.Second)
			n := 0
			for _, l := range p.snapshot() {
				if strings.Contains(l.text, "Compiling a graph for dynamic shape") {
					n++
				}
			}
			if silent && n != 0 {
				t.Errorf("%d progress lines with FAKEVLLM_SILENT_COMPILE=1", n)
			}
			// At least one; how many depends on how busy the machine is.
			if !silent && n < 1 {
				t.Errorf("no progress line in a 300ms compile at 50ms")
			}
		})
	}
}

func TestEraV1Plain(t *testing.T) {
	t.Parallel()
	p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1"}), "org/model", "--port", "0", "--host", "127.0.0.1")
	_, l := p.waitLine("vLLM server version 0.32.0, serving model org/model", 10*time.Second)
	if !strings.HasPrefix(l.raw, "(APIServer pid=") {
		t.Errorf("v1 line %q, want a plain prefix", l.raw)
	}
	// vLLM 0.32's startup lines, as the real CPU build prints them.
	p.waitLine("[entry.py:136] Supported tasks: ['generate']", 10*time.Second)
	p.waitLine("[entry.py:140] Starting vLLM server on http://127.0.0.1:", 10*time.Second)
	p.waitLine("[launcher.py:186] Available routes are:", 10*time.Second)
	for _, l := range p.snapshot() {
		if strings.Contains(l.raw, "\x1b[") {
			t.Fatalf("ANSI in the v1 era: %q", l.raw)
		}
	}
}

// procSession reads the session id (field 6) of /proc/PID/stat.
func procSession(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	sid, _ := strconv.Atoi(f[3]) // state ppid pgrp session
	return sid
}

// A stream in flight when the engine dies on its own ends with vLLM's
// error event, in the era's shape: 0.32.0 (v1) nests its ErrorResponse's
// error, the exact bytes of its drain's cut; the older servers wrapped their
// flat ErrorResponse ("object": "error") in {"error": ...}. (Should the
// engine be dead before the request, the 500's body has the era's shape.)
func TestEngineDeathEventShapeByEra(t *testing.T) {
	t.Parallel()
	for _, era := range []string{"v1", "v1-ansi"} {
		t.Run(era, func(t *testing.T) {
			t.Parallel()
			env := merge(fast, map[string]string{"FAKEVLLM_ERA": era, "FAKEVLLM_FAULT": "crash_after=1s", "FAKEVLLM_TOKEN_INTERVAL": "100ms"})
			_, url := startReady(t, env, "org/model")
			resp := postJSON(t, url+"/v1/completions", map[string]any{"model": "org/model", "prompt": "hi", "max_tokens": 200, "stream": true})
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var errObj map[string]any
			if resp.StatusCode == http.StatusOK {
				events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
				if len(events) < 2 || events[len(events)-1] != "data: [DONE]" {
					t.Fatalf("stream %q; want the error event then [DONE]", b)
				}
				last := events[len(events)-2] + "\n\n"
				if era == "v1" && last != drainCutEvent {
					t.Errorf("0.32's event %q, want %q", last, drainCutEvent)
				}
				var ev map[string]any
				if err := json.Unmarshal([]byte(strings.TrimPrefix(last, "data: ")), &ev); err != nil {
					t.Fatalf("event %q: %v", last, err)
				}
				errObj, _ = ev["error"].(map[string]any)
				if _, flat := ev["object"]; flat {
					t.Errorf("event %q: the flat ErrorResponse, which no era sent as a stream event", last)
				}
			} else {
				var body map[string]any
				_ = json.Unmarshal(b, &body)
				if era == "v1" {
					errObj, _ = body["error"].(map[string]any)
				} else {
					errObj = body
				}
			}
			if errObj == nil || errObj["code"] != 500.0 || errObj["type"] != "InternalServerError" ||
				!strings.HasPrefix(fmt.Sprint(errObj["message"]), "EngineCore encountered an issue.") {
				t.Fatalf("HTTP %d %q: no engine error in the era's shape", resp.StatusCode, b)
			}
			if _, has := errObj["object"]; has != (era != "v1") {
				t.Errorf("%s: %q; the error's object field present %v, want %v", era, b, has, era != "v1")
			}
		})
	}
}
