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
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Process-level tests of the production behaviours (issues 13 and 14):
// one per behaviour, each asserting what a regression would break.

// do sends one request and returns the status and body.
func do(t *testing.T, method, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func bearer(k string) map[string]string { return map[string]string{"Authorization": "Bearer " + k} }

func TestAPIKey(t *testing.T) {
	t.Parallel()
	t.Run("flag with two keys", func(t *testing.T) {
		t.Parallel()
		p, url := startReady(t, fast, "org/model", "--api-key", "alpha", "beta")
		_, args := p.waitLine("non-default args:", time.Second)
		if !strings.Contains(args.text, "'api_key': ['alpha', 'beta']") {
			t.Errorf("non-default args %q lack the keys as vLLM prints them", args.text)
		}
		if c, body := do(t, "GET", url+"/v1/models", "", nil); c != 401 || body != `{"error":"Unauthorized"}` {
			t.Errorf("/v1/models without a key: %d %s, want 401 Unauthorized", c, body)
		}
		if c, _ := do(t, "GET", url+"/v1/models", "", bearer("gamma")); c != 401 {
			t.Errorf("/v1/models with a wrong key: %d, want 401", c)
		}
		if c, _ := do(t, "POST", url+"/v1/completions", `{"prompt":"x","max_tokens":1}`, nil); c != 401 {
			t.Errorf("/v1/completions without a key: %d, want 401", c)
		}
		for _, k := range []string{"alpha", "beta"} {
			if c, body := do(t, "GET", url+"/v1/models", "", bearer(k)); c != 200 || !strings.Contains(body, `"id":"org/model"`) {
				t.Errorf("/v1/models with key %s: %d %s", k, c, body)
			}
		}
		if c, _ := do(t, "GET", url+"/v1/models", "", map[string]string{"Authorization": "bearer alpha"}); c != 200 {
			t.Errorf("scheme is case-insensitive in vLLM; got %d", c)
		}
		for _, open := range []string{"/health", "/metrics", "/version"} {
			if c, _ := do(t, "GET", url+open, "", nil); c != 200 {
				t.Errorf("%s without a key: %d, want 200 (open)", open, c)
			}
		}
		p.waitLine(`"GET /v1/models HTTP/1.1" 401 Unauthorized`, 5*time.Second)
	})
	t.Run("VLLM_API_KEY", func(t *testing.T) {
		t.Parallel()
		_, url := startReady(t, merge(fast, map[string]string{"VLLM_API_KEY": "envkey"}), "org/model")
		if c, _ := do(t, "GET", url+"/v1/models", "", nil); c != 401 {
			t.Errorf("without the key: %d, want 401", c)
		}
		if c, _ := do(t, "GET", url+"/v1/models", "", bearer("envkey")); c != 200 {
			t.Errorf("with VLLM_API_KEY's key: %d, want 200", c)
		}
	})
}

func TestPoolingTasks(t *testing.T) {
	t.Parallel()
	merged := "v1" // the newest era follows merged vLLM (0.32)
	pooling := []string{"/pooling", "/classify", "/v1/embeddings", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}
	cases := []struct {
		name     string
		era      string // FAKEVLLM_ERA ("": the default, 2025)
		args     []string
		tasks    string   // the whole supported-tasks line's message
		serves   []string // POST paths answering 200
		notFound []string // POST paths answering 404
	}{
		{"generate", "", []string{"org/model"}, "Supported_tasks: ['generate']", []string{"/v1/completions"}, []string{"/v1/embeddings", "/pooling"}},
		{"task embed, older vLLM", "", []string{"org/model", "--task", "embed"}, "Supported_tasks: ['encode', 'embed']", []string{"/v1/embeddings", "/pooling", "/score"}, []string{"/v1/completions", "/v1/chat/completions", "/classify"}},
		{"runner pooling", "", []string{"org/model", "--runner", "pooling"}, "Supported_tasks: ['encode', 'embed']", []string{"/v1/embeddings"}, []string{"/v1/completions"}},
		{"auto embed by name", "", []string{"BAAI/bge-small-en-v1.5"}, "Supported_tasks: ['encode', 'embed']", []string{"/v1/embeddings"}, []string{"/v1/completions"}},
		{"auto classify by name", "", []string{"BAAI/bge-reranker-v2-m3"}, "Supported_tasks: ['encode', 'classify', 'score']", []string{"/classify", "/pooling", "/score"}, []string{"/v1/completions", "/v1/embeddings"}},
		// Merged vLLM: the newer wording and task names, and no pooling
		// route at all on a generating model.
		{"merged generate", merged, []string{"org/model"}, "Supported tasks: ['generate']", []string{"/v1/completions", "/v1/chat/completions"}, pooling},
		{"merged runner pooling", merged, []string{"org/model", "--runner", "pooling"}, "Supported tasks: ['embed', 'token_embed']",
			[]string{"/v1/embeddings", "/pooling", "/score", "/v1/score"}, []string{"/v1/completions", "/v1/chat/completions", "/classify", "/rerank", "/v2/rerank"}},
		{"merged convert classify", merged, []string{"org/model", "--runner", "pooling", "--convert", "classify"}, "Supported tasks: ['classify', 'token_classify']",
			[]string{"/classify", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}, []string{"/v1/completions", "/v1/embeddings"}},
		{"merged convert embed", merged, []string{"org/model", "--convert", "embed"}, "Supported tasks: ['embed', 'token_embed']", []string{"/v1/embeddings"}, []string{"/v1/completions", "/classify"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": c.era}), c.args...)
			p.waitLine(c.tasks, time.Second)
			body := `{"input":"hello world","prompt":"hello","text_1":"a","text_2":"b","query":"q","documents":["d"],"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
			for _, path := range c.serves {
				if code, out := do(t, "POST", url+path, body, nil); code != 200 {
					t.Errorf("POST %s: %d %s, want 200", path, code, out)
				}
			}
			for _, path := range c.notFound {
				if code, _ := do(t, "POST", url+path, body, nil); code != 404 {
					t.Errorf("POST %s: %d, want 404", path, code)
				}
			}
		})
	}
	t.Run("embedding shape and counters", func(t *testing.T) {
		t.Parallel()
		_, url := startReady(t, fast, "intfloat/e5-large-v2")
		code, out := do(t, "POST", url+"/v1/embeddings", `{"model":"intfloat/e5-large-v2","input":["aaaabbbb","cccc"]}`, nil)
		var resp struct {
			Object string `json:"object"`
			Data   []struct {
				Object    string    `json:"object"`
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
		}
		if code != 200 || json.Unmarshal([]byte(out), &resp) != nil || resp.Object != "list" || len(resp.Data) != 2 || resp.Data[0].Object != "embedding" || len(resp.Data[0].Embedding) == 0 {
			t.Fatalf("embeddings: %d %s", code, out)
		}
		if v := metricValue(t, url, "vllm:prompt_tokens_total"); v != 3 {
			t.Errorf("prompt tokens %v after an embedding of 3 tokens", v)
		}
	})
}

func TestServedNamesConfigAndModelFlag(t *testing.T) {
	t.Parallel()
	t.Run("several served names", func(t *testing.T) {
		t.Parallel()
		_, url := startReady(t, fast, "org/model", "--served-model-name", "first", "second")
		_, body := do(t, "GET", url+"/v1/models", "", nil)
		if !strings.Contains(body, `"id":"first"`) || !strings.Contains(body, `"id":"second"`) || strings.Contains(body, `"id":"org/model"`) {
			t.Errorf("/v1/models %s, want first and second only", body)
		}
		code, out := do(t, "POST", url+"/v1/completions", `{"model":"second","prompt":"x","max_tokens":1}`, nil)
		if code != 200 || !strings.Contains(out, `"model":"second"`) {
			t.Errorf("completion for the second name: %d %s", code, out)
		}
		if code, _ := do(t, "POST", url+"/v1/completions", `{"model":"org/model","prompt":"x","max_tokens":1}`, nil); code != 404 {
			t.Errorf("the model path is not a served name once names are given: %d, want 404", code)
		}
		if v := metricValue(t, url, `vllm:generation_tokens_total{engine="0",model_name="first"}`); v != 1 {
			t.Errorf("metrics labelled with the first name: %v", v)
		}
	})
	t.Run("config file and overrides", func(t *testing.T) {
		t.Parallel()
		cfg := filepath.Join(t.TempDir(), "vllm.yaml")
		os.WriteFile(cfg, []byte("# a vLLM config\nmodel: cfg/model\nserved-model-name: [x, \"y\"]\nmax_num_seqs: 7\ngpu-memory-utilization: 0.8\napi-key:\n  - secret\nenforce-eager: true\n"), 0o644)
		p, url := startReady(t, fast, "--config", cfg, "--max_num_seqs", "9", "--max-num-seqs", "11")
		_, args := p.waitLine("non-default args:", time.Second)
		for _, s := range []string{"'model_tag': 'cfg/model'", "'max_num_seqs': 11", "'gpu_memory_utilization': 0.8", "'served_model_name': ['x', 'y']", "'enforce_eager': True", "'api_key': ['secret']"} {
			if !strings.Contains(args.text, s) {
				t.Errorf("non-default args %q lack %s", args.text, s)
			}
		}
		_, w := p.waitLine("Found duplicate keys --max-num-seqs", time.Second)
		if !strings.Contains(w.text, "WARNING") {
			t.Errorf("duplicate flag line %q is not a warning", w.text)
		}
		if p.has("instead of via the `--model` option") {
			t.Error("a model from the config file warned as --model")
		}
		_, body := do(t, "GET", url+"/v1/models", "", bearer("secret"))
		if !strings.Contains(body, `"id":"x"`) || !strings.Contains(body, `"id":"y"`) {
			t.Errorf("/v1/models %s, want x and y from the config", body)
		}
	})
	t.Run("deprecated --model", func(t *testing.T) {
		t.Parallel()
		p, url := startReady(t, fast, "--model", "org/flagged")
		_, w := p.waitLine("With `vllm serve`, you should provide the model as a positional argument or in a config file instead of via the `--model` option.", time.Second)
		if !strings.HasPrefix(w.text, "WARNING ") {
			t.Errorf("--model warning %q: want vLLM's unprefixed WARNING line", w.text)
		}
		if _, body := do(t, "GET", url+"/v1/models", "", nil); !strings.Contains(body, `"id":"org/flagged"`) {
			t.Errorf("/v1/models %s, want org/flagged", body)
		}
	})
}

func TestKVCacheMemoryBytesSizesTheBudget(t *testing.T) {
	t.Parallel()
	dir := stateDir(t, 80*gib)
	p, _ := startReady(t, merge(fast, map[string]string{"FAKENVML_STATE": dir, "FAKEVLLM_WEIGHTS_GIB": "3"}),
		"org/model", "--kv-cache-memory-bytes", "2G", "--gpu-memory-utilization", "0.5")
	_, l := p.waitLine("Model loading took", time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	p.waitLine("Available KV cache memory: 2.00 GiB", time.Second)
	// Idle: weights + the KV bytes, not 0.5 × 80 GiB.
	testkit.WaitFor(t, "the engine to hold weights + 2 GiB", 30*time.Second, func() bool {
		m, ok := readProc(t, dir, engine)
		return ok && m[0] == 3*gib+2*gib
	})
}

func TestUvicornOrderListensAfterStartupLine(t *testing.T) {
	t.Parallel()
	gate := filepath.Join(t.TempDir(), "listen")
	port := testkit.FreePort(t)
	p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_LISTEN_GATE": gate}),
		"org/model", "--host", "127.0.0.1", "--port", strconv.Itoa(port))
	p.waitLine("INFO:     Application startup complete.", 20*time.Second)
	// The line is out; uvicorn has not created the server yet: refused.
	if _, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after the line, before listen: %v, want connection refused", err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the port to accept", 30*time.Second, func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func TestAccessLog(t *testing.T) {
	t.Parallel()
	t.Run("every request, client address as the server sees it", func(t *testing.T) {
		t.Parallel()
		p, url := startReady(t, fast, "org/model")
		var local string
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				local = conn.LocalAddr().String()
			}
			return conn, err
		}}}
		resp, err := c.Get(url + "/v1/nothing?x=1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		_, l := p.waitLine(`INFO:     `+local+` - "GET /v1/nothing?x=1 HTTP/1.1" 404 Not Found`, 5*time.Second)
		// uvicorn's access logger writes to stdout (uvicorn's LOGGING_CONFIG).
		if l.stream != "stdout" {
			t.Errorf("access line on %s", l.stream)
		}
	})
	for _, flag := range [][]string{{"--disable-uvicorn-access-log"}, {"--uvicorn-log-level", "warning"}} {
		t.Run(strings.Join(flag, " "), func(t *testing.T) {
			t.Parallel()
			p := startSim(t, fast, append([]string{"org/model", "--host", "127.0.0.1", "--port", "0"}, flag...)...)
			_, l := p.waitLine(" on http://127.0.0.1:", 20*time.Second)
			url := "http://127.0.0.1:" + l.text[strings.LastIndex(l.text, ":")+1:]
			testkit.WaitFor(t, "/health 200", 30*time.Second, func() bool { c, _, _ := get(url+"/health", time.Second); return c == 200 })
			do(t, "GET", url+"/version", "", nil)
			p.signal(syscall.SIGTERM)
			p.waitExit(10 * time.Second)
			p.waitOutputEnd(10 * time.Second)
			if p.has(`"GET /version HTTP/1.1"`) || p.has(`"GET /health HTTP/1.1"`) {
				t.Errorf("access lines with %v:\n%s", flag, p.dump())
			}
			if warn := flag[0] == "--uvicorn-log-level"; warn == p.has("Application startup complete.") {
				t.Errorf("uvicorn's INFO lines with %v: present=%v", flag, !warn)
			}
		})
	}
}

func TestNCCLOutOfMemory(t *testing.T) {
	t.Parallel()
	t.Run("at start", func(t *testing.T) {
		t.Parallel()
		p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_FAULT": "nccl_oom_on_start"}), "org/model", "--port", "0")
		_, l := p.waitLine("NCCL WARN Cuda failure 2 'out of memory'", 10*time.Second)
		if l.stream != "stdout" || strings.Contains(l.text, "pid=") {
			t.Errorf("NCCL line %+v, want NCCL's own unprefixed line on stdout", l)
		}
		p.waitLine("ncclUnhandledCudaError: Call to CUDA function failed.", 5*time.Second)
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 1 {
			t.Errorf("exit %v, want 1", st)
		}
		n := 0
		for _, l := range p.snapshot() {
			if l.stream == "stderr" && strings.HasSuffix(l.text, "Cuda failure 2 'out of memory'") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d traceback lines with the CUDA failure, want 1", n)
		}
	})
	t.Run("while serving", func(t *testing.T) {
		t.Parallel()
		p, _, marker := faultRun(t, "nccl_oom_after=0s", nil, 0)
		waitMarker(t, marker)
		p.waitLine("Cuda failure 2 'out of memory'", 10*time.Second)
		p.waitLine("EngineDeadError", 10*time.Second)
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
			t.Errorf("exit %v, want 0 after a runtime engine death", st)
		}
	})
}

func TestMaxModelLenAuto(t *testing.T) {
	t.Parallel()
	t.Run("fits less than the model's length", func(t *testing.T) {
		t.Parallel()
		// 0.9 × 80 − 15 − 256 × 40 MiB = 47 GiB of KV at 64 MiB per token: 752 tokens.
		p, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_KV_BYTES_PER_TOKEN": "67108864"}), "org/model", "--max-model-len", "auto")
		p.waitLine("Auto-fit max_model_len: reduced from 4096 to 752 to fit in available GPU memory", time.Second)
		if _, body := do(t, "GET", url+"/v1/models", "", nil); !strings.Contains(body, `"max_model_len":752`) {
			t.Errorf("/v1/models %s, want max_model_len 752", body)
		}
	})
	t.Run("not even one token", func(t *testing.T) {
		t.Parallel()
		p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_SEQ_COST_MIB": "1024"}), "org/model", "--port", "0", "--max-model-len", "-1")
		_, l := p.waitLine("ValueError: Cannot auto-fit max_model_len: not enough GPU memory", 10*time.Second)
		if l.stream != "stderr" {
			t.Errorf("on %s", l.stream)
		}
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 1 {
			t.Errorf("exit %v, want 1", st)
		}
	})
}

// streamReq starts a streaming completion and returns the response once
// the first event arrived.
func streamReq(t *testing.T, url string, maxTokens int) (*http.Response, *bufio.Reader) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": maxTokens, "stream": true})
	resp, err := httpClient().Post(url+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	return resp, br
}

// rest reads what is left of a stream: its data events and whether it
// ended with [DONE] (false when the connection was cut).
func rest(br *bufio.Reader) (events int, done bool) {
	for {
		line, err := br.ReadString('\n')
		line = strings.TrimSpace(line)
		if line == "data: [DONE]" {
			return events, true
		}
		if strings.HasPrefix(line, "data: ") {
			events++
		}
		if err != nil {
			return events, false
		}
	}
}

func TestShutdownTimeoutDrains(t *testing.T) {
	t.Parallel()
	env := merge(fast, map[string]string{"FAKEVLLM_TOKEN_INTERVAL": "20ms"})
	t.Run("drain lets the stream finish", func(t *testing.T) {
		t.Parallel()
		p, url := startReady(t, env, "org/model", "--shutdown-timeout", "30")
		_, br := streamReq(t, url, 40)
		p.signal(syscall.SIGTERM)
		p.waitLine("Graceful shutdown: draining in-flight requests", 10*time.Second)
		// Merged vLLM: a new request is accepted and finished at once
		// with finish_reason "abort", nothing generated; no 503.
		if code, body := do(t, "POST", url+"/v1/completions", `{"prompt":"late","max_tokens":1}`, nil); code != 200 ||
			!strings.Contains(body, `"finish_reason":"abort"`) || !strings.Contains(body, `"completion_tokens":0`) {
			t.Errorf("new request while draining: %d %s, want 200 with finish_reason abort and nothing generated", code, body)
		}
		// A second SIGTERM is ignored: the drain goes on.
		p.signal(syscall.SIGTERM)
		events, done := rest(br)
		if !done || events != 39 {
			t.Errorf("stream in flight: %d more events, [DONE]=%v; want 39 and [DONE]", events, done)
		}
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
			t.Errorf("exit %v, want 0", st)
		}
		p.waitOutputEnd(10 * time.Second) // the engine went too
	})
	t.Run("default 0 aborts at once", func(t *testing.T) {
		t.Parallel()
		p, url := startReady(t, env, "org/model")
		_, br := streamReq(t, url, 3000)
		p.signal(syscall.SIGTERM)
		if _, done := rest(br); done {
			t.Error("stream finished with [DONE]; shutdown_timeout 0 must abort it")
		}
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
			t.Errorf("exit %v, want 0", st)
		}
	})
	t.Run("SIGTERM to the EngineCore cuts streams", func(t *testing.T) {
		t.Parallel()
		p, url := startReady(t, env, "org/model", "--shutdown-timeout", "30")
		_, l := p.waitLine("Model loading took", time.Second)
		engine := pidFromPrefix(t, l.text, "EngineCore_0")
		_, br := streamReq(t, url, 3000)
		syscall.Kill(engine, syscall.SIGTERM)
		if _, done := rest(br); done {
			t.Error("stream ended with [DONE] although the engine was killed")
		}
		p.waitLine("EngineCore encountered a fatal error.", 10*time.Second)
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
			t.Errorf("exit %v, want 0 after an engine death", st)
		}
	})
}

// twoGPUs is a stand-in NVML state with two 80 GiB devices.
func twoGPUs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	line := fmt.Sprintf("GPU-aaaa %d %d H100\nGPU-bbbb %d %d H100\n", 80*gib, defaultReserved, 80*gib, defaultReserved)
	if err := os.WriteFile(filepath.Join(dir, "devices"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestTensorParallelWorkers(t *testing.T) {
	t.Parallel()
	workers := func(t *testing.T, p *simProc) [2]int {
		var w [2]int
		for i := range w {
			_, l := p.waitLine(fmt.Sprintf("(Worker_TP%d pid=", i), 10*time.Second)
			w[i] = pidFromPrefix(t, l.text, fmt.Sprintf("Worker_TP%d", i))
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", w[i]))
			if want := fmt.Sprintf("VLLM::Worker_TP%d\x00", i); !strings.HasPrefix(string(cmdline), want) {
				t.Errorf("worker %d cmdline %q, want %q first", i, cmdline, want)
			}
		}
		return w
	}
	t.Run("SIGKILL of the API leaves EngineCore and workers holding memory", func(t *testing.T) {
		t.Parallel()
		dir := twoGPUs(t)
		p, _ := startReady(t, merge(fast, map[string]string{"FAKENVML_STATE": dir, "CUDA_VISIBLE_DEVICES": "0,1"}), "org/model", "-tp", "2")
		w := workers(t, p)
		_, l := p.waitLine("Model loading took", time.Second)
		engine := pidFromPrefix(t, l.text, "EngineCore_0")
		budget := memModel{Total: 80 * gib, Util: 0.9}.budget()
		for i, pid := range w {
			testkit.WaitFor(t, fmt.Sprintf("worker %d to hold its budget on device %d", i, i), 30*time.Second, func() bool {
				m, ok := readProc(t, dir, pid)
				return ok && m[i] == budget && len(m) == 1
			})
		}
		if _, ok := readProc(t, dir, engine); ok {
			t.Error("the EngineCore publishes memory itself with TP=2")
		}
		p.signal(syscall.SIGKILL)
		p.waitExit(10 * time.Second)
		// No parent-death handling: the engine and its workers live on.
		for _, pid := range []int{engine, w[0], w[1]} {
			if !pidAlive(pid) {
				t.Fatalf("pid %d died with the API process; want it orphaned", pid)
			}
		}
		if m, ok := readProc(t, dir, w[1]); !ok || m[1] != budget {
			t.Errorf("orphaned worker 1 holds %v", m)
		}
		// The workers die with their EngineCore (death pipe) and free memory.
		syscall.Kill(engine, syscall.SIGKILL)
		testkit.WaitFor(t, "the workers to exit and free their memory", 30*time.Second, func() bool {
			_, ok0 := readProc(t, dir, w[0])
			_, ok1 := readProc(t, dir, w[1])
			return !pidAlive(w[0]) && !pidAlive(w[1]) && !ok0 && !ok1
		})
	})
	t.Run("SIGTERM to a worker kills the engine", func(t *testing.T) {
		t.Parallel()
		dir := twoGPUs(t)
		p, _ := startReady(t, merge(fast, map[string]string{"FAKENVML_STATE": dir}), "org/model", "--tensor-parallel-size=2")
		w := workers(t, p)
		syscall.Kill(w[1], syscall.SIGTERM)
		p.waitLine("Worker proc VllmWorker-1 died unexpectedly", 10*time.Second)
		p.waitLine("EngineDeadError", 10*time.Second)
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 0 {
			t.Errorf("exit %v, want 0", st)
		}
		p.waitOutputEnd(10 * time.Second)
		if ents, _ := os.ReadDir(filepath.Join(dir, "procs")); len(ents) != 0 {
			t.Errorf("procs files left: %v", ents)
		}
	})
	t.Run("more ranks than GPUs", func(t *testing.T) {
		t.Parallel()
		p := startSim(t, merge(fast, map[string]string{"CUDA_VISIBLE_DEVICES": "0"}), "org/model", "--port", "0", "-tp", "2")
		p.waitLine("ValueError: World size (2) is larger than the number of available GPUs (1)", 10*time.Second)
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 1 {
			t.Errorf("exit %v, want 1", st)
		}
	})
}

func TestWedgeFault(t *testing.T) {
	t.Parallel()
	p, url, marker := faultRun(t, "wedge_after_requests=1", nil, 0)
	url = p.readyURL(mustPort(t, url))
	if code, _ := do(t, "POST", url+"/v1/completions", `{"prompt":"abcdabcd","max_tokens":3}`, nil); code != 200 {
		t.Fatalf("first request: %d", code)
	}
	waitMarker(t, marker)
	gen := metricValue(t, url, "vllm:generation_tokens_total")
	prompt := metricValue(t, url, "vllm:prompt_tokens_total")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"prompt":"stuck","max_tokens":3}`))
		if resp, err := httpClient().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testkit.WaitFor(t, "the wedged request to count as running", 30*time.Second, func() bool {
		return metricValue(t, url, "vllm:num_requests_running") == 1
	})
	if code, _, err := get(url+"/health", 5*time.Second); err != nil || code != 200 {
		t.Errorf("/health while wedged: %d %v, want 200", code, err)
	}
	if g, pr := metricValue(t, url, "vllm:generation_tokens_total"), metricValue(t, url, "vllm:prompt_tokens_total"); g != gen || pr != prompt {
		t.Errorf("counters moved while wedged: generation %v→%v prompt %v→%v", gen, g, prompt, pr)
	}
	select {
	case <-answered:
		t.Error("a request was answered by a wedged engine")
	default:
	}
	cancel()
	<-answered
}

func mustPort(t *testing.T, url string) int {
	t.Helper()
	n, err := strconv.Atoi(url[strings.LastIndex(url, ":")+1:])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSilentDownloadWritesToTheFolder(t *testing.T) {
	t.Parallel()
	dl := t.TempDir()
	p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_DOWNLOAD": "5s", "FAKEVLLM_DOWNLOAD_DIR": dl}), "org/model", "--port", "0")
	_, l := p.waitLine("Loading model from scratch...", 10*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	ioField := func(name string) int64 {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", engine))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, name+": "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatalf("no %s in /proc/%d/io", name, engine)
		return 0
	}
	var st syscall.Statfs_t
	syscall.Statfs(dl, &st)
	tmpfs := st.Type == 0x01021994 // tmpfs writes are not write_bytes
	w0, c0 := ioField("write_bytes"), ioField("wchar")
	testkit.WaitFor(t, "the download to write 8 MiB more", 30*time.Second, func() bool {
		return ioField("wchar") > c0+8*mib && (tmpfs || ioField("write_bytes") > w0+8*mib)
	})
	// Still in the download: nothing printed since the last line.
	lines := p.snapshot()
	if last := lines[len(lines)-1].text; !strings.Contains(last, "Loading model from scratch...") {
		t.Errorf("output during the download: %q", last)
	}
	blobs, _ := filepath.Glob(filepath.Join(dl, "models--org--model", "blobs", "*.incomplete"))
	if len(blobs) != 1 {
		t.Fatalf("download files %v", blobs)
	}
	p.waitLine("Loading safetensors checkpoint shards: 100%", 20*time.Second)
	p.waitLine("Application startup complete.", 20*time.Second)
}
