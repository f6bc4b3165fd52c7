package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// guardEnv makes the test binary serve the control API on the named
// socket, as a guard does (ListenSocket), as whoever runs it, until its
// stdin closes.
const guardEnv = "VLLM_GUARD_CONTROL_TEST_GUARD"

// guardUID plays the guard's own user (User=vllm).
const guardUID = 1000

func serveGuard(path string) int {
	s, err := ListenSocket(path, newFakeBackend(status.StateReady), nil)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
	s.Close()
	return 0
}

// copySelf puts this test binary where other users may run it (the go
// tool's build folder is private).
func copySelf(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// startAs runs the test binary with env as uid:gid and waits for its
// first line, "listening"; it stops when the test ends.
func startAs(t *testing.T, bin, env string, uid, gid uint32) {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Dir = "/"
	cmd.Env = []string{env}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "listening\n" {
		t.Fatalf("%s as %d:%d: %q", env, uid, gid, line)
	}
}

// A guard running as its own user (uid 1000 here) in a folder of its own
// (0750, as systemd's RuntimeDirectory= or the guard itself makes it,
// under root's folders and a sticky /tmp) is trusted by root, by the
// members of the socket's group, and by `status --all` as root; the same
// server in a folder that others could write in, or that another user
// owns, is not.
func TestRootAndTheSocketsGroupTrustTheGuardsOwnFolder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("playing the guard's user needs root; run the tests as root (CI does)")
	}
	base := shortDir(t)
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := copySelf(t, base)
	mkdir := func(path string, mode os.FileMode, uid int) string {
		t.Helper()
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// As RuntimeDirectory=vllm-guard makes it: the guard's, 0750.
	own := mkdir(filepath.Join(base, "run"), 0o750, guardUID)
	sock := filepath.Join(own, "a.sock")
	startAs(t, bin, guardEnv+"="+sock, guardUID, guardUID)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := NewClient(sock)
	defer c.CloseIdleConnections()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("root asks the guard running as uid %d in its own folder: %v", guardUID, err)
	}
	if err := c.Restart(ctx); err != nil {
		t.Errorf("root asks for a restart: %v", err)
	}
	code, out, errs := runCmd(statusCmd, "--all", "--runtime-dir", own)
	if code != ExitReady || strings.Contains(out, "no answer") {
		t.Errorf("status --all as root: exit %d\n%s\n%s", code, out, errs)
	}

	// A member of the socket's group (gid 1000), not the guard's user.
	member := exec.CommandContext(ctx, bin, "-test.run=^$")
	member.Dir = "/"
	member.Env = []string{helperEnv + "=" + sock}
	member.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{guardUID}}}
	b, err := member.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if code := member.ProcessState.ExitCode(); code != helperOK {
		t.Errorf("uid 65534 in the socket's group: exit %d: %s; want served", code, b)
	}

	// The same server where someone else could have put it: in a folder
	// under one that others can write (not sticky: they could rename the
	// guard's folder and put theirs in its place), in a folder others may
	// write, and in a folder of another user's.
	shared := mkdir(filepath.Join(base, "shared"), 0o777, 0)
	for _, tc := range []struct {
		dir, want string
	}{
		{mkdir(filepath.Join(shared, "g"), 0o750, guardUID), "the folder " + shared + " is mode 0777, writable by other users"},
		{mkdir(filepath.Join(base, "grp"), 0o770, guardUID), "is mode 0770, writable by other users"},
		{mkdir(filepath.Join(base, "nobody"), 0o777, 65534), "belongs to uid 65534"},
	} {
		path := filepath.Join(tc.dir, "g.sock")
		startAs(t, bin, impostorEnv+"="+path, guardUID, guardUID)
		c := NewClient(path)
		_, err := c.Status(ctx)
		c.CloseIdleConnections()
		if !errors.Is(err, ErrNoGuard) || !strings.Contains(err.Error(), "runs as uid 1000") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want refused, saying %q", path, err, tc.want)
		}
	}
}
