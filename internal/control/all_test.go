package control

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// listenIn serves b on dir/name.sock.
func listenIn(t *testing.T, dir, name string, b Backend) {
	t.Helper()
	s, err := ListenSocket(filepath.Join(dir, name+".sock"), b, nil)
	if err != nil {
		t.Fatalf("ListenSocket: %v", err)
	}
	t.Cleanup(func() { s.Close() })
}

// staleSocket leaves a socket file nobody listens on, as a guard killed
// with SIGKILL does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
}

func TestStatusAll(t *testing.T) {
	dir := shortDir(t)
	a, b := newFakeBackend(status.StateReady), newFakeBackend(status.StateBackoff)
	listenIn(t, dir, "a", a)
	listenIn(t, dir, "b", b)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a socket"), 0o600)

	code, out, errs := runCmd(statusCmd, "--all", "--runtime-dir", dir)
	if code != 1 || errs != "" {
		t.Errorf("one ready, one in backoff: exit %d, want 1\n%s\n%s", code, out, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "INSTANCE") || !strings.Contains(lines[0], "GPUS (used/total)") ||
		!strings.HasPrefix(lines[1], "a ") || !strings.Contains(lines[1], "ready") ||
		!strings.HasPrefix(lines[2], "b ") || !strings.Contains(lines[2], "backoff") {
		t.Fatalf("the table:\n%s", out)
	}
	for _, want := range []string{"0: 62.0/80.0 GiB, 1: 74.4/80.0 GiB", "oom (rung 0 → 1)"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("instance a's line lacks %q:\n%s", want, lines[1])
		}
	}

	b.setState(status.StateReady, "")
	t.Setenv(RuntimeDirEnv, dir) // the variable stands for --runtime-dir
	if code, out, errs := runCmd(statusCmd, "--all"); code != 0 {
		t.Errorf("both ready: exit %d, want 0\n%s\n%s", code, out, errs)
	}

	code, out, _ = runCmd(statusCmd, "--all", "--json")
	var insts []Instance
	if err := json.Unmarshal([]byte(out), &insts); code != 0 || err != nil || len(insts) != 2 ||
		insts[0].Name != "a" || insts[1].Status == nil || insts[1].Status.Guard.State != status.StateReady {
		t.Errorf("--json: exit %d, %v\n%s", code, err, out)
	}

	// A socket left by a killed guard: listed as not answering, exit 1.
	staleSocket(t, filepath.Join(dir, "c.sock"))
	code, out, _ = runCmd(statusCmd, "--all")
	if code != 1 || !strings.Contains(out, "c  ") || !strings.Contains(out, "no answer") || !strings.Contains(out, "no vllm-guard answers on") {
		t.Errorf("a stale socket: exit %d, want 1 and the socket listed as not answering\n%s", code, out)
	}
}

func TestStatusAllNoGuard(t *testing.T) {
	empty := shortDir(t)
	code, out, errs := runCmd(statusCmd, "--all", "--runtime-dir", empty)
	if code != 3 || out != "" || !strings.Contains(errs, "no guard socket (*.sock) in "+empty) {
		t.Errorf("no socket: exit %d, want 3\n%s\n%s", code, out, errs)
	}
	staleSocket(t, filepath.Join(empty, "x.sock"))
	if code, out, _ := runCmd(statusCmd, "--all", "--runtime-dir", empty); code != 3 || !strings.Contains(out, "no answer") {
		t.Errorf("only a stale socket: exit %d, want 3\n%s", code, out)
	}
	for _, args := range [][]string{{"--all", "--watch"}, {"--all", "--socket", "/x.sock"}, {"--all", "--instance", "a"}} {
		if code, _, errs := runCmd(statusCmd, args...); code != 2 || !strings.Contains(errs, "--all lists every instance") {
			t.Errorf("%v: exit %d, want 2 (usage)\n%s", args, code, errs)
		}
	}
}

func TestSocketCommandsTakeAnInstance(t *testing.T) {
	t.Setenv("VLLM_GUARD_CONFIG", "")
	// No such instance runs here: the error names its socket.
	code, _, errs := runCmd(statusCmd, "--instance", "nosuch-vg-test")
	if code != 3 || !strings.Contains(errs, "/run/vllm-guard/nosuch-vg-test.sock") {
		t.Errorf("--instance: exit %d, want 3 naming the instance's socket\n%s", code, errs)
	}
	t.Setenv("VLLM_GUARD_INSTANCE", "nosuch-vg-env")
	if code, _, errs := runCmd(statusCmd); code != 3 || !strings.Contains(errs, "/run/vllm-guard/nosuch-vg-env.sock") {
		t.Errorf("$VLLM_GUARD_INSTANCE: exit %d\n%s", code, errs)
	}
	if code, _, errs := runCmd(func(a []string, o, e *bytes.Buffer) int { return ActionCommand("restart", a, o, e) }, "--instance", "../up"); code != 2 || !strings.Contains(errs, "--instance") {
		t.Errorf("a bad instance name: exit %d, want 2\n%s", code, errs)
	}
	// An explicit socket wins over the instance's.
	_, path := startSocket(t, newFakeBackend(status.StateReady), nil)
	if code, _, errs := runCmd(statusCmd, "--instance", "other", "--socket", path); code != 0 {
		t.Errorf("--socket with --instance: exit %d\n%s", code, errs)
	}
}
