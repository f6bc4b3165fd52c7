package control

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/connlimit"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// impostorEnv makes the test binary serve a READY status on the named
// socket, as whoever runs it, until its stdin closes.
const impostorEnv = "VLLM_GUARD_CONTROL_TEST_IMPOSTOR"

func serveImpostor(path string) int {
	ln, err := net.Listen("unix", path)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	os.Chmod(path, 0o666)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"version":"impostor","guard":{"state":"ready","reason":"trust me"}}`)
	})}
	go srv.Serve(ln)
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
	srv.Close()
	return 0
}

// secretDoc is the fixture with secrets everywhere vLLM's text lands, and
// far more of everything than a real guard holds.
func secretDoc() Doc {
	d := fixtureDoc()
	inc := state.Incident{ID: "x", Time: fixtureNow, Cause: cause.CauseCrash, Summary: "crash",
		Evidence: []cause.Line{{N: 3, Text: "RuntimeError: bad key sk-evidence-secret-0000000000"}},
	}
	for i := 0; i < 1000; i++ {
		inc.LastLines = append(inc.LastLines, strings.Repeat("x", 600))
	}
	// The newest line: the socket's document keeps the newest few KiB.
	inc.LastLines = append(inc.LastLines, "(APIServer pid=7) INFO non-default args: {'model_tag': 'm', 'api_key': 'line-secret', 'port': 8000}")
	d.LastIncident = &inc
	d.Guard.Reason = strings.Repeat("r", 1<<20)
	d.Guard.LastFailure.Verdict.Evidence = append(d.Guard.LastFailure.Verdict.Evidence, cause.Line{N: 9, Text: "Authorization: Bearer failure-secret"})
	for i := range d.GPU.Devices {
		dev := &d.GPU.Devices[i]
		dev.History = make([]float64, 20000)
		for j := 0; j < 2000; j++ {
			dev.Processes = append(dev.Processes, gpumon.Proc{PID: 10000 + j, Used: 1 << 30,
				Command: "python3 -m vllm.entrypoints.openai.api_server --api-key cmd-secret --model m"})
		}
	}
	return d
}

// TCP /status is a bounded summary: no log lines, no command lines, no
// secret; the socket serves the whole document, with its secrets masked.
func TestHTTPStatusIsARedactedSummary(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	b.doc = secretDoc()
	s, err := ListenHTTP("127.0.0.1:0", NewHTTPHandler(b, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	code, body := get(t, "GET", "http://"+s.Addr().String()+"/status")
	if code != 200 {
		t.Fatalf("/status: %d", code)
	}
	for _, bad := range []string{"secret", "api_key", "xxxxxxxx", "--api-key", "vllm.entrypoints", "torch.OutOfMemoryError"} {
		if strings.Contains(body, bad) {
			t.Errorf("TCP /status carries %q", bad)
		}
	}
	if len(body) > maxSummaryBytes {
		t.Errorf("TCP /status is %d bytes, over the %d bound", len(body), maxSummaryBytes)
	}
	d, err := DecodeDoc(strings.NewReader(body))
	if err != nil || d.Note != SummaryNote || d.Guard.State != status.StateReady || d.LastIncident == nil || d.LastIncident.Cause != cause.CauseCrash ||
		len(d.LastIncident.LastLines) != 0 || len(d.LastIncident.Evidence) != 0 || len(d.Guard.LastFailure.Verdict.Evidence) != 0 {
		t.Errorf("summary: %v note=%q state=%s incident=%+v", err, d.Note, d.Guard.State, d.LastIncident)
	}

	_, path := startSocket(t, b, nil)
	code, full := call(t, path, http.MethodGet, "/status", nil)
	if code != 200 || !strings.Contains(full, "last_lines") || !strings.Contains(full, "'api_key': '***'") || !strings.Contains(full, "--api-key ***") {
		t.Errorf("socket /status: %d, want the document with the newest lines, masked", code)
	}
	if strings.Contains(full, "secret") {
		t.Error("socket /status carries a secret")
	}
	var view bytes.Buffer
	WriteStatus(&view, b.doc)
	if strings.Contains(view.String(), "secret") {
		t.Error("the human view carries a secret")
	}
}

func TestHTTPHostHeaderChecked(t *testing.T) {
	hostname, _ := os.Hostname()
	for _, c := range []struct {
		listen string
		ok     []string
		refuse []string
	}{
		{"127.0.0.1:0", []string{"127.0.0.1", "localhost", "LOCALHOST.", "[::1]", "127.0.0.2", "app.localhost", ""},
			[]string{"evil.example", "10.0.0.1", hostname, "guard.ns.svc"}},
		{"0.0.0.0:0", []string{"10.1.2.3", "[fd00::1]", "localhost", hostname, "guard.ns.svc", "guard.ns.svc.cluster.local"},
			[]string{"evil.example", "rebind.attacker.test", "svc.evil.example"}},
	} {
		s, err := ListenHTTP(c.listen, NewHTTPHandler(newFakeBackend(status.StateReady), nil), nil)
		if err != nil {
			t.Fatal(err)
		}
		port := s.Addr().(*net.TCPAddr).Port
		check := func(host string, want int) {
			req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/readyz", port), nil)
			if host != "" {
				req.Host = fmt.Sprintf("%s:%d", host, port)
			}
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("listen %s, Host %q: %d %s; want %d", c.listen, req.Host, resp.StatusCode, body, want)
			}
		}
		for _, h := range c.ok {
			check(h, 200)
		}
		for _, h := range c.refuse {
			if h != "" {
				check(h, http.StatusMisdirectedRequest)
			}
		}
		s.Close()
	}
}

// The socket's folder must be the guard's: a folder others can write to,
// a symlink, or one owned by another user is refused, and nothing is
// bound there.
func TestSocketFolderMustBeTheGuards(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	base := shortDir(t)
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	sticky := filepath.Join(base, "tmp")
	os.Mkdir(sticky, 0o777)
	os.Chmod(sticky, 0o777|os.ModeSticky)
	real := filepath.Join(base, "real")
	os.Mkdir(real, 0o750)
	link := filepath.Join(base, "link")
	os.Symlink(real, link)
	foreign := filepath.Join(base, "foreign")
	os.Mkdir(foreign, 0o750)
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		open:    "mode 0777, writable by other users",
		sticky:  "writable by other users",
		link:    "is a symlink",
		foreign: "belongs to uid 65534",
	} {
		path := filepath.Join(dir, "g.sock")
		s, err := ListenSocket(path, b, nil)
		if err == nil {
			s.Close()
			t.Errorf("%s: served; want refused (%s)", dir, want)
			continue
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: %v; want it named with %q", dir, err, want)
		}
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("%s: a socket was bound there", dir)
		}
	}
}

// A socket served by another user (root runs the tests: uid 65534 plays
// the other user) is not trusted: the client refuses its answer, and
// `status` exits 2 saying why instead of printing the impostor's READY.
func TestClientRefusesAnImpostorServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("playing another user needs root; run the tests as root (CI does)")
	}
	root := shortDir(t)
	dir := filepath.Join(root, "open")
	os.Mkdir(dir, 0o777)
	os.Chmod(root, 0o755)
	os.Chmod(dir, 0o777)
	path := filepath.Join(dir, "g.sock")
	// The go tool's build folder is private: copy the binary where the
	// other user may run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(root, "impostor")
	if err := os.WriteFile(helper, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(helper, "-test.run=^$")
	cmd.Dir = "/"
	cmd.Env = []string{impostorEnv + "=" + path}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "listening\n" {
		t.Fatalf("impostor: %q", line)
	}

	c := NewClient(path)
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Status(ctx)
	if !errors.Is(err, ErrNoGuard) || !strings.Contains(err.Error(), "runs as uid 65534") || !strings.Contains(err.Error(), "not a guard this command trusts") {
		t.Fatalf("Status from an impostor: %v; want refused, naming its uid", err)
	}
	var out, errw bytes.Buffer
	if code := statusCommand(ctx, []string{"--socket", path}, &out, &errw, time.Second); code != ExitNoGuard || strings.Contains(out.String(), "ready") {
		t.Errorf("status: exit %d, stdout %q, stderr %q; want exit 2 and nothing of the impostor's", code, out.String(), errw.String())
	}
}

// Connections that ask nothing cannot starve the probes (issue 24): with
// every place of the port held by idle keep-alive connections, and more
// connections that never finish their headers, /livez still answers 200;
// the newcomer takes an idle connection's place.
func TestLivezNotStarvedByIdleConnections(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	s, err := ListenHTTP("127.0.0.1:0", NewHTTPHandler(b, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()
	_, capN := connlimit.Caps(connlimit.NoFile(), 0)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range capN {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("idle connection %d: its own /livez: %v %v", len(held), resp, err)
		}
		resp.Body.Close() // kept alive, idle from now on
	}
	// Headers begun, never finished, from another address.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for range capN / 4 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: loc")
	}
	for i := range 3 {
		cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := cl.Get("http://" + addr + "/livez")
		if err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe %d with %d idle connections open: %d %q; want 200", i, capN, resp.StatusCode, body)
		}
	}
}
