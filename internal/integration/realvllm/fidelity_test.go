package realvllm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// server is one `vllm serve` (the real one or the simulator) run directly,
// without the guard, with its output kept.
type server struct {
	t     *testing.T
	name  string
	port  int
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
	code  int
}

// serve starts bin serve args… on a free port with env added.
func serve(t *testing.T, name, bin string, env map[string]string, args ...string) *server {
	t.Helper()
	s := &server{t: t, name: name, port: testkit.FreePort(t), done: make(chan struct{})}
	s.cmd = exec.Command(bin, append(append([]string{"serve"}, args...), "--host", "127.0.0.1", "--port", fmt.Sprint(s.port))...)
	s.cmd.Env = os.Environ()
	for k, v := range env {
		s.cmd.Env = append(s.cmd.Env, k+"="+v)
	}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = s.cmd.Stdout
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		sc.Split(vllmlog.ScanLines)
		for sc.Scan() {
			s.mu.Lock()
			s.lines = append(s.lines, vllmlog.StripANSI(sc.Text()))
			s.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, out)
		_ = s.cmd.Wait()
		s.code = s.cmd.ProcessState.ExitCode()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	})
	return s
}

func (s *server) url(path string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", s.port, path) }

// waitUp waits until /health answers 200.
func (s *server) waitUp() {
	s.t.Helper()
	up := testkit.PollEvery(startBound, 100*time.Millisecond, func() bool {
		select {
		case <-s.done:
			s.t.Fatalf("%s exited %d before it served:\n%s", s.name, s.code, s.tail())
		default:
		}
		return get(s.url("/health"), "").status == 200
	})
	if !up {
		s.t.Fatalf("%s did not serve within %s:\n%s", s.name, startBound, s.tail())
	}
}

func (s *server) waitExit() int {
	s.t.Helper()
	select {
	case <-s.done:
		return s.code
	case <-time.After(exitBound):
		s.t.Fatalf("%s did not exit within %s", s.name, exitBound)
		return -1
	}
}

func (s *server) output() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lines)
}

func (s *server) tail() string {
	l := s.output()
	return strings.Join(l[max(0, len(l)-30):], "\n")
}

// simEnv runs the simulator as the newest vLLM it imitates, with a token
// pace slow enough that a stream outlives a signal, and characters split
// over ids as the tiny model's byte-level tokenizer splits them.
func simEnv(t *testing.T) map[string]string {
	return map[string]string{"FAKEVLLM_ERA": "v1", "FAKEVLLM_TOKEN_INTERVAL": "10ms", "FAKEVLLM_SPLIT_CHARS": "1", "FAKEVLLM_TEST_ID": t.Name()}
}

// observe asks a generative server everything the guard relies on and
// writes down what it answered, in words both sides can be compared by.
func observe(s *server, key, name string) map[string]string {
	obs := map[string]string{}
	code := func(a answer) string {
		if a.err != nil {
			return "refused"
		}
		return fmt.Sprint(a.status)
	}
	obs["GET /health"] = code(get(s.url("/health"), ""))
	obs["GET /metrics"] = code(get(s.url("/metrics"), ""))
	obs["GET /v1/models without the key"] = code(get(s.url("/v1/models"), ""))
	obs["GET /v1/models with a wrong key"] = code(get(s.url("/v1/models"), "sk-wrong"))
	models := get(s.url("/v1/models"), key)
	obs["GET /v1/models"] = code(models)
	obs["/v1/models lists the name"] = fmt.Sprint(strings.Contains(models.body, `"id":"`+name+`"`) || strings.Contains(models.body, `"id": "`+name+`"`))
	c := post(s.url("/v1/completions"), key, completion(name, 3, false))
	obs["POST /v1/completions"] = fmt.Sprintf("%s finish=%s tokens=%d", code(c), c.finish, c.tokens)
	chat := post(s.url("/v1/chat/completions"), key, map[string]any{"model": name, "max_tokens": 3, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": "hi"}}})
	obs["POST /v1/chat/completions"] = fmt.Sprintf("%s finish=%s tokens=%d", code(chat), chat.finish, chat.tokens)
	obs["POST /v1/completions unknown model"] = code(post(s.url("/v1/completions"), key, completion("no-such-model", 1, false)))
	obs["POST /tokenize"] = code(post(s.url("/tokenize"), key, map[string]any{"model": name, "prompt": "hello"}))
	obs["POST /v1/embeddings on a generative model"] = code(post(s.url("/v1/embeddings"), key, map[string]any{"model": name, "input": "x"}))
	obs["GET /v1/no-such-route"] = code(get(s.url("/v1/no-such-route"), key))
	m, err := metrics(s.url("/metrics"))
	for _, series := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
		"vllm:engine_sleep_state"} {
		_, ok := m[series]
		obs["/metrics has "+series] = fmt.Sprint(err == nil && ok)
	}
	obs["/metrics counts the 6 generated tokens"] = fmt.Sprint(m["vllm:generation_tokens_total"] >= 6)
	return obs
}

// startupSeen is what the guard's log pump recognises in a server's
// output: the load phases, in order of first sight, and uvicorn's line.
func startupSeen(lines []string) map[string]string {
	var phases []string
	complete := false
	for _, l := range lines {
		if p := vllmlog.LoadPhase(l); p != "" && !slices.Contains(phases, p) {
			phases = append(phases, p)
		}
		complete = complete || vllmlog.IsStartupComplete(l)
	}
	return map[string]string{"load phases recognised": strings.Join(phases, ","), "startup complete seen": fmt.Sprint(complete)}
}

// TestSimulatorAgreesWithRealVLLM runs the same requests against the real
// vLLM and the simulator and compares what they answer: endpoints and
// status codes, /metrics names, the startup lines the pump recognises, the
// drain, the exit codes. Where they differ, the simulator is wrong.
func TestSimulatorAgreesWithRealVLLM(t *testing.T) {
	scenario(t, "the simulator answers as the real vLLM does")
	const key, name = "sk-fidelity", "tiny"
	common := []string{"--dtype", "float32", "--served-model-name", name, "--api-key", key, "--enforce-eager", "--max-model-len", "4096", "--shutdown-timeout", "60"}
	realEnv := vllmEnv(t.TempDir(), t.Name())

	type side struct {
		obs   map[string]string
		drain map[string]string
	}
	run := func(label, bin string, env map[string]string, modelArg string) side {
		s := serve(t, label, bin, env, append([]string{modelArg}, common...)...)
		s.waitUp()
		obs := observe(s, key, name)
		for k, v := range observeTokens(s, key, name) {
			obs[k] = v
		}
		for k, v := range startupSeen(s.output()) {
			obs[k] = v
		}
		// The drain: a stream in flight, SIGTERM, then a new request.
		drain := map[string]string{}
		// Longer than vLLM 0.32.0 keeps a request going once it drains.
		streamed := startStream(t, s.url("/v1/completions"), key, name, 4000)
		select {
		case <-streamed.first:
		case a := <-streamed.done:
			t.Fatalf("%s: the stream ended before its first token: %+v", label, a)
		}
		_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGTERM)
		// vLLM logs that it is shutting down before it drains; wait for it
		// so the next request lands in the drain, not before it.
		waitLine(t, s, "shutdown triggered", exitBound)
		during := post(s.url("/v1/completions"), key, completion(name, 5, false))
		if during.err != nil {
			drain["a new request during the drain"] = "refused"
		} else {
			drain["a new request during the drain"] = fmt.Sprintf("%d finish=%s tokens=%d", during.status, during.finish, during.tokens)
		}
		_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGTERM) // a second signal: ignored
		a := <-streamed.done
		// Whether vLLM 0.32.0 lets it finish is a race of its own (in
		// some runs its workers get SIGTERM and it is cut ~4 s in, in
		// others it drains): only its end is compared.
		drain["the stream in flight ends with [DONE]"] = fmt.Sprint(a.body == "[DONE]")
		t.Logf("%s: the stream in flight during the drain: finish=%q, error event %v", label, a.finish, a.errEv)
		drain["exit code after SIGTERM"] = fmt.Sprint(s.waitExit())
		return side{obs, drain}
	}
	realSide := run("real vLLM", real.vllm, realEnv, model("tiny-llama"))
	simSide := run("simulator", real.fakevllm, simEnv(t), model("tiny-llama"))

	// An unknown flag.
	unknown := func(bin string, env map[string]string) string {
		s := serve(t, "unknown flag", bin, env, model("tiny-llama"), "--dtype", "float32", "--no-such-flag-anywhere")
		return fmt.Sprint(s.waitExit())
	}
	realSide.obs["exit code on an unknown flag"] = unknown(real.vllm, realEnv)
	simSide.obs["exit code on an unknown flag"] = unknown(real.fakevllm, simEnv(t))

	// A pooling model.
	pooling := func(label, bin string, env map[string]string) map[string]string {
		s := serve(t, label, bin, env, tiny("tiny-embed", 512, "--runner", "pooling", "--served-model-name", "emb", "--enforce-eager")...)
		s.waitUp()
		obs := map[string]string{}
		for _, p := range []string{"/v1/embeddings", "/pooling", "/classify", "/v1/completions", "/v1/chat/completions"} {
			a := post(s.url(p), "", map[string]any{"model": "emb", "input": "hello", "prompt": "hello", "max_tokens": 1,
				"messages": []map[string]string{{"role": "user", "content": "hi"}}})
			obs["pooling: POST "+p] = fmt.Sprint(a.status)
		}
		return obs
	}
	for k, v := range pooling("real vLLM", real.vllm, realEnv) {
		realSide.obs[k] = v
	}
	for k, v := range pooling("simulator", real.fakevllm, simEnv(t)) {
		simSide.obs[k] = v
	}

	var diffs []string
	compare := func(r, s map[string]string) {
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if r[k] != s[k] {
				diffs = append(diffs, fmt.Sprintf("%-45s real: %-30s simulator: %s", k, r[k], s[k]))
			} else {
				t.Logf("agree  %-45s %s", k, r[k])
			}
		}
	}
	compare(realSide.obs, simSide.obs)
	compare(realSide.drain, simSide.drain)
	if len(diffs) > 0 {
		t.Errorf("the simulator differs from vLLM %s:\n%s", real.version, strings.Join(diffs, "\n"))
	}
}

// waitLine waits until the server printed a line containing text.
func waitLine(t *testing.T, s *server, text string, bound time.Duration) {
	t.Helper()
	if testkit.Poll(bound, func() bool {
		return slices.ContainsFunc(s.output(), func(l string) bool { return strings.Contains(l, text) })
	}) {
		return
	}
	t.Fatalf("%s printed no line with %q within %s:\n%s", s.name, text, bound, s.tail())
}

// The guard reads vLLM's flags as vLLM's parser does (abbreviations among
// all of vLLM's flags, internal/vllmargs): the list it reads them against
// is the pinned vLLM's own, as scripts/vllm-flags.py writes it.
func TestFlagListIsThePinnedVLLMs(t *testing.T) {
	cmd := exec.Command(real.python, filepath.Join(real.root, "scripts", "vllm-flags.py"))
	cmd.Env = append(os.Environ(), "VLLM_TARGET_DEVICE=cpu")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/vllm-flags.py: %v\n%s", err, stderr.String())
	}
	want, err := os.ReadFile(filepath.Join(real.root, "internal", "vllmargs", "flags_vllm.go"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("internal/vllmargs/flags_vllm.go is not the pinned vLLM's flag list: run\n  %s scripts/vllm-flags.py > internal/vllmargs/flags_vllm.go", real.python)
	}
}
