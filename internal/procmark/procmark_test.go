package procmark

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A process started with the mark is listed; one whose entry only ends
// with the same text, and one without it, are not; once it has exited
// (a zombie until reaped) it is not listed.
func TestLiveFindsTheMarkedProcessOnly(t *testing.T) {
	mark := "PROCMARK_TEST=" + strconv.FormatInt(time.Now().UnixNano(), 10)
	start := func(env ...string) *exec.Cmd {
		cmd := exec.Command("sleep", "1000")
		cmd.Env = append(os.Environ(), env...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	marked := start(mark)
	lookalike := start("X" + mark)
	plain := start()
	got := Live(mark)
	if !slices.Equal(got, []int{marked.Process.Pid}) {
		t.Fatalf("Live = %v, want only %d (lookalike %d, plain %d)", got, marked.Process.Pid, lookalike.Process.Pid, plain.Process.Pid)
	}
	marked.Process.Kill()
	// Wait for its exit without reaping it: a zombie now.
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, marked.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	if got := Live(mark); len(got) != 0 {
		t.Fatalf("Live = %v after the marked process exited", got)
	}
}
