package proctree

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func testKeeper(t *testing.T) []string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, KeeperArg}
}

func TestKeeperReportsExitCodeAndCleansUpLeftovers(t *testing.T) {
	dir := t.TempDir()
	// The "API server" starts a child that leaves the group (setsid) and
	// one that stays, writes their pids, then exits 3.
	script := `setsid sleep 300 & echo $! > ` + dir + `/escaped; sleep 300 & echo $! > ` + dir + `/stayed; exit 3`
	var out bytes.Buffer
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"sh", "-c", script}, Env: os.Environ(),
		Grace: 2 * time.Second, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.doneC:
	case <-time.After(20 * time.Second):
		t.Fatal("keeper did not finish")
	}
	if c.exit.Code != 3 || c.exit.Signal != "" {
		t.Fatalf("exit %+v, want code 3", c.exit)
	}
	for _, f := range []string{"escaped", "stayed"} {
		b, err := os.ReadFile(dir + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if alive(pid) {
			t.Errorf("%s descendant %d survived the keeper", f, pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestKeeperReportsStartFailure(t *testing.T) {
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"/nonexistent/vllm", "serve"}, Env: os.Environ(), Grace: time.Second,
		Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	<-c.doneC
	if !strings.Contains(c.exit.StartFailure, "/nonexistent/vllm") {
		t.Fatalf("start failure %q does not name the command", c.exit.StartFailure)
	}
}

func TestKeeperReportsSignal(t *testing.T) {
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"sh", "-c", "kill -SEGV $$"}, Env: os.Environ(), Grace: time.Second,
		Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	<-c.doneC
	if c.exit.Signal != "SIGSEGV" {
		t.Fatalf("exit %+v, want SIGSEGV", c.exit)
	}
}

func TestStopKillsGroupAfterTimeoutWhenTERMIsIgnored(t *testing.T) {
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"sh", "-c", "trap '' TERM; sleep 300 & wait"}, Env: os.Environ(),
		Grace: 200 * time.Millisecond, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the script's child", 30*time.Second, func() bool { return len(Descendants(c.keeperPID)) >= 2 })
	tree := Descendants(c.keeperPID)
	c.signalGroup(syscall.SIGTERM)
	select {
	case <-c.doneC:
		t.Fatal("the tree ignored SIGTERM, the keeper must not have exited yet")
	case <-time.After(300 * time.Millisecond):
	}
	c.Kill()
	<-c.doneC
	for _, pid := range tree {
		if alive(pid) {
			t.Errorf("pid %d survived the kill", pid)
		}
	}
}

func TestDescendantsByChildrenFilesMatchesTheScan(t *testing.T) {
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"sh", "-c", "sleep 300 & (sleep 300 & wait) & wait"}, Env: os.Environ(),
		Grace: time.Second, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Kill(); <-c.doneC }()
	testkit.WaitFor(t, "the tree", 30*time.Second, func() bool { return len(scanDescendants(c.keeperPID)) >= 4 })
	fast, ok := childrenFiles(c.keeperPID)
	if !ok {
		t.Fatal("this kernel has no /proc/PID/task/TID/children")
	}
	slow := scanDescendants(c.keeperPID)
	slices.Sort(fast)
	slices.Sort(slow)
	if !slices.Equal(fast, slow) {
		t.Fatalf("children files %v, full scan %v", fast, slow)
	}
}
