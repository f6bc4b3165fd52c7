package integration

// Hostile and unlucky inputs (issue 15, items 3, 7, 8, 9 (in alerts/), 12):
// the "hostile and unlucky inputs" table of docs/testing.md names these tests.

import (
	"bufio"
	"context"
	"fmt"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// apiKey is the secret the hostile tests give vLLM: it must never leave
// the guard.
const apiKey = "sk-hostile-0123456789abcdef"

// Item 3: vLLM's `non-default args` line carries its API key. The TCP
// /status is a bounded summary without log or command lines, and refuses
// a foreign Host; the socket's full document, the incident record, the
// guard's log and `check` carry the key masked.
func TestHostileTCPStatusIsARedactedSummary(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	addr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	s.httpListen = addr
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--api-key\", %q]", bins.fakevllm, apiKey)
	oneShot(s, "crash_on_start")
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitEvent("the crash", 1, 30*time.Second, isExited)
	s.WaitEvent("ready after it", 1, 30*time.Second, isReady)

	get := func(host string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+addr+"/status", nil)
		if host != "" {
			req.Host = host
		}
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := get("")
	if code != 200 || strings.Contains(body, apiKey) || strings.Contains(body, "non-default args") || strings.Contains(body, "--api-key") {
		t.Errorf("TCP /status: %d, carries vLLM's lines or command lines:\n%.2000s", code, body)
	}
	d, err := control.DecodeDoc(strings.NewReader(body))
	if err != nil || d.Note != control.SummaryNote || d.LastIncident == nil || len(d.LastIncident.LastLines) != 0 || len(body) > 256<<10 {
		t.Errorf("TCP /status is not the bounded summary (%d bytes, %v): %.500s", len(body), err, body)
	}
	if code, body := get("rebind.attacker.test:80"); code != http.StatusMisdirectedRequest {
		t.Errorf("a foreign Host: %d %s; want 421", code, body)
	}

	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	full, err := c.Status(context.Background())
	if err != nil || full.LastIncident == nil {
		t.Fatalf("socket status: %v %+v", err, full.LastIncident)
	}
	// The status document keeps the newest few KiB of lines; the record
	// (the socket's /incidents) has them all.
	incs, err := c.Incidents(context.Background(), 1)
	if err != nil || len(incs) != 1 {
		t.Fatalf("socket incidents: %v %d", err, len(incs))
	}
	if !slices.ContainsFunc(incs[0].LastLines, func(l string) bool { return strings.Contains(l, "'api_key': ['***']") }) {
		t.Errorf("the incident record lacks vLLM's masked non-default args line: %q", incs[0].LastLines)
	}
	raw, _ := (&http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", s.socket())
	}}}).Get("http://guard/status")
	if raw != nil {
		b, _ := io.ReadAll(raw.Body)
		raw.Body.Close()
		if strings.Contains(string(b), apiKey) {
			t.Errorf("the socket's status carries the API key")
		}
	}
	files, _ := filepath.Glob(filepath.Join(s.dir, "state", "incidents", "*.json"))
	for _, f := range files {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), apiKey) {
			t.Errorf("incident record %s carries the API key", f)
		}
	}
	logLines := s.Raw()
	masked := false
	for _, l := range logLines {
		if strings.Contains(l, apiKey) {
			t.Errorf("the guard's log carries the API key: %.300s", l)
		}
		masked = masked || strings.Contains(l, "'api_key': ['***']")
	}
	if !masked {
		t.Error("vLLM's non-default args line was not re-emitted, masked")
	}
	out, _ := exec.Command(bins.guard, "check", "--config", filepath.Join(s.dir, "vllm-guard.toml")).CombinedOutput()
	if strings.Contains(string(out), apiKey) || !strings.Contains(string(out), `"--api-key", "***"`) {
		t.Errorf("check output carries the key or lacks the masked flag:\n%s", out)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}

// sockScene is a scene whose control socket lives in dir/sub.
func sockScene(t *testing.T, sub string) (*scene, string) {
	s := quick(newScene(t))
	path := filepath.Join(s.dir, sub, "guard.sock")
	s.editConfig = func(text string) string {
		return strings.Replace(text, fmt.Sprintf("socket = %q", filepath.Join(s.dir, "guard.sock")), fmt.Sprintf("socket = %q", path), 1)
	}
	return s, path
}

// Item 7: a socket folder others can write to (they could replace the
// socket) is refused at start, exit 78, naming the folder and its mode;
// vLLM is never launched.
func TestHostileSocketFolderOpenToOthersIsRefused(t *testing.T) {
	t.Parallel()
	s, path := sockScene(t, "open")
	if err := os.Mkdir(filepath.Dir(path), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(path), 0o777)
	s.start()
	if code := s.WaitExit(30 * time.Second); code != 78 {
		t.Fatalf("exit %d with a 0777 socket folder, want 78", code)
	}
	e := s.WaitLog("the refusal", 1, time.Second, msgContains("cannot serve the control socket"))
	if errText, _ := e["error"].(string); !strings.Contains(errText, filepath.Dir(path)) || !strings.Contains(errText, "mode 0777") {
		t.Errorf("the error does not name the folder and its mode: %q", errText)
	}
	if n := s.CountEvents(isStarting); n != 0 {
		t.Errorf("vLLM launched %d times", n)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("a socket was bound in the open folder: %v", err)
	}
}

// impostorEnv makes the test binary serve a READY status on the named
// socket as whoever runs it, until its stdin closes.
const impostorEnv = "VLLM_GUARD_INTEGRATION_IMPOSTOR"

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

// Item 7: another user (uid 65534) serves a socket where `status` looks:
// `vllm-guard status` refuses its answer (SO_PEERCRED) and exits 2 saying
// why, instead of printing its READY and exiting 0.
func TestHostileImpostorSocketIsNotTrusted(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("playing another user needs root; run the tests as root (CI does)")
	}
	root, err := os.MkdirTemp("", "vgimp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o777)
	// The go tool's build folder is private: copy this binary where the
	// other user may run it.
	self, _ := os.Executable()
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(root, "impostor")
	if err := os.WriteFile(helper, data, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "guard.sock")
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
	st := exec.Command(bins.guard, "status", "--socket", path)
	var out, errb strings.Builder
	st.Stdout, st.Stderr = &out, &errb
	st.Run()
	if code := st.ProcessState.ExitCode(); code != 3 || strings.Contains(strings.ToLower(out.String()), "ready") ||
		!strings.Contains(errb.String(), "uid 65534") {
		t.Errorf("status against an impostor: exit %d, stdout %q, stderr %q; want exit 3 (no guard) naming its uid", code, out.String(), errb.String())
	}
}

// Item 7: a second guard configured with the same socket, after the first
// one's socket file was removed (a tmp cleaner, an operator), cannot take
// it over: the first holds <socket>.lock, the second exits 78 naming it.
func TestHostileSecondGuardCannotTakeTheSocket(t *testing.T) {
	t.Parallel()
	a := quick(newScene(t))
	a.start()
	a.WaitEvent("the first guard ready", 1, 30*time.Second, isReady)
	if err := os.Remove(a.socket()); err != nil {
		t.Fatal(err)
	}
	b := quick(newScene(t))
	b.editConfig = func(text string) string {
		return strings.Replace(text, fmt.Sprintf("socket = %q", filepath.Join(b.dir, "guard.sock")), fmt.Sprintf("socket = %q", a.socket()), 1)
	}
	b.start()
	if code := b.WaitExit(30 * time.Second); code != 78 {
		t.Fatalf("the second guard: exit %d, want 78", code)
	}
	e := b.WaitLog("the refusal", 1, time.Second, msgContains("cannot serve the control socket"))
	want := fmt.Sprintf("(pid %d) holds %s.lock", a.Cmd.Process.Pid, a.socket())
	if errText, _ := e["error"].(string); !strings.Contains(errText, want) {
		t.Errorf("the second guard's error %q does not name the holder: want %q", errText, want)
	}
	if n := b.CountEvents(isStarting); n != 0 {
		t.Errorf("the second guard launched vLLM %d times", n)
	}
	a.stopCleanly(30*time.Second, 5*time.Second)
}

// Item 8: incidents as a symlink to another folder is not followed: the
// records stay in memory (said once), nothing is written or pruned there.
func TestHostileIncidentsSymlinkIsNotFollowed(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	other := filepath.Join(s.dir, "someone-elses")
	os.MkdirAll(other, 0o755)
	os.MkdirAll(filepath.Join(s.dir, "state"), 0o750)
	// As many old-looking records as the guard keeps: one more would make
	// it prune the oldest.
	for i := range 200 {
		name := fmt.Sprintf("20000101T%06d.000000Z-crash.json", i)
		if err := os.WriteFile(filepath.Join(other, name), []byte("{}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(other, filepath.Join(s.dir, "state", "incidents")); err != nil {
		t.Fatal(err)
	}
	oneShot(s, "crash_on_start")
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitLog("the warning", 1, 30*time.Second, msgContains("is a symlink"))
	s.WaitEvent("the incident", 1, 30*time.Second, kind(events.KindIncident))
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	ents, _ := os.ReadDir(other)
	if len(ents) != 200 || ents[0].Name() != "20000101T000000.000000Z-crash.json" {
		t.Errorf("the symlink's target changed: %d files, first %q", len(ents), ents[0].Name())
	}
	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	if incs, err := c.Incidents(context.Background(), 0); err != nil || len(incs) != 1 {
		t.Errorf("incidents in memory: %d %v, want the one", len(incs), err)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}

// Item 8: state.json is a FIFO (nobody writes it): the guard does not hang
// before its socket exists; it moves the FIFO aside with a warning, runs,
// and stops on SIGTERM.
func TestHostileStateFIFODoesNotHang(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	os.MkdirAll(filepath.Join(s.dir, "state"), 0o750)
	if err := syscall.Mkfifo(filepath.Join(s.dir, "state", "state.json"), 0o640); err != nil {
		t.Fatal(err)
	}
	s.start()
	w := s.WaitLog("the warning", 1, 30*time.Second, msgContains("FIFO"))
	if text, _ := w["msg"].(string); !strings.Contains(text, "moved it aside") {
		t.Errorf("warning %q does not say the FIFO was moved aside", text)
	}
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	aside, _ := filepath.Glob(filepath.Join(s.dir, "state", "state.json.corrupt-*"))
	if len(aside) != 1 {
		t.Fatalf("moved-aside copies: %v", aside)
	}
	if fi, err := os.Lstat(aside[0]); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("%s is not the FIFO: %v", aside[0], err)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}

// Item 8: the incident record cannot be written (its folder was replaced
// by a file while the guard ran): status still shows the failure as the
// last incident.
func TestHostileFailedIncidentWriteStillShowsInStatus(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	inc := filepath.Join(s.dir, "state", "incidents")
	if err := os.RemoveAll(inc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inc, []byte("not a folder\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(apiServer(t, s), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("the failed write", 1, 30*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindIncident && strings.HasPrefix(e.Reason, "not written")
	})
	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	d, err := c.Status(context.Background())
	if err != nil || d.LastIncident == nil || d.LastIncident.Cause != "crash" {
		t.Fatalf("status after a failed incident write: %v, last incident %+v; want the crash", err, d.LastIncident)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}

// waitRaw waits for a raw log line containing text (console logs are not
// JSON) and returns it.
func (s *scene) waitRaw(what, text string, timeout time.Duration) string {
	s.t.Helper()
	var line string
	s.Until(what, timeout, func() bool {
		raw := s.Raw()
		i := slices.IndexFunc(raw, func(l string) bool { return strings.Contains(l, text) })
		if i >= 0 {
			line = raw[i]
		}
		return i >= 0
	})
	return line
}

// Item 12: a vLLM line with NUL, BEL, an escape sequence, DEL, C1 controls
// and text shaped like the guard's own console line reaches the console
// log (what journald reads) as one line, every control escaped: no byte a
// journal splits on, no terminal control.
func TestHostileControlBytesNeverReachTheLogRaw(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_FAULT"] = "control_bytes"
	s.editConfig = func(text string) string { return strings.Replace(text, `format = "json"`, `format = "console"`, 1) }
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	line := s.waitRaw("the line with control bytes", "cmpl-ctlbytes", 10*time.Second)
	// The OSC title sequence (ESC ] 0;pwned BEL) is stripped whole by the
	// pump; every other control is escaped where it stood.
	if !strings.Contains(line, `a\x00\x07\x7f \u0085\u009b31m12:00:00.000\tERROR\tvllm-guard\tforged`) || strings.Contains(line, "pwned") {
		t.Errorf("the controls are not escaped in place: %q", line)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
	raw := s.Raw()
	for _, l := range raw {
		if !utf8.ValidString(l) {
			t.Errorf("log line is not valid UTF-8: %q", l)
		}
		for _, r := range l {
			// The console encoder separates its columns with tabs.
			if r < 0x20 && r != '\t' || r == 0x7f || r >= 0x80 && r <= 0x9f {
				t.Errorf("control %U reached the log: %q", r, l)
				break
			}
		}
		if strings.HasPrefix(l, "12:00:00.000") || strings.Contains(l, "forged") && !strings.Contains(l, "cmpl-ctlbytes") {
			t.Errorf("vLLM's line was split into a forged entry: %q", l)
		}
	}
}
