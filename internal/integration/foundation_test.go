package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// A load far longer than the stall timeout is not killed while it makes
// progress: any output line is progress.
func TestSlowLoadIsNotKilled(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	// Progress every 200 ms against a 5 s stall_timeout. The stall clock
	// runs from the change to starting, before the keeper has even started
	// vLLM: on a loaded machine that start alone took 1.4 s, and a 1.5 s
	// timeout killed loads that were printing progress. The load is still
	// over twice the timeout.
	s.env["FAKEVLLM_LOAD_WEIGHTS"] = "11s"
	s.env["FAKEVLLM_PROGRESS_EVERY"] = "200ms"
	s.extra = "\n[readiness]\nstall_timeout = \"5s\"\npoll_interval = \"250ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d launches, want 1: the slow load was killed", n)
	}
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures during a slow but progressing load", n)
	}
}

// Silence while loading longer than stall_timeout is a hang.
func TestStallWhileLoadingIsAHang(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "hang_loading"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "fault-fired")
	// 3 s, not 1 s: the stall clock starts before vLLM does, and the run
	// after the hang must get its first line out within it.
	s.extra = "\n[readiness]\nstall_timeout = \"3s\"\n[restart]\ninitial_delay = \"100ms\"\n"
	s.start()
	f := s.WaitEvent("a hang", 1, 30*time.Second, exitedWith("hang"))
	if !strings.Contains(f.Failure.Verdict.Summary, "no load progress") {
		t.Fatalf("hang summary %q does not say why", f.Failure.Verdict.Summary)
	}
	s.WaitEvent("ready after the hang", 1, 30*time.Second, isReady)
}

// READY only after a completion succeeds: a server whose /health answers but
// which cannot complete is never called ready.
func TestNotReadyUntilACompletionSucceeds(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "never_ready"
	s.start()
	// Several readiness probes answered (not refused) and failed: each was
	// a chance to call it ready, counted, not timed.
	s.WaitEvent("three answered readiness probes", 3, 30*time.Second, answeredProbeFailure)
	if n := s.CountEvents(isReady); n != 0 {
		t.Fatal("the guard said ready although completions fail")
	}
}

// answeredProbeFailure matches a readiness probe that vLLM answered (the
// port open, the server up) with something that is not ready: an error
// status, or /v1/models without the model.
func answeredProbeFailure(e events.Event) bool {
	return e.Kind == events.KindProbeFailed && e.Probe != nil && e.Probe.Status != 0
}

// A healthy start: vLLM answered a completion and the guard says ready.
// The simulator's own counters show the completion (the guard drops the
// access lines of its own probes from its log); the order within the
// guard, ready only after a completion's 200, is the supervisor's machine
// tests'.
func TestReadyAfterTheCompletionProbe(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.start()
	ready := s.WaitEvent("ready", 1, 30*time.Second, isReady)
	m, err := simMetrics(s.port)
	if err != nil {
		t.Fatal(err)
	}
	if m["vllm:generation_tokens_total"] < 1 {
		t.Fatalf("ready, but vLLM generated no token: %v", m["vllm:generation_tokens_total"])
	}
	if n := s.CountEvents(after(ready, kind(events.KindProbeFailed))); n != 0 {
		t.Fatalf("%d probes failed after ready", n)
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
	f := s.WaitEvent("the failure", 1, 30*time.Second, isExited)
	if f.Failure.Exit != "exit code 0" {
		t.Fatalf("exit %v, want exit code 0", f.Failure.Exit)
	}
	s.WaitEvent("ready after the failure", 1, 30*time.Second, after(f, isReady))
	if n := s.CountEvents(isStarting); n != 2 {
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
	first := s.WaitEvent("the first ready", 1, 30*time.Second, isReady)
	_ = first
	f := s.WaitEvent("the failure", 1, 30*time.Second, isExited)
	if f.Failure.Exit != "killed by SIGKILL" {
		t.Fatalf("exit %v, want killed by SIGKILL", f.Failure.Exit)
	}
	// During the backoff no process of the old tree may be alive.
	s.WaitEvent("backoff", 1, 10*time.Second, inState("backoff"))
	if left := s.ours(); len(left) != 0 {
		t.Fatalf("old vLLM processes alive during backoff: %v", describe(left))
	}
	s.WaitEvent("ready again", 2, 30*time.Second, isReady)
}

// kill -9 of the guard leaves no vLLM process behind.
func TestKillNineOfTheGuardLeavesNoVLLM(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	if len(s.ours()) < 2 {
		t.Fatalf("expected the API server and EngineCore running, found %v", describe(s.ours()))
	}
	s.Cmd.Process.Signal(syscall.SIGKILL)
	s.WaitExit(10 * time.Second)
	s.waitNoProcesses(10 * time.Second)
}

// SIGTERM to the guard stops vLLM gracefully and exits 0.
func TestSIGTERMStopsCleanly(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if code := s.WaitExit(20 * time.Second); code != 0 {
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
