package state

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
)

// A FIFO as state.json: Load returns at once (the old os.ReadFile blocked
// forever), moves it aside and says what it was.
func TestFIFOStateIsMovedAsideWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := syscall.Mkfifo(s.StatePath(), 0o640); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() {
		var v saved
		_, w := s.Load(&v)
		done <- w
	}()
	// No writer ever opens the FIFO: a blocking open would never return,
	// and the goroutine would leak (goleak fails the package).
	w := <-done
	if !strings.Contains(w, "FIFO") || !strings.Contains(w, "moved it aside") {
		t.Fatalf("warning %q; want the FIFO named and moved aside", w)
	}
	if _, err := os.Lstat(s.StatePath()); !os.IsNotExist(err) {
		t.Errorf("state.json still there: %v", err)
	}
}

// A symlink as state.json is not followed: its target is neither read nor
// replaced.
func TestSymlinkStateIsNotFollowed(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := os.WriteFile(target, []byte(`{"rung": 3}`), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, s.StatePath()); err != nil {
		t.Fatal(err)
	}
	var v saved
	if found, w := s.Load(&v); found || !strings.Contains(w, "symlink") {
		t.Fatalf("found=%v warning=%q; want the symlink refused", found, w)
	}
	if err := s.Save(saved{Rung: 1}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(target); string(got) != `{"rung": 3}` {
		t.Errorf("the symlink's target was changed: %q", got)
	}
}

func TestOversizedStateIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := os.WriteFile(s.StatePath(), make([]byte, maxStateBytes+1), 0o640); err != nil {
		t.Fatal(err)
	}
	var v saved
	if found, w := s.Load(&v); found || !strings.Contains(w, "more than") {
		t.Fatalf("found=%v warning=%q; want the size refused", found, w)
	}
}

// incidents as a symlink to another folder: refused, nothing written or
// pruned there (pruning through it removed that folder's files).
func TestIncidentsSymlinkIsNotFollowed(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	for i := range 3 {
		name := fmt.Sprintf("20000101T00000%d.000000Z-crash.json", i)
		if err := os.WriteFile(filepath.Join(other, name), []byte("{}"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(other, filepath.Join(dir, "incidents")); err != nil {
		t.Fatal(err)
	}
	s, warnings, err := Open(dir, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Persistent() || s.IncidentsOnDisk() || len(warnings) != 1 || !strings.Contains(warnings[0], "symlink") || !strings.Contains(warnings[0], "memory") {
		t.Fatalf("persistent=%v on disk=%v warnings=%q; want state on disk, records in memory, the symlink named", s.Persistent(), s.IncidentsOnDisk(), warnings)
	}
	s.MaxIncidents = 1
	for i := range 2 {
		if p, err := s.AddIncident(Incident{Time: time.Unix(int64(i), 0), Cause: cause.CauseCrash}); err != nil || p != "" {
			t.Fatalf("AddIncident: %q %v", p, err)
		}
	}
	if incs, _ := s.Incidents(0); len(incs) != 1 {
		t.Errorf("in-memory records: %d, want 1", len(incs))
	}
	if ents, _ := os.ReadDir(other); len(ents) != 3 {
		t.Errorf("the symlink's target folder has %d files, want its 3 untouched", len(ents))
	}
}

func TestFoldersTightenedAndRecordsMasked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(filepath.Join(dir, "incidents"), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	os.Chmod(filepath.Join(dir, "incidents"), 0o777)
	s := open(t, dir)
	defer s.Close()
	for _, d := range []string{dir, filepath.Join(dir, "incidents")} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o750 {
			t.Errorf("%s: mode %v %v, want 0750", d, fi.Mode().Perm(), err)
		}
	}
	inc := sampleIncident(time.Unix(100, 0), cause.CauseCrash)
	inc.LastLines = []string{"non-default args: {'api_key': 'sk-line-secret-000000000000'}"}
	inc.Evidence = []cause.Line{{N: 1, Text: "Authorization: Bearer evsecret"}}
	p, err := s.AddIncident(inc)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if strings.Contains(string(data), "line-secret") || strings.Contains(string(data), "evsecret") || fi.Mode().Perm() != 0o640 {
		t.Errorf("record mode %v holds a secret:\n%s", fi.Mode().Perm(), data)
	}
}

// A state folder that is a symlink is refused by Open, for every caller
// (the guard, `incidents` and `diagnose` without one): its target is not
// created in, tightened or written (issue 41).
func TestSymlinkStateDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "elsewhere")
	if err := os.Mkdir(target, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(target, 0o777)
	link := filepath.Join(dir, "state")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(link, nil); err == nil || !strings.Contains(err.Error(), "is a symlink") {
		t.Errorf("Open of a symlinked state folder: %v; want it refused", err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o777 {
		t.Errorf("the symlink's target was tightened to %v", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Errorf("Open wrote %d entries in the symlink's target", len(ents))
	}
}
