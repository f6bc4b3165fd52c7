package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Background demand that rung 0 cannot hold and rung 1 can: exactly one
// OOM, one restart on rung 1, ready, and no further restarts.
func TestOneOOMThenStableOnRungOne(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_SEQ_COST_MIB"] = "64"
	s.env["FAKEVLLM_BACKGROUND_SEQS"] = "200"
	s.env["FAKEVLLM_BACKGROUND_AFTER"] = "200ms"
	s.env["FAKEVLLM_BACKGROUND_RAMP"] = "500ms"
	s.extra = "\n[restart]\ninitial_delay = \"200ms\"\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	f := s.WaitEvent("the OOM", 1, 60*time.Second, isExited)
	if f.Failure.Verdict.Cause != "oom" || f.Failure.Decision.Rung.Index != 1 {
		t.Fatalf("failure %+v: want cause oom and next rung 1", f.Failure)
	}
	s.WaitEvent("ready on rung 1", 2, 60*time.Second, isReady)
	ready := s.WaitEvent("ready on rung 1", 2, time.Second, isReady)
	if rungOf(ready) != 1 {
		t.Fatalf("second ready on rung %d, want 1", rungOf(ready))
	}
	// The background demand (200) fills rung 1's batch: once it runs, the
	// simulator's truth says whether rung 1 holds, at any speed.
	seqs := ready.Rung.MaxNumSeqs
	m := s.waitFullBatch(seqs, 30*time.Second)
	if safe := m["fakevllm_true_safe_max_num_seqs"]; safe < float64(seqs) {
		t.Fatalf("rung 1 (max_num_seqs %d) does not hold a full batch: the simulator's safe maximum is %v", seqs, safe)
	}
	if n := s.CountEvents(isExited); n != 1 {
		t.Fatalf("%d failures, want exactly 1", n)
	}
	if n := s.CountEvents(isStarting); n != 2 {
		t.Fatalf("%d launches, want 2", n)
	}
}

// A typo in vLLM's flags: one start, exit 78, and a message naming the flag.
func TestBadFlagStopsAtOnceWith78(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.command = `["` + bins.fakevllm + `", "serve", "test-model", "--max-model-lenn", "4096"]`
	s.start()
	if code := s.WaitExit(30 * time.Second); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d launches, want 1", n)
	}
	f := s.WaitEvent("the failure", 1, time.Second, isExited)
	if f.Failure.Verdict.Cause != "config_error" || !strings.Contains(verdictText(f), "--max-model-lenn") {
		t.Fatalf("failure %+v does not name the flag", f.Failure)
	}
}

// The command does not exist: config_error, exit 78, one start.
func TestMissingCommandIsAConfigError(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.command = `["/nonexistent/vllm", "serve", "m"]`
	s.start()
	if code := s.WaitExit(30 * time.Second); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	f := s.WaitEvent("the failure", 1, time.Second, isExited)
	if !strings.Contains(f.Failure.Verdict.Summary, "/nonexistent/vllm") {
		t.Fatalf("summary %q does not name the command", f.Failure.Verdict.Summary)
	}
}

// A crash at every start: starts spaced by the backoff, then give-up after
// give_up_after, exit 1.
func TestCrashLoopGivesUp(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "crash_on_start"
	s.extra = "\n[restart]\ninitial_delay = \"200ms\"\nmultiplier = 2.0\njitter = 0.0\ngive_up_after = 4\n"
	s.start()
	if code := s.WaitExit(60 * time.Second); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	var launches []time.Time
	for _, e := range s.Events() {
		if isStarting(e) {
			launches = append(launches, e.Time)
		}
	}
	if len(launches) != 4 {
		t.Fatalf("%d starts, want 4 (give_up_after)", len(launches))
	}
	// Gaps grow with the backoff: 200 ms, 400 ms, 800 ms (plus load time).
	// Lower bounds: a slower machine only widens them.
	for i, want := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond} {
		if gap := launches[i+1].Sub(launches[i]); gap < want {
			t.Errorf("gap %d is %s, want at least the backoff %s", i+1, gap, want)
		}
	}
	gaveUp := s.WaitEvent("give up", 1, time.Second, inState("failed"))
	if !strings.Contains(gaveUp.Reason, "gave up") {
		t.Errorf("the failed state says %q, want the give-up", gaveUp.Reason)
	}
}

// A guard restarted (by systemd) resumes on the rung it had reached.
func TestRestartedGuardResumesOnItsRung(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.env["FAKEVLLM_SEQ_COST_MIB"] = "64"
	s.env["FAKEVLLM_BACKGROUND_SEQS"] = "200"
	s.env["FAKEVLLM_BACKGROUND_AFTER"] = "200ms"
	s.extra = "\n[restart]\ninitial_delay = \"200ms\"\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	s.WaitEvent("ready on rung 1", 2, 60*time.Second, isReady)
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if code := s.WaitExit(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	again := s.restart()
	l := again.WaitEvent("the launch", 1, 30*time.Second, isStarting)
	if rungOf(l) != 1 {
		t.Fatalf("restarted guard launched on rung %d, want 1", rungOf(l))
	}
	again.WaitEvent("ready", 1, 30*time.Second, isReady)
}

// A corrupt state.json is moved aside with a warning; the guard starts on
// rung 0 and does not refuse to start.
func TestCorruptStateFileIsMovedAside(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	stateDir := filepath.Join(s.dir, "state")
	os.MkdirAll(stateDir, 0o750)
	os.WriteFile(filepath.Join(stateDir, "state.json"), []byte(`{"rung": 2, "failures": [`), 0o640)
	s.start()
	s.WaitLog("the warning", 1, 30*time.Second, msgContains("state.json.corrupt-"))
	l := s.WaitEvent("the launch", 1, 30*time.Second, isStarting)
	if rungOf(l) != 0 {
		t.Fatalf("launched on rung %d, want 0", rungOf(l))
	}
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	aside, _ := filepath.Glob(filepath.Join(stateDir, "state.json.corrupt-*"))
	if len(aside) != 1 {
		t.Fatalf("moved-aside files: %v", aside)
	}
}
