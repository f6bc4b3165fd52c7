package integration

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 41 item 7: a state_dir that is a symlink was followed and its
// target's mode tightened; one another user owns was used. `vllm-guard
// run` now refuses both before it touches anything, exit 78, saying what to
// do; vLLM is never launched; `check` refuses them the same way.
func TestHostileStateDirIsRefused(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"symlink", "other-owner"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := quick(newScene(t))
			stateDir := filepath.Join(s.dir, "state")
			victim := filepath.Join(s.dir, "victim")
			want := "is a symlink"
			switch kind {
			case "symlink":
				if err := os.Mkdir(victim, 0o777); err != nil {
					t.Fatal(err)
				}
				os.Chmod(victim, 0o777)
				if err := os.Symlink(victim, stateDir); err != nil {
					t.Fatal(err)
				}
			case "other-owner":
				if err := os.Mkdir(stateDir, 0o750); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(stateDir, 65534, 65534); err != nil {
					t.Fatalf("chown to uid 65534 (the test runs as root, as the guard under systemd): %v", err)
				}
				want = "belongs to uid 65534"
			}
			s.start()
			if code := s.WaitExit(30 * time.Second); code != 78 {
				t.Fatalf("exit %d with a %s state_dir, want 78", code, kind)
			}
			e := s.WaitLog("the refusal", 1, time.Second, msgContains("cannot start"))
			if errText, _ := e["error"].(string); !strings.Contains(errText, stateDir) || !strings.Contains(errText, want) ||
				!strings.Contains(errText, "[control] state_dir") {
				t.Errorf("the error does not name state_dir, the folder and the fault: %q", errText)
			}
			if n := s.CountEvents(isStarting); n != 0 {
				t.Errorf("vLLM launched %d times", n)
			}
			if kind == "symlink" {
				if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o777 {
					t.Errorf("the symlink's target was changed: %v %v", fi.Mode(), err)
				}
				if ents, _ := os.ReadDir(victim); len(ents) != 0 {
					t.Errorf("the guard wrote in the symlink's target: %d entries", len(ents))
				}
			}
			out, err := exec.Command(bins.guard, "check", "--config", filepath.Join(s.dir, "vllm-guard.toml")).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 78 || !strings.Contains(string(out), want) {
				t.Errorf("check: %v, want exit 78 saying %q:\n%s", err, want, out)
			}
			// With no guard running, `incidents` reads the folder itself
			// (here with a record folder in it): it refuses it too, and
			// changes nothing there.
			if err := os.Mkdir(filepath.Join(stateDir, "incidents"), 0o777); err != nil {
				t.Fatal(err)
			}
			out, err = exec.Command(bins.guard, "incidents", "--config", filepath.Join(s.dir, "vllm-guard.toml")).CombinedOutput()
			if err == nil || !strings.Contains(string(out), want) {
				t.Errorf("incidents without a guard: %v, want a refusal saying %q:\n%s", err, want, out)
			}
			if kind == "symlink" {
				if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o777 {
					t.Errorf("incidents changed the symlink's target: %v %v", fi.Mode(), err)
				}
			}
		})
	}
}
