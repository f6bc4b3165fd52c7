package integration

// Issue 15, the process rooms: the guard's own start failures (item 1) and
// descendants that escape the stop (item 4), with the real guard.

import (
	"errors"
	"fmt"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Item 1: a busy host. After vLLM is ready the guard's open-file limit is
// lowered to 3 (fds 0-2 are open: no new descriptor can be had, as when
// idle connections have taken them all), then vLLM's API server is killed.
// The restart's first step, the keeper's report pipe, fails with EMFILE.
// That is the guard's own error, not vLLM's configuration: it must back off
// and retry and say so, never give up with exit 78 (the old code did: the
// shipped unit's RestartPreventExitStatus=78 then keeps the service down).
// Once descriptors are free again the retry brings vLLM back.
func TestGuardsOwnStartFailureIsRetriedNotAConfigError(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.noNVML = true // the release wait would read NVML; this test is about the start
	s.extra = "\n[restart]\ninitial_delay = \"100ms\"\nmax_delay = \"200ms\"\ngive_up_after = 1000\n"
	s.start()
	ready := s.WaitEvent("ready", 1, 30*time.Second, isReady)
	api := ready.PID

	guard := s.Cmd.Process.Pid
	var old unix.Rlimit
	if err := unix.Prlimit(guard, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Prlimit(guard, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 3, Max: old.Max}, nil); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(api, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e := s.WaitEvent("the guard's own start failure", 1, 30*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindExited && strings.HasPrefix(e.Failure.Exit, "the guard could not start vLLM")
	})
	if err := unix.Prlimit(guard, unix.RLIMIT_NOFILE, &old, nil); err != nil {
		t.Fatal(err)
	}
	f := e.Failure
	if f.Verdict.Cause != "crash" || f.Decision.Action != "restart" {
		t.Fatalf("cause %v action %v, want crash and restart", f.Verdict.Cause, f.Decision.Action)
	}
	reason := f.Decision.Reason
	for _, want := range []string{"too many open files", "(its own error, not vLLM's configuration): retrying"} {
		if !strings.Contains(reason, want) {
			t.Fatalf("reason %q does not say %q", reason, want)
		}
	}
	s.WaitEvent("ready after the retry", 2, 60*time.Second, isReady)
	s.stopCleanly(20*time.Second, 5*time.Second)
}

// spawner is a "vLLM" that ignores SIGTERM and keeps starting processes
// that leave its session (setsid), each of which keeps starting children;
// it prints "ready" once five are out.
const spawner = `trap '' TERM
i=0
while :; do
	setsid sh -c 'trap "" TERM; while :; do sleep 1000 & sleep 0.005; done' &
	i=$((i+1))
	[ "$i" = 5 ] && echo ready
	sleep 0.02
done`

func spawnerScene(t *testing.T) *scene {
	s := newScene(t)
	s.noNVML = true
	s.command = fmt.Sprintf("[\"sh\", \"-c\", %q]", spawner)
	s.editConfig = func(c string) string { return strings.Replace(c, `stop_timeout = "3s"`, `stop_timeout = "200ms"`, 1) }
	s.start()
	s.WaitLog("the spawner's ready line", 1, 30*time.Second, msg("ready"))
	return s
}

// Item 4: a stop of a tree that ignores SIGTERM and keeps calling setsid
// leaves nothing behind, at the moment the guard exits (the keeper exits
// only once the tree is empty, and the guard only after the keeper). The
// old code's one snapshot and SIGKILL of the group, keeper included, let
// what was forked after the snapshot escape to init, and still exited 0.
func TestStopLeavesNoDescendantThatCalledSetsid(t *testing.T) {
	t.Parallel()
	s := spawnerScene(t)
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if code := s.WaitExit(60 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if left := s.ours(); len(left) != 0 {
		t.Fatalf("%d processes of vLLM's tree outlived the stop: %v", len(left), describe(left))
	}
	if n := s.CountLogs(msgContains("outlived their keeper")); n != 0 {
		t.Fatalf("the keeper left %d reports of survivors", n)
	}
}

// Item 4: kill -9 of the guard. The keeper gets its parent-death signal
// and must empty the tree alone; its own exit is the event to wait for.
func TestKillNineOfTheGuardLeavesNoDescendantThatCalledSetsid(t *testing.T) {
	t.Parallel()
	s := spawnerScene(t)
	keeper := childOf(t, s.Cmd.Process.Pid)
	fd, err := unix.PidfdOpen(keeper, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	s.Cmd.Process.Signal(syscall.SIGKILL)
	s.WaitExit(10 * time.Second)
	// A pidfd polls readable when its process has exited.
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(time.Until(deadline).Milliseconds()))
		if err != nil && errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			t.Fatalf("the keeper %d did not exit after the guard's death (%v)", keeper, err)
		}
		break
	}
	if left := s.ours(); len(left) != 0 {
		t.Fatalf("%d processes of vLLM's tree outlived the guard: %v", len(left), describe(left))
	}
}

// childOf is the one child of pid (the guard's keeper).
func childOf(t *testing.T, pid int) int {
	t.Helper()
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var kids []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				kids = append(kids, c)
			}
		}
	}
	if len(kids) != 1 {
		t.Fatalf("the guard %d has children %v, want its keeper alone", pid, kids)
	}
	return kids[0]
}
