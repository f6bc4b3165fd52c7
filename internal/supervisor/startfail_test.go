package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// Issue 15 item 1: whose fault a failed start is. Only the command itself
// (missing, not executable, not a program) is configuration; the keeper's
// own trouble (no fd, no process slot, no memory) is the guard's.
func TestStartFailureKind(t *testing.T) {
	_, notFound := lookPath("/nonexistent/vllm")
	_, notInPath := lookPath("no-such-vllm-anywhere")
	for _, c := range []struct {
		err  error
		want string
	}{
		{notFound, startFailedCommand},
		{notInPath, startFailedCommand},
		{&os.PathError{Op: "fork/exec", Path: "/x/vllm", Err: syscall.EACCES}, startFailedCommand},
		{&os.PathError{Op: "fork/exec", Path: "/x/vllm", Err: syscall.ENOEXEC}, startFailedCommand},
		{&os.PathError{Op: "fork/exec", Path: "/x/vllm", Err: syscall.ENOENT}, startFailedCommand},
		{&os.PathError{Op: "fork/exec", Path: "/x/vllm", Err: syscall.EMFILE}, startFailedGuard},
		{&os.PathError{Op: "fork/exec", Path: "/x/vllm", Err: syscall.EAGAIN}, startFailedGuard}, // tasks limit
		{&os.PathError{Op: "fork/exec", Path: "/x/vllm", Err: syscall.ENOMEM}, startFailedGuard},
		{&os.PathError{Op: "open", Path: os.DevNull, Err: syscall.ENFILE}, startFailedGuard},
		{errors.New("something else"), startFailedGuard},
	} {
		if got := startFailureKind(c.err); got != c.want {
			t.Errorf("%v: %s, want %s", c.err, got, c.want)
		}
	}
}

func TestParseStartFailed(t *testing.T) {
	for line, want := range map[string]exitInfo{
		"start-failed command /x/vllm: not an executable file\n": {Code: -1, StartFailure: "/x/vllm: not an executable file"},
		"start-failed guard fork/exec /x/vllm: resource temporarily unavailable\n": {Code: -1,
			GuardFailure: "fork/exec /x/vllm: resource temporarily unavailable"},
		"start-failed an old keeper's message\n": {Code: -1, StartFailure: "an old keeper's message"},
	} {
		if got := parseStartFailed(line); got.String() != want.String() || got.StartFailure != want.StartFailure || got.GuardFailure != want.GuardFailure {
			t.Errorf("%q: %+v, want %+v", line, got, want)
		}
	}
	got := parseDoneLine("done survivors=2 pids=12:345,13:346\n")
	if len(got) != 2 || got[0] != (procID{12, 345}) || got[1] != (procID{13, 346}) {
		t.Errorf("done line: %v", got)
	}
	if got := parseDoneLine("done survivors=0 pids=\n"); len(got) != 0 {
		t.Errorf("empty done line: %v", got)
	}
}

// A command that is not executable is the command's fault (configuration),
// through the real keeper.
func TestKeeperReportsANonExecutableCommandAsTheCommands(t *testing.T) {
	f := filepath.Join(t.TempDir(), "vllm")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := start(launchSpec{keeper: testKeeper(t), argv: []string{f, "serve"}, env: os.Environ(), grace: time.Second,
		stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, c)
	if e := c.exit(); !strings.Contains(e.StartFailure, f) || e.GuardFailure != "" {
		t.Fatalf("exit %+v: want a start failure of the command naming %s", e, f)
	}
}

// A keeper that cannot be started at all is the guard's own failure.
func TestStartWithoutItsKeeperIsTheGuardsFailure(t *testing.T) {
	_, err := start(launchSpec{keeper: []string{"/nonexistent/vllm-guard", KeeperArg}, argv: []string{"true"}, env: os.Environ(),
		grace: time.Second, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if err == nil || !strings.Contains(err.Error(), "keeper") {
		t.Fatalf("err %v, want the keeper named", err)
	}
}

// The machine: a launch that fails for the guard's own reasons (here a
// pipe without file descriptors) is a crash of the start, retried after a
// backoff with the reason said, never a configuration error (exit 78).
func TestMachineGuardsOwnStartFailureIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, nil)
		s.l.fail = fmt.Errorf("start vLLM: report pipe: %w", &os.SyscallError{Syscall: "pipe2", Err: syscall.EMFILE})
		s.start()
		f := s.failure(1)
		if f.Verdict.Cause != policy.CauseCrash || f.Decision.Action != policy.ActionRestart {
			t.Fatalf("verdict %+v decision %+v: want a crash, restarted", f.Verdict, f.Decision)
		}
		for _, want := range []string{"the guard could not start vLLM: start vLLM: report pipe: pipe2: too many open files",
			"(its own error, not vLLM's configuration)", "retrying"} {
			if !strings.Contains(f.Decision.Reason, want) {
				t.Fatalf("reason %q does not say %q", f.Decision.Reason, want)
			}
		}
		if !strings.Contains(f.Exit, "the guard could not start vLLM") {
			t.Fatalf("exit %q", f.Exit)
		}
		s.wantState(StateBackoff)
		s.advance(f.Decision.Delay)
		if f2 := s.failure(2); f2.Verdict.Cause != policy.CauseCrash {
			t.Fatalf("second attempt: %+v", f2.Verdict)
		}
		if code := s.stop(); code != 0 {
			t.Fatalf("exit %d after a stop, want 0", code)
		}
	})
}
