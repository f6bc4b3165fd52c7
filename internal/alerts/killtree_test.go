package alerts

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/vllm-guard/vllm-guard/internal/config"
)

// treeScript starts, below the shell, a child that left the session with
// setsid and has a child of its own, and a plain child; it prints their
// PIDs on one line and hangs.
const treeScript = `setsid sh -c 'sleep 1000 & echo $! > "$0"; wait' "$2" & a=$!
sleep 1000 & b=$!
while [ ! -s "$2" ]; do sleep 0.01; done
echo "$a $b $(cat "$2")" > "$1"
wait`

// readPIDs reads the line of PIDs the script writes into the FIFO at p: the
// open blocks until the script has started every process.
func readPIDs(t *testing.T, p string) []int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the hook's PIDs: %v", err)
	}
	var pids []int
	for _, s := range strings.Fields(line) {
		pid, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("the hook wrote %q, not PIDs", line)
		}
		pids = append(pids, pid)
	}
	if len(pids) != 3 {
		t.Fatalf("the hook wrote %q, want 3 PIDs", line)
	}
	return pids
}

func fifo(t *testing.T) (fifoPath, scratch string) {
	t.Helper()
	dir := t.TempDir()
	fifoPath = filepath.Join(dir, "pids")
	if err := syscall.Mkfifo(fifoPath, 0o600); err != nil {
		t.Fatal(err)
	}
	return fifoPath, filepath.Join(dir, "inner")
}

// The setsid'd grandchild and its own child are outside the command's
// process group: killing the group alone left them running (issue 15 item
// 10). killTree walks the tree instead; when it returns they are gone.
func TestKillTreeKillsDescendantsThatCalledSetsid(t *testing.T) {
	p, scratch := fifo(t)
	cmd := exec.Command("sh", "-c", treeScript, "hook", p, scratch)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids := readPIDs(t, p)
	if sid, _ := unix.Getsid(pids[0]); sid != pids[0] {
		t.Fatalf("the setsid child %d is in session %d: the script did not leave the session", pids[0], sid)
	}
	if left := killTree(cmd.Process.Pid); len(left) > 0 {
		t.Errorf("killTree reports survivors %v", left)
	}
	_ = cmd.Wait()
	for _, pid := range append(pids, cmd.Process.Pid) {
		if alive(pid) {
			t.Errorf("process %d of the tree is still alive after killTree", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// The dispatcher cancels a hanging command (the guard shutting down; a
// timeout goes through the same cmd.Cancel): nothing of its tree is left
// when delivery returns.
func TestCommandCancelKillsTheWholeTree(t *testing.T) {
	p, scratch := fifo(t)
	hook := script(t, treeScript)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Command: []string{hook, p, scratch}}, log)
	d.commandTimeout = time.Hour // the test ends the command, not a timer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	d.Send(Event{Alert: OOM, Message: "vLLM died"})
	pids := readPIDs(t, p)
	cancel()
	<-done // Run returns once the delivery in progress has ended
	if len(logs.FilterMessageSnippet("alert command stopped").All()) != 1 {
		t.Errorf("want one 'alert command stopped' log, got %v", logs.All())
	}
	if n := len(logs.FilterMessageSnippet("survived").All()); n != 0 {
		t.Errorf("survivors reported: %v", logs.All())
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d of the alert command's tree outlived the command", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
