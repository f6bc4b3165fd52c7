package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

func runCmd(f func([]string, *bytes.Buffer, *bytes.Buffer) int, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := f(args, &out, &errb)
	return code, out.String(), errb.String()
}

func statusCmd(args []string, out, errb *bytes.Buffer) int { return StatusCommand(args, out, errb) }
func incidents(args []string, out, errb *bytes.Buffer) int {
	return IncidentsCommand(args, out, errb)
}

func TestStatusCommandExitCodes(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	_, path := startSocket(t, b, nil)

	code, out, errs := runCmd(statusCmd, "--socket", path)
	if code != 0 || !strings.Contains(out, "READY since") || !strings.Contains(out, "climbing +21 MiB/s") || errs != "" {
		t.Errorf("ready: exit %d\n%s\n%s", code, out, errs)
	}
	var want bytes.Buffer
	WriteStatus(&want, fixtureDoc())
	if out != want.String() {
		t.Errorf("the command's view differs from WriteStatus of the same document:\n%s", out)
	}

	b.setState(status.StateBackoff, "after oom: backoff 5s")
	if code, out, _ := runCmd(statusCmd, "--socket", path); code != 1 || !strings.Contains(out, "BACKOFF") {
		t.Errorf("backoff: exit %d\n%s", code, out)
	}

	code, out, _ = runCmd(statusCmd, "--socket", path, "--json")
	d, err := DecodeDoc(strings.NewReader(out))
	if code != 1 || err != nil || d.Guard.State != status.StateBackoff {
		t.Errorf("--json: exit %d, %v, state %q", code, err, d.Guard.State)
	}

	missing := filepath.Join(shortDir(t), "none.sock")
	code, out, errs = runCmd(statusCmd, "--socket", missing)
	if code != 3 || out != "" || !strings.Contains(errs, "no vllm-guard answers on "+missing+": is it running?") {
		t.Errorf("no guard: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestStatusCommandFlags(t *testing.T) {
	code, out, _ := runCmd(statusCmd, "--help")
	if code != 0 || !strings.Contains(out, "Usage: vllm-guard status") || !strings.Contains(out, "-watch") {
		t.Errorf("--help: exit %d\n%s", code, out)
	}
	code, _, errs := runCmd(statusCmd, "--bogus")
	if code != 2 || !strings.Contains(errs, "flag provided but not defined: -bogus") || !strings.Contains(errs, "Usage:") {
		t.Errorf("bad flag: exit %d\n%s", code, errs)
	}
	if code, _, errs := runCmd(statusCmd, "extra"); code != 2 || !strings.Contains(errs, "unexpected arguments: extra") {
		t.Errorf("extra argument: exit %d\n%s", code, errs)
	}
}

func TestStatusCommandSocketFromConfig(t *testing.T) {
	_, path := startSocket(t, newFakeBackend(status.StateReady), nil)
	cfg := filepath.Join(shortDir(t), "vllm-guard.toml")
	if err := os.WriteFile(cfg, []byte("[control]\nsocket = \""+path+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCmd(statusCmd, "--config", cfg); code != 0 || !strings.Contains(out, "READY") {
		t.Errorf("socket from --config: exit %d\n%s\n%s", code, out, errs)
	}
	t.Setenv("VLLM_GUARD_CONFIG", cfg)
	if code, _, errs := runCmd(statusCmd); code != 0 {
		t.Errorf("socket from $VLLM_GUARD_CONFIG: exit %d\n%s", code, errs)
	}
	// A config that does not load falls back to the default socket and
	// says so.
	bad := filepath.Join(filepath.Dir(cfg), "bad.toml")
	os.WriteFile(bad, []byte("[control]\nsockett = 1\n"), 0o600)
	code, _, errs := runCmd(statusCmd, "--config", bad)
	if code != 3 || !strings.Contains(errs, "trying the default socket "+DefaultSocket) || !strings.Contains(errs, DefaultSocket) {
		t.Errorf("bad config: exit %d\n%s", code, errs)
	}
}

// syncBuffer is written by the command's goroutine and read by the test.
type syncBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	frames chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if bytes.HasPrefix(p, []byte(clearScreen)) || bytes.HasPrefix(p, []byte("{")) {
		select {
		case s.frames <- struct{}{}:
		default:
		}
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lastFrameReady says whether the last complete frame of --watch output
// shows vLLM ready.
func lastFrameReady(out string, asJSON bool) bool {
	if asJSON {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		d, err := DecodeDoc(strings.NewReader(lines[len(lines)-1]))
		return err == nil && d.Guard.State == status.StateReady
	}
	frames := strings.Split(out, clearScreen)
	return strings.Contains(frames[len(frames)-1], "READY since")
}

func TestStatusCommandWatch(t *testing.T) {
	b := newFakeBackend(status.StateStarting)
	_, path := startSocket(t, b, nil)
	for _, asJSON := range []bool{false, true} {
		out := &syncBuffer{frames: make(chan struct{}, 1)}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		args := []string{"--socket", path, "--watch"}
		if asJSON {
			args = append(args, "--json")
		}
		go func() { done <- statusCommand(ctx, args, out, out, 5*time.Millisecond) }()
		frame := func() {
			select {
			case <-out.frames:
			case <-time.After(30 * time.Second):
				t.Fatalf("no frame drawn; output so far:\n%s", out.String())
			}
		}
		frame()
		b.setState(status.StateReady, "vLLM answered a 1-token completion")
		// Wait until a frame shows the change, then interrupt.
		for !lastFrameReady(out.String(), asJSON) {
			frame()
		}
		cancel()
		var code int
		select {
		case code = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("--watch did not stop when interrupted")
		}
		if code != 0 {
			t.Errorf("json=%v: exit %d after the guard became ready, want the last draw's 0", asJSON, code)
		}
		text := out.String()
		if asJSON {
			lines := strings.Split(strings.TrimSpace(text), "\n")
			if len(lines) < 2 {
				t.Errorf("--watch --json: %d lines, want one document per draw", len(lines))
			}
			for _, l := range lines {
				if _, err := DecodeDoc(strings.NewReader(l)); err != nil {
					t.Errorf("--watch --json line %q: %v", l, err)
				}
			}
			if strings.Contains(text, "\x1b") {
				t.Error("--watch --json cleared the screen")
			}
		} else if n := strings.Count(text, clearScreen); n < 2 || !strings.Contains(text, "STARTING") || !strings.Contains(text, "READY") {
			t.Errorf("--watch: %d frames; output:\n%s", n, text)
		}
		b.setState(status.StateStarting, "loading")
	}
}

func TestIncidentsCommand(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	b.incs = []state.Incident{{ID: "2", Time: fixtureNow, Cause: cause.CauseOOM, Summary: "CUDA out of memory",
		RungBefore: policy.Rung{Index: 0, MaxNumSeqs: 256, GPUMemoryUtilization: 0.85},
		RungAfter:  policy.Rung{Index: 1, MaxNumSeqs: 128, GPUMemoryUtilization: 0.8}, Action: policy.ActionRestart}}
	_, path := startSocket(t, b, nil)

	code, out, errs := runCmd(incidents, "--socket", path, "-n", "3")
	if code != 0 || !strings.Contains(out, "CUDA out of memory") || !strings.Contains(out, "0 (256, 0.85) → 1 (128, 0.80)") || errs != "" {
		t.Errorf("through the socket: exit %d\n%s\n%s", code, out, errs)
	}
	b.mu.Lock()
	if b.lastN != 3 {
		t.Errorf("asked the guard for %d records, want 3", b.lastN)
	}
	b.mu.Unlock()
	code, out, _ = runCmd(incidents, "--socket", path, "--json")
	var incs []state.Incident
	if err := json.Unmarshal([]byte(out), &incs); code != 0 || err != nil || len(incs) != 1 || incs[0].Cause != cause.CauseOOM {
		t.Errorf("--json: exit %d %v %s", code, err, out)
	}
	if code, _, errs := runCmd(incidents, "-n", "-1"); code != 2 || !strings.Contains(errs, "-n -1") {
		t.Errorf("-n -1: exit %d %s", code, errs)
	}
}

func TestIncidentsCommandWithoutGuard(t *testing.T) {
	dir := shortDir(t)
	stateDir := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "vllm-guard.toml")
	sock := filepath.Join(dir, "none.sock")
	os.WriteFile(cfg, []byte("[control]\nsocket = \""+sock+"\"\nstate_dir = \""+stateDir+"\"\n"), 0o600)

	// Nothing recorded yet: the folder is not created by a read.
	code, out, errs := runCmd(incidents, "--config", cfg)
	if code != 0 || out != "no incidents recorded\n" || !strings.Contains(errs, "no vllm-guard answers on "+sock) || !strings.Contains(errs, "reading the records in "+stateDir) {
		t.Errorf("no records: exit %d %q %q", code, out, errs)
	}
	if _, err := os.Stat(stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("reading created %s", stateDir)
	}

	store, _, err := state.Open(stateDir, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	for i, cause := range []cause.Cause{cause.CauseCrash, cause.CauseOOM} {
		if _, err := store.AddIncident(state.Incident{Time: fixtureNow.Add(time.Duration(i) * time.Minute), Cause: cause, Summary: string(cause) + " happened"}); err != nil {
			t.Fatal(err)
		}
	}
	code, out, _ = runCmd(incidents, "--config", cfg, "--json", "-n", "1")
	var incs []state.Incident
	if err := json.Unmarshal([]byte(out), &incs); code != 0 || err != nil || len(incs) != 1 || incs[0].Cause != cause.CauseOOM {
		t.Errorf("from the state folder: exit %d %v %s", code, err, out)
	}
	code, out, _ = runCmd(incidents, "--config", cfg)
	if code != 0 || strings.Index(out, "oom happened") > strings.Index(out, "crash happened") || !strings.Contains(out, "crash happened") {
		t.Errorf("table from the state folder, newest first: exit %d\n%s", code, out)
	}
	// An explicit config that does not load is an error: it names where
	// the records are.
	if code, _, errs := runCmd(incidents, "--config", filepath.Join(dir, "missing.toml")); code != 1 || !strings.Contains(errs, "missing.toml") {
		t.Errorf("missing config: exit %d %s", code, errs)
	}
}

func action(name string) func([]string, *bytes.Buffer, *bytes.Buffer) int {
	return func(args []string, out, errb *bytes.Buffer) int { return ActionCommand(name, args, out, errb) }
}

func TestActionCommand(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	_, path := startSocket(t, b, nil)
	if code, out, errs := runCmd(action("restart"), "--socket", path); code != 0 || !strings.Contains(out, "vLLM will be restarted") {
		t.Errorf("restart: exit %d %q %q", code, out, errs)
	}
	if code, out, errs := runCmd(action("profile reset"), "--socket", path); code != 0 || !strings.Contains(out, "rung 0") {
		t.Errorf("profile reset: exit %d %q %q", code, out, errs)
	}
	b.mu.Lock()
	if len(b.restarts) != 1 || len(b.resets) != 1 {
		t.Errorf("backend saw %v restarts, %v resets", b.restarts, b.resets)
	}
	b.actionErr = errors.New("the guard is stopping")
	b.mu.Unlock()
	if code, _, errs := runCmd(action("restart"), "--socket", path); code != 1 || !strings.Contains(errs, "the guard is stopping") {
		t.Errorf("refused: exit %d %q", code, errs)
	}
	missing := filepath.Join(shortDir(t), "none.sock")
	if code, _, errs := runCmd(action("restart"), "--socket", missing); code != 3 || !strings.Contains(errs, "no vllm-guard answers on "+missing) {
		t.Errorf("no guard: exit %d %q", code, errs)
	}
	if code, _, _ := runCmd(action("reboot")); code != 2 {
		t.Errorf("unknown action: exit %d", code)
	}
	if code, out, _ := runCmd(action("profile reset"), "-h"); code != 0 || !strings.Contains(out, "vllm-guard profile reset [--instance NAME | --socket PATH") {
		t.Errorf("help: exit %d %q", code, out)
	}
}
