package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// startSocket serves b on a fresh socket in a folder ListenSocket creates.
func startSocket(t *testing.T, b Backend, log *zap.Logger) (*Server, string) {
	t.Helper()
	path := filepath.Join(shortDir(t), "run", "g.sock")
	s, err := ListenSocket(path, b, log)
	if err != nil {
		t.Fatalf("ListenSocket: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, path
}

// call makes a raw request on the socket and returns the status and body.
func call(t *testing.T, path, method, target string, body io.Reader) (int, string) {
	t.Helper()
	c := NewClient(path)
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://vllm-guard"+target, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(data)
}

func TestSocketModes(t *testing.T) {
	// A strict umask must not leave the socket unusable for the group, nor
	// a loose one open to others: the modes are set, not inherited.
	old := syscall.Umask(0o077)
	_, path := startSocket(t, newFakeBackend(status.StateReady), nil)
	syscall.Umask(old)

	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode()&os.ModeSocket == 0 || info.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", info.Mode())
	}
	dir, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if dir.Mode().Perm() != 0o750 {
		t.Errorf("socket folder mode %v, want 0750", dir.Mode().Perm())
	}
}

func TestSocketExistingFolderKept(t *testing.T) {
	dir := shortDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	s, err := ListenSocket(filepath.Join(dir, "g.sock"), newFakeBackend(status.StateReady), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	info, _ := os.Stat(dir)
	if info.Mode().Perm() != 0o711 {
		t.Errorf("an existing folder's mode changed to %v", info.Mode().Perm())
	}
}

func TestSocketStaleReplaced(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "g.sock")
	// A socket file nobody listens on, as a crashed guard leaves it.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the stale socket is not there: %v", err)
	}

	core, logs := observer.New(zap.InfoLevel)
	s, err := ListenSocket(path, newFakeBackend(status.StateReady), zap.New(core))
	if err != nil {
		t.Fatalf("ListenSocket over a stale socket: %v", err)
	}
	if logs.FilterMessageSnippet("stale control socket").Len() != 1 {
		t.Errorf("the replacement was not logged: %v", logs.All())
	}
	if code, _ := call(t, path, http.MethodGet, "/status", nil); code != http.StatusOK {
		t.Errorf("GET /status on the new socket: %d", code)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left the socket file: %v", err)
	}
}

func TestSocketLiveRefused(t *testing.T) {
	_, path := startSocket(t, newFakeBackend(status.StateReady), nil)
	_, err := ListenSocket(path, newFakeBackend(status.StateReady), nil)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("another vllm-guard (pid %d) holds %s.lock and serves %s", os.Getpid(), path, path)) {
		t.Fatalf("second ListenSocket: %v; want it refused, naming the holder and the path", err)
	}
	// The first guard still serves.
	if code, _ := call(t, path, http.MethodGet, "/status", nil); code != http.StatusOK {
		t.Errorf("the first guard stopped answering: %d", code)
	}
}

func TestSocketNotASocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "g.sock")
	if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ListenSocket(path, newFakeBackend(status.StateReady), nil)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("ListenSocket over a regular file: %v", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "keep me" {
		t.Error("the regular file was touched")
	}
	// A parent that is a file is named too.
	_, err = ListenSocket(filepath.Join(path, "x.sock"), newFakeBackend(status.StateReady), nil)
	if err == nil || !strings.Contains(err.Error(), "is not a folder") {
		t.Fatalf("ListenSocket under a file: %v", err)
	}
}

func TestSocketEndpoints(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	b.incs = []state.Incident{{ID: "b", Cause: "oom"}, {ID: "a", Cause: "crash"}}
	_, path := startSocket(t, b, nil)

	code, body := call(t, path, http.MethodGet, "/status", nil)
	d, err := DecodeDoc(strings.NewReader(body))
	if code != http.StatusOK || err != nil || d.Guard.PID != 4242 || d.GPU.Devices[1].Trend != "climbing" {
		t.Fatalf("GET /status: %d %v %+v", code, err, d.Guard)
	}

	cases := []struct {
		method, target string
		body           string
		code           int
		want           string
		wantN          int
	}{
		{"GET", "/incidents", "", 200, `"id":"b"`, DefaultIncidents},
		{"GET", "/incidents?n=1", "", 200, `[{"id":"b"`, 1},
		{"GET", "/incidents?n=0", "", 200, `"id":"a"`, 0},
		{"GET", "/incidents?n=abc", "", 400, `{"error":"n=\"abc\" is not a number of records`, -1},
		{"GET", "/incidents?n=-1", "", 400, `is not a number of records`, -1},
		{"GET", "/incidents?n=1&n=2", "", 400, `n given 2 times`, -1},
		{"GET", "/incidents?m=1", "", 400, `unknown query parameter \"m\"`, -1},
		{"POST", "/incidents", "", 405, `POST /incidents: use GET`, -1},
		{"GET", "/restart", "", 405, `GET /restart: use POST`, -1},
		{"DELETE", "/status", "", 405, `use GET`, -1},
		{"GET", "/nope", "", 404, `no endpoint /nope`, -1},
		{"POST", "/restart", strings.Repeat("x", 5000), 413, `takes no body`, -1},
		{"POST", "/restart", "", 200, `"ok":true`, -1},
		{"POST", "/profile/reset", "", 200, `rung 0`, -1},
	}
	for _, c := range cases {
		b.mu.Lock()
		b.lastN = -1
		b.mu.Unlock()
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		code, got := call(t, path, c.method, c.target, body)
		if code != c.code || !strings.Contains(got, c.want) {
			t.Errorf("%s %s: %d %s; want %d with %s", c.method, c.target, code, got, c.code, c.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s %s: body is not JSON: %s", c.method, c.target, got)
		}
		b.mu.Lock()
		if c.wantN >= 0 && b.lastN != c.wantN {
			t.Errorf("%s %s: backend asked for %d records, want %d", c.method, c.target, b.lastN, c.wantN)
		}
		b.mu.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.restarts) != 1 || len(b.resets) != 1 {
		t.Errorf("backend saw %d restarts and %d resets, want 1 and 1", len(b.restarts), len(b.resets))
	}
}

func TestSocketHeaderBound(t *testing.T) {
	_, path := startSocket(t, newFakeBackend(status.StateReady), nil)
	req, _ := http.NewRequest("GET", "http://vllm-guard/status", nil)
	req.Header.Set("X-Big", strings.Repeat("x", 64<<10))
	c := NewClient(path)
	defer c.CloseIdleConnections()
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("64 KiB of headers: %d, want 431", resp.StatusCode)
	}
}

func TestSocketErrors(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	b.incErr = errors.New("state: list incident records in /x: permission denied")
	b.actionErr = errors.New("the guard is stopping")
	_, path := startSocket(t, b, nil)
	if code, body := call(t, path, "GET", "/incidents", nil); code != 500 || !strings.Contains(body, "permission denied") {
		t.Errorf("GET /incidents with a failing store: %d %s", code, body)
	}
	if code, body := call(t, path, "POST", "/restart", nil); code != 409 || !strings.Contains(body, "the guard is stopping") {
		t.Errorf("POST /restart refused: %d %s", code, body)
	}
}

func TestSocketPeerLogged(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	b := newFakeBackend(status.StateReady)
	_, path := startSocket(t, b, zap.New(core))
	c := NewClient(path)
	defer c.CloseIdleConnections()
	ctx := context.Background()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ResetProfile(ctx); err != nil {
		t.Fatal(err)
	}
	// A read is not an action: not logged.
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	entries := logs.FilterMessage("control action accepted").All()
	if len(entries) != 2 {
		t.Fatalf("%d action log lines, want 2: %v", len(entries), logs.All())
	}
	for i, action := range []string{"restart", "profile reset"} {
		f := entries[i].ContextMap()
		if f["action"] != action || f["peer_uid"] != uint32(os.Getuid()) || f["peer_pid"] != int32(os.Getpid()) || f["peer_known"] != true {
			t.Errorf("log of %s: %v; want uid %d pid %d", action, f, os.Getuid(), os.Getpid())
		}
	}
	want := "uid=" + strconv.Itoa(os.Getuid()) + " pid=" + strconv.Itoa(os.Getpid())
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.restarts) != 1 || b.restarts[0] != want || len(b.resets) != 1 || b.resets[0] != want {
		t.Errorf("backend peers: %q %q; want %q", b.restarts, b.resets, want)
	}
}

// TestSocketOtherUsers runs this test binary as uid 65534 to connect: a
// user outside the socket's group is refused, one in it is served.
func TestSocketOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a client as another uid needs root; CI runs the tests as root")
	}
	root := shortDir(t)
	// MkdirTemp makes 0700; the other user must reach the socket's folder.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// The go tool's build folder is private: copy the binary where the
	// other user may run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(root, "helper")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(helper, data, 0o755); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(root, "run", "g.sock")
	s, err := ListenSocket(path, newFakeBackend(status.StateReady), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	run := func(uid, gid uint32) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, helper, "-test.run=^$")
		cmd.Dir = root
		cmd.Env = []string{helperEnv + "=" + path}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("run the helper as %d:%d: %v", uid, gid, err)
		}
		return cmd.ProcessState.ExitCode(), strings.TrimSpace(string(out))
	}

	// Root (the guard's user) is served.
	if code, out := run(0, 0); code != helperOK {
		t.Fatalf("as root: exit %d: %s", code, out)
	}
	// nobody:nogroup is refused by the folder (0750).
	if code, out := run(65534, 65534); code != helperDenied || !strings.Contains(out, "permission denied") {
		t.Errorf("as 65534:65534 through the 0750 folder: exit %d: %s; want permission denied", code, out)
	}
	// A member of the socket's group (root's group here) is served.
	if code, out := run(65534, 0); code != helperOK {
		t.Errorf("as 65534 in group 0: exit %d: %s; want served", code, out)
	}
	// With the folder opened up, the socket's own mode (0660) still
	// refuses others.
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if code, out := run(65534, 65534); code != helperDenied || !strings.Contains(out, "permission denied") {
		t.Errorf("as 65534:65534 on the 0660 socket: exit %d: %s; want permission denied", code, out)
	}
}
