package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func field(name, value string) func(map[string]any) bool {
	return func(m map[string]any) bool { v, _ := m[name].(string); return v == value }
}

func and(fs ...func(map[string]any) bool) func(map[string]any) bool {
	return func(m map[string]any) bool {
		for _, f := range fs {
			if !f(m) {
				return false
			}
		}
		return true
	}
}

// A load far longer than the stall timeout is not killed while it makes
// progress: any output line is progress.
func TestSlowLoadIsNotKilled(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_LOAD_WEIGHTS"] = "4s"
	s.env["FAKEVLLM_PROGRESS_EVERY"] = "300ms"
	s.extra = "\n[readiness]\nstall_timeout = \"1500ms\"\npoll_interval = \"250ms\"\n"
	s.start()
	s.waitLog("vLLM ready", 1, 60*time.Second, msg("vLLM ready"))
	if n := s.count(msg("launching vLLM")); n != 1 {
		t.Fatalf("%d launches, want 1: the slow load was killed", n)
	}
	if n := s.count(msg("vLLM failed")); n != 0 {
		t.Fatalf("%d failures during a slow but progressing load", n)
	}
}

// Silence while loading longer than stall_timeout is a hang.
func TestStallWhileLoadingIsAHang(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "hang_loading"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "fault-fired")
	s.extra = "\n[readiness]\nstall_timeout = \"1s\"\n[restart]\ninitial_delay = \"100ms\"\n"
	s.start()
	f := s.waitLog("a hang", 1, 30*time.Second, and(msg("vLLM failed"), field("cause", "hang")))
	if !strings.Contains(f["summary"].(string), "no load progress") {
		t.Fatalf("hang summary %q does not say why", f["summary"])
	}
	s.waitLog("ready after the hang", 1, 30*time.Second, msg("vLLM ready"))
}

// READY only after a completion succeeds: a server whose /health answers but
// which cannot complete is never called ready.
func TestNotReadyUntilACompletionSucceeds(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "never_ready"
	s.start()
	s.waitLog("startup complete", 1, 30*time.Second, msgContains("Application startup complete"))
	// Give the guard several polls (250 ms) after the port opened: it must
	// still be starting, never ready.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if n := s.count(msg("vLLM ready")); n != 0 {
			t.Fatal("the guard said ready although completions fail")
		}
		select {
		case <-s.notify:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// The order of events in a healthy start: the completion is answered before
// the guard says ready.
func TestReadyAfterTheCompletionProbe(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.start()
	s.waitLog("vLLM ready", 1, 30*time.Second, msg("vLLM ready"))
	s.mu.Lock()
	defer s.mu.Unlock()
	completion, ready := -1, -1
	for i, m := range s.logs {
		text, _ := m["msg"].(string)
		if completion < 0 && strings.Contains(text, "POST /v1/completions") && strings.Contains(text, "200") {
			completion = i
		}
		if ready < 0 && text == "vLLM ready" {
			ready = i
		}
	}
	if completion < 0 || completion > ready {
		t.Fatalf("completion answered at log entry %d, ready at %d: ready must follow a successful completion", completion, ready)
	}
}

// vLLM exits 0 after an engine death at runtime: that is a failure, restarted.
func TestExitZeroEngineDeathIsRestarted(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "crash_after=300ms"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "fault-fired")
	s.extra = "\n[restart]\ninitial_delay = \"100ms\"\n"
	s.start()
	f := s.waitLog("the failure", 1, 30*time.Second, msg("vLLM failed"))
	if f["exit"] != "exit code 0" {
		t.Fatalf("exit %v, want exit code 0", f["exit"])
	}
	s.waitLog("ready again", 2, 30*time.Second, msg("vLLM ready"))
	if n := s.count(msg("launching vLLM")); n != 2 {
		t.Fatalf("%d launches, want 2", n)
	}
}

// SIGKILL of the API server orphans EngineCore, which holds GPU memory; the
// guard's cleanup leaves none of the old tree before the next start.
func TestOrphanedEngineIsCleanedUpBeforeRestart(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "orphan_after=300ms"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "fault-fired")
	s.extra = "\n[restart]\ninitial_delay = \"2s\"\n"
	s.start()
	first := s.waitLog("the first ready", 1, 30*time.Second, msg("vLLM ready"))
	_ = first
	f := s.waitLog("the failure", 1, 30*time.Second, msg("vLLM failed"))
	if f["exit"] != "killed by SIGKILL" {
		t.Fatalf("exit %v, want killed by SIGKILL", f["exit"])
	}
	// During the backoff no process of the old tree may be alive.
	s.waitLog("backoff", 1, 10*time.Second, msg("state backoff"))
	if left := s.ours(); len(left) != 0 {
		t.Fatalf("old vLLM processes alive during backoff: %v", describe(left))
	}
	s.waitLog("ready again", 2, 30*time.Second, msg("vLLM ready"))
}

// kill -9 of the guard leaves no vLLM process behind.
func TestKillNineOfTheGuardLeavesNoVLLM(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.start()
	s.waitLog("vLLM ready", 1, 30*time.Second, msg("vLLM ready"))
	if len(s.ours()) < 2 {
		t.Fatalf("expected the API server and EngineCore running, found %v", describe(s.ours()))
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.waitExit(10 * time.Second)
	s.waitNoProcesses(10 * time.Second)
}

// SIGTERM to the guard stops vLLM gracefully and exits 0.
func TestSIGTERMStopsCleanly(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.start()
	s.waitLog("vLLM ready", 1, 30*time.Second, msg("vLLM ready"))
	s.cmd.Process.Signal(syscall.SIGTERM)
	if code := s.waitExit(20 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	s.waitNoProcesses(5 * time.Second)
}

// A config with a typo is refused with the key and the line, exit 78.
func TestConfigTypoNamesKeyAndLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "vllm-guard.toml")
	os.WriteFile(cfg, []byte("[vllm]\ncommand = [\"vllm\", \"serve\", \"m\"]\n\n[profile]\nmax_num_seq = 64\n"), 0o644)
	for _, sub := range []string{"check", "run"} {
		out, err := exec.Command(bins.guard, sub, "--config", cfg).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 78 {
			t.Fatalf("%s: err %v, want exit 78; output:\n%s", sub, err, out)
		}
		if !strings.Contains(string(out), ":5") || !strings.Contains(string(out), "max_num_seq") {
			t.Fatalf("%s: message does not name line 5 and the key:\n%s", sub, out)
		}
	}
}
