package supervisor

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func testKeeper(t *testing.T) []string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, KeeperArg}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestKeeperReportsExitCodeAndCleansUpLeftovers(t *testing.T) {
	dir := t.TempDir()
	// The "API server" starts a child that leaves the group (setsid) and
	// one that stays, writes their pids, then exits 3.
	script := `setsid sleep 300 & echo $! > ` + dir + `/escaped; sleep 300 & echo $! > ` + dir + `/stayed; exit 3`
	var out bytes.Buffer
	c, err := start(launchSpec{keeper: testKeeper(t), argv: []string{"sh", "-c", script}, env: os.Environ(),
		grace: 2 * time.Second, stdout: &out, stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.doneC:
	case <-time.After(20 * time.Second):
		t.Fatal("keeper did not finish")
	}
	if c.exitInfo.Code != 3 || c.exitInfo.Signal != "" {
		t.Fatalf("exit %+v, want code 3", c.exitInfo)
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
	c, err := start(launchSpec{keeper: testKeeper(t), argv: []string{"/nonexistent/vllm", "serve"}, env: os.Environ(), grace: time.Second,
		stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	<-c.doneC
	if !strings.Contains(c.exitInfo.StartFailure, "/nonexistent/vllm") {
		t.Fatalf("start failure %q does not name the command", c.exitInfo.StartFailure)
	}
}

func TestKeeperReportsSignal(t *testing.T) {
	c, err := start(launchSpec{keeper: testKeeper(t), argv: []string{"sh", "-c", "kill -SEGV $$"}, env: os.Environ(), grace: time.Second,
		stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	<-c.doneC
	if c.exitInfo.Signal != "SIGSEGV" {
		t.Fatalf("exit %+v, want SIGSEGV", c.exitInfo)
	}
}

func TestStopKillsGroupAfterTimeoutWhenTERMIsIgnored(t *testing.T) {
	c, err := start(launchSpec{keeper: testKeeper(t), argv: []string{"sh", "-c", "trap '' TERM; sleep 300 & wait"}, env: os.Environ(),
		grace: 200 * time.Millisecond, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the script's child", 5*time.Second, func() bool { return len(Descendants(c.keeperPID)) >= 2 })
	tree := Descendants(c.keeperPID)
	c.signalGroup(syscall.SIGTERM)
	select {
	case <-c.doneC:
		t.Fatal("the tree ignored SIGTERM, the keeper must not have exited yet")
	case <-time.After(300 * time.Millisecond):
	}
	c.kill()
	<-c.doneC
	for _, pid := range tree {
		if alive(pid) {
			t.Errorf("pid %d survived the kill", pid)
		}
	}
}

func TestDescendantsByChildrenFilesMatchesTheScan(t *testing.T) {
	c, err := start(launchSpec{keeper: testKeeper(t), argv: []string{"sh", "-c", "sleep 300 & (sleep 300 & wait) & wait"}, env: os.Environ(),
		grace: time.Second, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.kill(); <-c.doneC }()
	waitFor(t, "the tree", 5*time.Second, func() bool { return len(scanDescendants(c.keeperPID)) >= 4 })
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
