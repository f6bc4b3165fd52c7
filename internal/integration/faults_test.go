package integration

// The fault matrix (issue 8): each test injects one fault into the real
// simulator, the real guard or its surroundings, and asserts what the guard
// must do about it. Faults already covered elsewhere (SIGKILL of the API
// server, exit 0 mid-serve, stall while loading, never ready, kill -9 of the
// guard, NVML missing or failing mid-run) are not repeated here.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// quick shortens the simulator's load phases so a fault test spends its
// time on the fault, not on loading.
func quick(s *scene) *scene {
	for k, v := range map[string]string{"FAKEVLLM_LOAD_WEIGHTS": "100ms", "FAKEVLLM_COMPILE": "30ms",
		"FAKEVLLM_KV_PROFILE": "20ms", "FAKEVLLM_GRAPHS": "30ms", "FAKEVLLM_SERVER": "20ms"} {
		if _, set := s.env[k]; !set {
			s.env[k] = v
		}
	}
	return s
}

// oneShot makes the scene's FAKEVLLM_FAULT fire once across restarts.
func oneShot(s *scene, fault string) {
	s.env["FAKEVLLM_FAULT"] = fault
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "fault-fired")
}

func (s *scene) socket() string { return filepath.Join(s.dir, "guard.sock") }

// waitState polls the guard's control socket until it reports state want.
func waitState(t testing.TB, sock string, want string, timeout time.Duration) control.Doc {
	t.Helper()
	c := control.NewClient(sock)
	defer c.CloseIdleConnections()
	var last string
	var d control.Doc
	if !testkit.PollEvery(timeout, 50*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var err error
		d, err = c.Status(ctx)
		cancel()
		if err != nil {
			last = err.Error()
			return false
		}
		last = string(d.Guard.State)
		return last == want
	}) {
		t.Fatalf("guard on %s not %s within %s (last: %s)", sock, want, timeout, last)
	}
	return d
}

// SIGSEGV of the API server: a crash with the signal named, restarted on
// the same rung, ready again.
func TestFaultSegfaultIsRestarted(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	oneShot(s, "segv_after=200ms")
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	f := s.WaitEvent("the segfault", 1, 30*time.Second, isExited)
	if f.Failure.Exit != "killed by SIGSEGV" {
		t.Fatalf("exit %v, want killed by SIGSEGV", f.Failure.Exit)
	}
	if r := f.Failure.Decision.Rung.Index; r != 0 {
		t.Fatalf("a segfault moved the profile to rung %d: only an OOM steps down", r)
	}
	s.WaitEvent("ready after the segfault", 1, 30*time.Second, after(f, isReady))
}

// Every HTTP request hangs while ready: liveness fails `failures` times,
// the guard kills the hung server and starts it again.
func TestFaultHangWhileReadyIsKilled(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	oneShot(s, "hang_after=200ms")
	s.extra = "\n[liveness]\ninterval = \"150ms\"\ntimeout = \"200ms\"\nfailures = 2\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	ready := s.WaitEvent("ready", 1, 30*time.Second, isReady)
	liveness := after(ready, kind(events.KindProbeFailed))
	s.WaitEvent("the liveness failures", 2, 10*time.Second, liveness)
	f := s.WaitEvent("the hang", 1, 10*time.Second, isExited)
	if f.Failure.Verdict.Cause != "hang" {
		t.Fatalf("cause %v, want hang", f.Failure.Verdict.Cause)
	}
	s.WaitEvent("ready again", 2, 30*time.Second, isReady)
	if n := s.CountEvents(func(e events.Event) bool { return liveness(e) && e.Seq < f.Seq }); n < 2 {
		t.Fatalf("%d liveness failures before the kill, want at least failures = 2", n)
	}
}

// /health answers 503 while ready and vLLM stays up: after a grace of one
// liveness interval (1 s at least) for vLLM to exit by itself, a hang (no
// need to count failures), restarted.
func TestFaultHealth503IsRestarted(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	oneShot(s, "health503_after=200ms")
	s.extra = "\n[liveness]\ninterval = \"150ms\"\ntimeout = \"1s\"\nfailures = 100\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	f := s.WaitEvent("the 503", 1, 30*time.Second, isExited)
	if f.Failure.Verdict.Cause != "hang" {
		t.Fatalf("cause %v, want hang", f.Failure.Verdict.Cause)
	}
	s.WaitEvent("ready again", 2, 30*time.Second, isReady)
}

// A server that never becomes ready (completions fail) is not ready forever:
// max_start_time ends the start.
func TestFaultNeverReadyHitsMaxStartTime(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	oneShot(s, "never_ready")
	s.extra = "\n[readiness]\nmax_start_time = \"2s\"\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	f := s.WaitEvent("the start timeout", 1, 30*time.Second, isExited)
	if f.Failure.Verdict.Cause != "hang" {
		t.Fatalf("cause %v, want hang", f.Failure.Verdict.Cause)
	}
	if n := s.CountEvents(isReady); n != 0 {
		t.Fatal("the guard called a server ready that never completed a request")
	}
	s.WaitEvent("ready after the fault", 1, 30*time.Second, isReady)
}

// vLLM ignores SIGTERM: the guard's stop escalates to SIGKILL of the group
// after stop_timeout (3 s in the scene) and still exits 0. The simulator
// leaves its marker when it ignores a SIGTERM; a process that ignores
// SIGTERM and is gone afterwards was killed: the escalation, shown without
// reading the guard's words for it.
func TestFaultIgnoredSIGTERMIsEscalated(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	oneShot(s, "ignore_sigterm")
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if code := s.WaitExit(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if _, err := os.Stat(s.env["FAKEVLLM_FAULT_MARKER"]); err != nil {
		t.Fatalf("vLLM never ignored a SIGTERM (no marker): %v", err)
	}
	if n := s.CountEvents(decided(events.DecisionKill)); n != 1 {
		t.Fatalf("%d kill decisions, want 1 (SIGKILL after stop_timeout)", n)
	}
	s.waitNoProcesses(5 * time.Second)
}

// 50 MB/s of log lines: vLLM's writes never block for long, liveness keeps
// passing, and the control socket keeps answering. The guard logs at warn,
// so the test reads state through the socket, not the log.
func TestFaultLogFloodBlocksNothing(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	// Throughput is measured on the shipped build: the race detector slows
	// the guard's log pump several times over.
	plain, err := testbin.GuardPlain()
	if err != nil {
		t.Fatal(err)
	}
	s.guardBin = plain
	stats := filepath.Join(s.dir, "stats.json")
	s.logLevel = "warn"
	s.env["FAKEVLLM_FAULT"] = "log_flood=50"
	s.env["FAKEVLLM_STATS_FILE"] = stats
	// Liveness every 200 ms, with the shipped timeout (5 s): a simulator
	// flooding on a loaded machine answered /health in over 1 s, which is
	// the machine's speed, not a blocked pump (that would block for good).
	s.extra = "\n[liveness]\ninterval = \"200ms\"\ntimeout = \"5s\"\nfailures = 2\n"
	s.start()
	waitState(t, s.socket(), "ready", 30*time.Second)
	// Wait for 75 MB written (1.5 s of flood) rather than for a fixed time.
	var st struct {
		MaxWriteBlockMS float64 `json:"max_write_block_ms"`
		BytesWritten    float64 `json:"bytes_written"`
	}
	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	// Bounds, not measurements: a pump that stalled the child would never
	// let it write 75 MB, and a status that never came back is an error.
	// How long a write or a status took is a figure of BenchmarkLogFlood.
	// Each look asks for the status (it must come back, and say ready) and
	// reads how much the flood has written, every 100 ms.
	if !testkit.PollEvery(90*time.Second, 100*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		d, err := c.Status(ctx)
		cancel()
		if err != nil {
			t.Fatalf("status during the flood: %v", err)
		}
		if d.Guard.State != "ready" {
			raw, _ := os.ReadFile(stats)
			t.Fatalf("state %s during the flood, want ready; simulator stats: %s", d.Guard.State, raw)
		}
		if raw, err := os.ReadFile(stats); err == nil {
			_ = json.Unmarshal(raw, &st)
		}
		return st.BytesWritten >= 75e6
	}) {
		t.Fatalf("the flood wrote only %.0f bytes in 90 s: vLLM's writes are blocked", st.BytesWritten)
	}
	t.Logf("longest blocked write of vLLM: %.0f ms (goal on the plain build: BenchmarkLogFlood)", st.MaxWriteBlockMS)
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures during the flood", n)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}

// A line of invalid UTF-8 and a line over 1 MiB: the guard's own log stays
// one valid JSON object per line, the long line is cut, vLLM stays ready.
func TestFaultInvalidUTF8AndMegabyteLines(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_FAULT"] = "invalid_utf8,long_line"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	s.WaitLog("the bad UTF-8 line", 1, 10*time.Second, msgContains("cmpl-0badutf8"))
	long := s.WaitLog("the long line", 1, 10*time.Second, msgContains("cmpl-longline"))
	if n := len(long["msg"].(string)); n > 64<<10 {
		t.Errorf("the 1 MiB line was re-emitted with %d bytes: it must be cut", n)
	}
	// One more event after both lines, to be sure the log goes on.
	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	if err := c.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("ready after the restart", 2, 30*time.Second, isReady)
	raw := s.Raw()
	for _, line := range raw {
		var m map[string]any
		if !utf8.ValidString(line) || json.Unmarshal([]byte(line), &m) != nil {
			t.Fatalf("guard log line is not valid UTF-8 JSON: %.200q", line)
		}
	}
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures caused by odd log lines", n)
	}
}

// vLLM's stdout stops reaching the guard early in startup: stderr and the
// probes still carry it to ready, and it is not taken for a failure.
func TestFaultClosedStdoutIsSupervised(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_FAULT"] = "close_stdout"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures after stdout closed", n)
	}
	s.stopCleanly(20*time.Second, 5*time.Second)
}

// hasGrandchild waits until the setsid grandchild of the grandchild fault runs.
func hasGrandchild(t *testing.T, s *scene) int {
	t.Helper()
	found := 0
	if !testkit.PollEvery(10*time.Second, 20*time.Millisecond, func() bool {
		for _, pid := range s.ours() {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.HasPrefix(string(b), "fakevllm-grandchild") {
				found = pid
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no fakevllm-grandchild among %v", describe(s.ours()))
	}
	return found
}

// A descendant that left vLLM's process group (setsid): a SIGTERM of the
// guard stops it too, exit 0.
func TestFaultGrandchildIsStoppedWithTheGuard(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_FAULT"] = "grandchild"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	hasGrandchild(t, s)
	s.stopCleanly(20*time.Second, 10*time.Second)
}

// The same descendant when the guard is SIGKILLed: parent-death reaches it
// too, nothing survives.
func TestFaultGrandchildDiesWithAKilledGuard(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_FAULT"] = "grandchild"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	hasGrandchild(t, s)
	s.Cmd.Process.Signal(syscall.SIGKILL)
	s.WaitExit(10 * time.Second)
	s.waitNoProcesses(10 * time.Second)
}

// SIGTERM of the guard in each waiting state ends it with exit 0 and no
// vLLM process left, without waiting the wait out: while vLLM loads (it
// never became ready), while the guard backs off before a restart (it never
// started vLLM again), and while it waits for a dead vLLM's memory (it
// never saw the release, which the stand-in holds back for 60 s).
func TestFaultSIGTERMWhileWaiting(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(s *scene)
		wait  func(s *scene)
		// waited is the event that would show the guard waiting the wait
		// out instead of stopping.
		waited func(events.Event) bool
	}{
		{"loading", func(s *scene) {
			s.env["FAKEVLLM_LOAD_WEIGHTS"] = "60s"
			s.env["FAKEVLLM_PROGRESS_EVERY"] = "100ms"
		}, func(s *scene) {
			s.WaitEvent("the launch", 1, 30*time.Second, isStarting)
			s.WaitLog("vLLM loading", 1, 30*time.Second, func(m map[string]any) bool { return m["logger"] == "vllm" })
		}, isReady},
		{"backoff", func(s *scene) {
			s.env["FAKEVLLM_FAULT"] = "crash_on_start"
			s.extra = "\n[restart]\ninitial_delay = \"60s\"\nmax_delay = \"60s\"\n"
		}, func(s *scene) {
			s.WaitEvent("backoff", 1, 30*time.Second, inState("backoff"))
		}, inState("starting")},
		{"release_wait", func(s *scene) {
			if err := os.WriteFile(filepath.Join(s.gpuDir, "release_delay_ms"), []byte("60000\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			// A SIGSEGV leaves the dead processes' memory to the driver (a
			// clean exit frees it at once, and the delay would not apply).
			oneShot(s, "segv_after=200ms")
			s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n[gpu]\nsample_interval = \"100ms\"\nrelease_timeout = \"60s\"\n"
		}, func(s *scene) {
			s.WaitEvent("the crash", 1, 30*time.Second, isExited)
			s.WaitEvent("the release wait", 1, 10*time.Second, inState("waiting_gpu"))
		}, inState("backoff")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := quick(newScene(t))
			tc.setup(s)
			s.start()
			tc.wait(s)
			mark := s.Events()
			last := mark[len(mark)-1]
			s.Cmd.Process.Signal(syscall.SIGTERM)
			// A bound, below the 60 s waits; what shows the wait was cut
			// short is the event stream, not the time it took.
			if code := s.WaitExit(40 * time.Second); code != 0 {
				t.Fatalf("exit code %d, want 0", code)
			}
			s.waitNoProcesses(5 * time.Second)
			if n := s.CountEvents(after(last, tc.waited)); n != 0 {
				t.Errorf("after the SIGTERM the guard went on waiting (%d events of what ends the wait)", n)
			}
			if n := s.CountEvents(after(last, isStarting)); n != 0 {
				t.Errorf("%d launches after the SIGTERM", n)
			}
			if n := s.CountEvents(after(last, kind(events.KindStopped))); n != 1 {
				t.Errorf("%d stopped events after the SIGTERM, want 1", n)
			}
		})
	}
}

// A guard restarted while it was writing state.json leaves the temp file
// half-written next to the last complete state.json: the next guard
// resumes from the complete one.
func TestFaultHalfWrittenStateIsNotLoaded(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	dir := filepath.Join(s.dir, "state")
	if err := os.MkdirAll(filepath.Join(dir, "incidents"), 0o750); err != nil {
		t.Fatal(err)
	}
	good, _ := json.Marshal(policy.State{Rung: 1})
	newer, _ := json.Marshal(policy.State{Rung: 2})
	if err := os.WriteFile(filepath.Join(dir, "state.json"), good, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".state.json.tmp-12345"), newer[:len(newer)/2], 0o640); err != nil {
		t.Fatal(err)
	}
	s.start()
	r := s.WaitLog("the resume", 1, 30*time.Second, msg("resuming from the saved state"))
	if r["rung"] != 1.0 {
		t.Fatalf("resumed on rung %v, want 1 (the complete state.json)", r["rung"])
	}
	l := s.WaitEvent("the launch", 1, 30*time.Second, isStarting)
	if rungOf(l) != 1 {
		t.Fatalf("launched on rung %d, want 1", rungOf(l))
	}
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
}

// A state.json that is broken anyway (a disk fault, a hand edit) is moved
// aside with a warning; the guard starts on rung 0.
func TestFaultBrokenStateIsMovedAside(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	dir := filepath.Join(s.dir, "state")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"rung": 2, "profi`), 0o640); err != nil {
		t.Fatal(err)
	}
	s.start()
	s.WaitLog("the warning", 1, 30*time.Second, msgContains("moved it aside"))
	l := s.WaitEvent("the launch", 1, 30*time.Second, isStarting)
	if rungOf(l) != 0 {
		t.Fatalf("launched on rung %d, want 0", rungOf(l))
	}
	aside, _ := filepath.Glob(filepath.Join(dir, "state.json.corrupt-*"))
	if len(aside) != 1 {
		t.Fatalf("%d copies moved aside, want 1", len(aside))
	}
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
}

// A state directory that cannot be created (its parent is a file): the
// guard says so, runs on without persistence, and still keeps incidents in
// memory.
func TestFaultUnwritableStateDirRunsOn(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	if err := os.WriteFile(filepath.Join(s.dir, "file"), []byte("not a folder\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.stateDir = filepath.Join(s.dir, "file", "state")
	oneShot(s, "crash_after=200ms")
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	w := s.WaitLog("the warning", 1, 30*time.Second, msgContains("running without persistence"))
	if !strings.Contains(w["msg"].(string), s.stateDir) {
		t.Errorf("the warning does not name the folder: %q", w["msg"])
	}
	crash := s.WaitEvent("the crash", 1, 30*time.Second, isExited)
	s.WaitEvent("ready after the crash", 1, 30*time.Second, after(crash, isReady))
	d := waitState(t, s.socket(), "ready", 10*time.Second)
	if d.LastIncident == nil || d.LastIncident.Cause == "" {
		t.Fatalf("no incident kept in memory: %+v", d.LastIncident)
	}
	if n := s.CountEvents(func(e events.Event) bool {
		return e.Kind == events.KindIncident && strings.HasPrefix(e.Reason, "not written")
	}); n != 0 {
		t.Fatalf("%d incident write errors in memory mode", n)
	}
}

// runConfigOnly runs `vllm-guard run` with the scene's config edited and
// returns its exit code and output: for faults that stop the guard at once.
// Its events go to s.dir/events.jsonl (see fileEvents).
func runConfigOnly(t *testing.T, s *scene, edit func(string) string) (int, string) {
	t.Helper()
	cfg := filepath.Join(s.dir, "edited.toml")
	if err := os.WriteFile(cfg, []byte(edit(s.configText())), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bins.guard, "run", "--config", cfg, "--events", filepath.Join(s.dir, "events.jsonl"))
	cmd.Env = append(os.Environ(), "FAKENVML_STATE="+s.gpuDir, "LD_LIBRARY_PATH="+bins.nvmlDir)
	out, _ := cmd.CombinedOutput()
	t.Cleanup(s.killLeftovers)
	return cmd.ProcessState.ExitCode(), string(out)
}

// fileEvents reads the events runConfigOnly's guard wrote (none when it
// stopped before it opened the file).
func fileEvents(t *testing.T, s *scene) []events.Event {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(s.dir, "events.jsonl"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Event
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if line == "" {
			continue
		}
		var e events.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("event line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// The control socket's folder is a file: exit 78 naming the path and the
// key to fix, and no vLLM started.
func TestFaultSocketFolderIsAFile(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	blocker := filepath.Join(s.dir, "run")
	os.WriteFile(blocker, nil, 0o644)
	sock := filepath.Join(blocker, "guard.sock")
	code, out := runConfigOnly(t, s, func(c string) string { return strings.Replace(c, s.socket(), sock, 1) })
	if code != 78 {
		t.Fatalf("exit %d, want 78:\n%s", code, out)
	}
	if !strings.Contains(out, blocker) || !strings.Contains(out, "[control] socket") {
		t.Fatalf("the error does not name the path and [control] socket:\n%s", out)
	}
	for _, e := range fileEvents(t, s) {
		if isStarting(e) {
			t.Fatal("vLLM was launched although the guard cannot serve its socket")
		}
	}
}

// The control socket's folder does not exist yet: the guard creates it and
// answers there.
func TestFaultSocketFolderMissingIsCreated(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	sock := filepath.Join(s.dir, "missing", "deeper", "guard.sock")
	s.editConfig = func(c string) string { return strings.Replace(c, s.socket(), sock, 1) }
	s.start()
	waitState(t, sock, "ready", 30*time.Second)
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("socket folder: %v, mode %v; want created 0750", err, fi.Mode().Perm())
	}
}

// vLLM's port is taken by someone else: vLLM fails to bind; the guard
// names the cause as configuration and stops (exit 78) instead of looping.
func TestFaultPortTakenIsAConfigError(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", s.port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	portWait(s, "1s") // held for good at the first start: 78 after port_wait
	s.start()
	if code := s.WaitExit(30 * time.Second); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	f := s.WaitEvent("the failure", 1, time.Second, isExited)
	if f.Failure.Verdict.Cause != "config_error" {
		t.Fatalf("cause %v, want config_error", f.Failure.Verdict.Cause)
	}
	text := verdictText(f)
	if !strings.Contains(strings.ToLower(text), "address already in use") && !strings.Contains(text, fmt.Sprint(s.port)) {
		t.Fatalf("the failure does not say the port is taken: %+v", f.Failure)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d launches into a taken port, want 1", n)
	}
}

// The guard's own HTTP port is taken: exit 78 naming [control] http_listen.
func TestFaultHTTPPortTakenIsAConfigError(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s.httpListen = l.Addr().String()
	s.start()
	if code := s.WaitExit(30 * time.Second); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	e := s.WaitLog("the error", 1, time.Second, msg("cannot listen for HTTP: fix [control] http_listen"))
	if !strings.Contains(fmt.Sprint(e["error"]), l.Addr().String()) {
		t.Fatalf("the error does not name the address: %v", e)
	}
	s.waitNoProcesses(5 * time.Second)
}

// nvmlInit fails (driver not loaded): GPU metrics unavailable, said once,
// vLLM supervised anyway.
func TestFaultNVMLInitFailsStillSupervises(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	os.WriteFile(filepath.Join(s.gpuDir, "init_fault"), []byte("9\n"), 0o644) // NVML_ERROR_DRIVER_NOT_LOADED
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	if n := s.CountLogs(msgContains("GPU metrics unavailable")); n != 1 {
		t.Fatalf("said %d times that GPU metrics are unavailable, want once", n)
	}
}

// NVML reports more memory used than the GPU has: the sample is skipped
// with a warning (no critical alert, no restart), readings resume when
// the numbers are sane again.
func TestFaultImpossibleNVMLNumbersAreSkipped(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.extra = "\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	// reserved > total: used = reserved + processes exceeds total.
	s.writeDevices("GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 95899345920 NVIDIA H100 80GB HBM3")
	w := s.WaitLog("the skipped sample", 1, 10*time.Second, msg("NVML query failed; GPU readings paused until it recovers"))
	if !strings.Contains(fmt.Sprint(w["error"]), "impossible reading") {
		t.Fatalf("warning %v does not say the reading is impossible", w)
	}
	s.writeDevices("GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3")
	s.WaitLog("recovery", 1, 10*time.Second, msg("NVML queries recovered"))
	if n := s.CountLogs(func(m map[string]any) bool { return strings.Contains(fmt.Sprint(m), "gpu_memory_critical") }); n != 0 {
		t.Fatalf("an impossible reading raised gpu_memory_critical (%d log entries)", n)
	}
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures from an NVML reading", n)
	}
}

// apiServer finds the simulator's API server process of the scene (not the
// guard's keeper, which carries the same environment and argv).
func apiServer(t *testing.T, s *scene) int {
	t.Helper()
	for _, pid := range s.ours() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "fakevllm" && args[1] == "serve" {
			return pid
		}
	}
	t.Fatalf("no API server among %v", describe(s.ours()))
	return 0
}

// The API server is SIGKILLed from outside while liveness probes run
// often: the guard reports the kill it saw (a crash, not a hang) and
// restarts on the same rung.
func TestFaultSIGKILLOfTheAPIServerIsACrash(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	// Probes often, but with a timeout no loaded machine runs out of: a
	// 300 ms timeout could call a slow answer a hang before the kill. The
	// dead server refuses at once, so the timeout does not matter to it.
	s.extra = "\n[liveness]\ninterval = \"200ms\"\ntimeout = \"5s\"\nfailures = 2\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	if err := syscall.Kill(apiServer(t, s), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f := s.WaitEvent("the failure", 1, 10*time.Second, isExited)
	if f.Failure.Exit != "killed by SIGKILL" || f.Failure.Verdict.Cause == "hang" {
		t.Fatalf("exit %v, cause %v: want killed by SIGKILL, not a hang", f.Failure.Exit, f.Failure.Verdict.Cause)
	}
	s.WaitEvent("ready again", 2, 30*time.Second, isReady)
}
