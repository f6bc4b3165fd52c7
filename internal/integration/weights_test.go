package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// The weight cache daemon ([weights], issue 42 item 2) over the
// simulator's GPU model (vLLM 0.32.0's `vllm preload` and ipc_cache,
// docs/standby-facts.md): 80 GiB, 15 GiB of weights, utilization 0.85.
// The daemon's 15 GiB leave 64.5 GiB free where vLLM's utilization asks
// 68 GiB: only counted in vLLM's budget (as vLLM's own ipc_cache check
// counts them) do they let a restart start.

// weightScene is a guard whose vLLM loads with --load-format ipc_cache,
// its daemon's socket and vLLM's cache in the scene's own folders.
func weightScene(t *testing.T) (*scene, string) {
	s := newScene(t)
	// The socket's path must fit a Unix socket name (108 bytes).
	tmp, err := os.MkdirTemp("", "wc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	cache := s.env["XDG_CACHE_HOME"] // the guard's cache folder, as its units set it
	s.env["TMPDIR"] = tmp
	s.env["FAKEVLLM_ERA"] = "v1" // vLLM 0.32.0's lines: the startup plan's
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--load-format\", \"ipc_cache\"]", bins.fakevllm)
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n[gpu]\nsample_interval = \"100ms\"\nrelease_timeout = \"1s\"\n"
	return s, cache
}

// daemonRank is the pid of the simulator's daemon of rank 0 (the process
// that holds the weights), 0 when none runs.
func (s *scene) daemonRank() int {
	for _, pid := range s.ours() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(b), "\x00__wcdaemon\x00") {
			return pid
		}
	}
	return 0
}

func vllmLine(text string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		s, _ := m["msg"].(string)
		return m["logger"] == "vllm" && strings.Contains(s, text)
	}
}

func daemonLine(text string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		s, _ := m["msg"].(string)
		return m["logger"] == "weight-cache.daemon" && strings.Contains(s, text)
	}
}

// With the daemon, the first start's weights are the daemon's (read from
// the disk once, by it), and a restart after vLLM's death maps them: no
// shard of the checkpoint is read by vLLM, the daemon loads once, its
// memory never blocks the start (the check before it passes with the
// daemon's 15 GiB held) nor is killed at a release timeout; the startup
// plan saved at the first boot under the guard's cache folder is applied
// at the restart. The daemon's death restarts it and vLLM; the guard's
// stop stops the daemon after vLLM and leaves nothing.
func TestWeightDaemonRestartSkipsTheWeightLoad(t *testing.T) {
	t.Parallel()
	s, cache := weightScene(t)
	os.WriteFile(filepath.Join(s.gpuDir, "release_delay_ms"), []byte("3600000\n"), 0o644)
	s.start()
	first := s.WaitEvent("the first ready", 1, 60*time.Second, isReady)
	daemon := s.daemonRank()
	if daemon == 0 {
		t.Fatalf("no weight cache daemon runs: %v", describe(s.ours()))
	}
	mapped := vllmLine("Mapped 291 tensors from the weight cache daemon (zero_copy mode)")
	s.WaitLog("the first start maps the daemon's weights", 1, time.Second, mapped)
	if n := s.CountLogs(daemonLine("Weight cache target daemon rank 0 loaded model")); n != 1 {
		t.Fatalf("the daemon loaded the weights %d times before the first ready, want 1", n)
	}
	s.WaitLog("the startup plan saved in the guard's cache folder", 1, time.Second,
		vllmLine("Saved startup plan to "+filepath.Join(cache, "vllm", "startup_plan")))

	// vLLM dies (SIGKILL of its API server; the keeper kills the rest):
	// its dead EngineCore's memory stays listed (the driver's teardown,
	// an hour here) past release_timeout, and the guard kills what of the
	// old tree still holds memory: never the daemon.
	api := s.WaitEvent("the first start", 1, time.Second, isStarting).PID
	syscall.Kill(api, syscall.SIGKILL)
	s.WaitLog("the release timeout", 1, 60*time.Second, msg("GPU memory still held after release_timeout"))
	os.WriteFile(filepath.Join(s.gpuDir, "release_delay_ms"), []byte("1\n"), 0o644) // the teardown ends
	s.WaitEvent("ready after the kill", 1, 60*time.Second, after(first, isReady))
	if pid := s.daemonRank(); pid != daemon {
		t.Fatalf("the daemon was replaced (pid %d, was %d): the restart had to load the weights again", pid, daemon)
	}
	s.WaitLog("the restart maps the daemon's weights", 2, time.Second, mapped)
	if n := s.CountLogs(vllmLine("Loading safetensors checkpoint shards")); n != 0 {
		t.Fatalf("vLLM read %d shard states from the disk: the weight load was not skipped", n)
	}
	if n := s.CountLogs(daemonLine("loaded model")); n != 1 {
		t.Fatalf("the daemon loaded the weights %d times, want once", n)
	}
	s.WaitLog("the restart applies the startup plan", 1, time.Second, vllmLine("Applying persisted startup plan"))
	for _, e := range s.Events() {
		if e.Kind == events.KindState && strings.Contains(e.Reason, fmt.Sprintf("pid %d", daemon)) {
			t.Fatalf("the daemon named as a holder of memory in %q: %q", e.State, e.Reason)
		}
	}
	if n := s.CountLogs(func(m map[string]any) bool {
		return m["msg"] == "killed a survivor of the old vLLM that still held GPU memory" && m["pid"] == float64(daemon)
	}); n != 0 {
		t.Fatal("the daemon was killed as a survivor of the old vLLM")
	}

	// Status names the daemon, and its processes as the guard's own.
	d := statusDoc(t, s)
	if d.Weights == nil || d.Weights.State != "serving" || !slices.Contains(d.Weights.PIDs, daemon) || d.Weights.Starts != 1 {
		t.Fatalf("status's weight_cache: %+v; want the daemon serving, its rank %d among its pids, started once", d.Weights, daemon)
	}
	var role string
	for _, dev := range d.GPU.Devices {
		for _, p := range dev.Processes {
			if p.PID == daemon {
				role = p.Role
			}
		}
	}
	if role != "weight cache daemon" {
		t.Fatalf("status's GPU processes name the daemon's rank %d as %q", daemon, role)
	}

	// The daemon dies: it starts again, loads again, and vLLM restarts
	// after it (an engine started without it would read the disk).
	syscall.Kill(daemon, syscall.SIGKILL)
	restart := s.WaitEvent("the restart for the daemon's death", 1, 30*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindDecision && e.Decision == events.DecisionRestart && strings.Contains(e.Reason, "its weight cache daemon died (exit code 247)")
	})
	s.WaitEvent("ready after the daemon's death", 1, 60*time.Second, after(restart, isReady))
	if pid := s.daemonRank(); pid == 0 || pid == daemon {
		t.Fatalf("no new daemon (pid %d, the dead one %d)", pid, daemon)
	}
	if n := s.CountLogs(daemonLine("loaded model")); n != 2 {
		t.Fatalf("the daemon loaded the weights %d times, want twice (once per daemon)", n)
	}
	s.WaitLog("vLLM maps the new daemon's weights", 3, time.Second, mapped)
	if n := s.CountLogs(vllmLine("Loading safetensors checkpoint shards")); n != 0 {
		t.Fatalf("vLLM read %d shard states from the disk", n)
	}
	if n := s.CountEvents(isExited); n != 1 {
		t.Fatalf("%d failures of vLLM, want 1 (the kill): the daemon's death is a restart, not vLLM's failure", n)
	}

	// The guard's stop: vLLM first, the daemon last, nothing left.
	s.stopCleanly(30*time.Second, 10*time.Second)
	logs := s.Logs()
	supStopped := slices.IndexFunc(logs, msg("supervisor stopped"))
	daemonStopped := slices.IndexFunc(logs, msg("weight cache daemon stopped"))
	if supStopped < 0 || daemonStopped < supStopped {
		t.Fatalf("vLLM's supervision ended at log line %d, the daemon stopped at %d: want the daemon last", supStopped, daemonStopped)
	}
}

// [weights] cache = "daemon" with a command that loads from the disk: the
// guard adds --load-format ipc_cache to vLLM's command and runs the
// daemon, so the first start already maps its weights.
func TestWeightDaemonKeyAddsTheLoadFormat(t *testing.T) {
	t.Parallel()
	s, _ := weightScene(t)
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\"]", bins.fakevllm)
	s.extra += "\n[weights]\ncache = \"daemon\"\n"
	s.start()
	start := s.WaitEvent("the launch", 1, 60*time.Second, isStarting)
	if !slices.Contains(start.Argv, "ipc_cache") {
		t.Fatalf("vLLM's command %q lacks --load-format ipc_cache", start.Argv)
	}
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	s.WaitLog("vLLM maps the daemon's weights", 1, time.Second, vllmLine("Mapped 291 tensors from the weight cache daemon"))
	if n := s.CountLogs(vllmLine("Loading safetensors checkpoint shards")); n != 0 {
		t.Fatalf("vLLM read %d shard states from the disk", n)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// A daemon that cannot start (its /health port is taken) is tried three
// times; then vLLM starts without it (vLLM's fallback: the disk) rather
// than not at all.
func TestWeightDaemonThatCannotStartLeavesVLLMServing(t *testing.T) {
	t.Parallel()
	s, _ := weightScene(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s.extra += fmt.Sprintf("\n[weights]\nhealth_port = %d\n", ln.Addr().(*net.TCPAddr).Port)
	s.start()
	s.WaitEvent("ready without the daemon", 1, 60*time.Second, isReady)
	if n := s.CountLogs(msg("the weight cache daemon exited before it served: starting it again")); n != 2 {
		t.Fatalf("%d retries of the daemon, want 2 (three starts)", n)
	}
	s.WaitLog("the give-up", 1, time.Second, msgContains("the weight cache daemon does not start: vLLM starts without it"))
	s.WaitLog("vLLM falls back to the disk", 1, time.Second, vllmLine("falling back to disk loading"))
	s.stopCleanly(30*time.Second, 10*time.Second)
}
