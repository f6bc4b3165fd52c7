package proctree

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
	for line, want := range map[string]Exit{
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
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{f, "serve"}, Env: os.Environ(), Grace: time.Second,
		Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, c)
	if e := c.Exit(); !strings.Contains(e.StartFailure, f) || e.GuardFailure != "" {
		t.Fatalf("exit %+v: want a start failure of the command naming %s", e, f)
	}
}

// A keeper that cannot be started at all is the guard's own failure.
func TestStartWithoutItsKeeperIsTheGuardsFailure(t *testing.T) {
	_, err := Start(Spec{Keeper: []string{"/nonexistent/vllm-guard", KeeperArg}, Argv: []string{"true"}, Env: os.Environ(),
		Grace: time.Second, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err == nil || !strings.Contains(err.Error(), "keeper") {
		t.Fatalf("err %v, want the keeper named", err)
	}
}
