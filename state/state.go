// Package state owns what survives a restart of the guard: state.json (the
// rung in force and the counters the policy keeps) and the incident records
// in incidents/, one JSON file per failure. Every file is written
// atomically (temp file, fsync, rename, fsync of the directory), so a crash
// or power loss leaves the old content or the new, never a torn file.
//
// Nothing here stops the guard: an unreadable state.json is moved aside with
// a warning, and an unwritable state directory turns the Store into an
// in-memory one that says so. The guard runs on.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// DefaultMaxIncidents bounds incidents/ so a long crash loop cannot fill the disk.
const DefaultMaxIncidents = 200

const (
	stateFile    = "state.json"
	incidentsDir = "incidents"
	tempMarker   = ".tmp-"
	// A temp file older than this is debris from a crash mid-write: no
	// write takes this long, so removing it cannot race a live writer (the
	// `vllm-guard incidents` command opens the same directory as a running
	// guard).
	staleTemp = 10 * time.Minute
)

// WriteFileAtomic replaces path with data: a temp file in the same directory
// is written, synced, closed and renamed over path, then the directory is
// synced so the rename itself survives a power loss.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+tempMarker+"*")
	if err != nil {
		return fmt.Errorf("write %s: create temp file: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err = f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: chmod: %w", tmp, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", tmp, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", tmp, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: rename from %s: %w", path, tmp, err)
	}
	if err = syncDir(dir); err != nil {
		return fmt.Errorf("write %s: the file is in place but the directory fsync failed: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Store reads and writes the state directory. It is safe for concurrent use.
type Store struct {
	// MaxIncidents is how many incident records are kept; the oldest beyond
	// it are removed when a new one is added. Open sets DefaultMaxIncidents.
	MaxIncidents int

	dir        string
	persistent bool
	log        *zap.Logger

	mu           sync.Mutex
	memState     []byte     // in-memory mode: the last Save
	memIncidents []Incident // in-memory mode: oldest first
	now          func() time.Time
}

// Open prepares dir (mode 0750) and dir/incidents. When dir cannot be
// created or written, the returned Store keeps everything in memory and the
// warnings say so: the guard runs on, without persistence. The error is for
// a call that cannot work at all (an empty dir).
func Open(dir string, log *zap.Logger) (*Store, []string, error) {
	if dir == "" {
		return nil, nil, errors.New("state: no state directory given; set [control] state_dir")
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Store{MaxIncidents: DefaultMaxIncidents, dir: dir, log: log, now: time.Now}
	if err := probeWritable(dir); err != nil {
		return s, []string{fmt.Sprintf("state: cannot use %s (%v); running without persistence: the rung and the incident records will not survive a restart of the guard. Fix the directory's ownership or permissions, or set [control] state_dir to a writable directory", dir, err)}, nil
	}
	s.persistent = true
	var warnings []string
	for _, d := range []string{dir, filepath.Join(dir, incidentsDir)} {
		if w := removeStaleTemps(d, s.now()); w != "" {
			warnings = append(warnings, w)
		}
	}
	return s, warnings, nil
}

func probeWritable(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, incidentsDir), 0o750); err != nil {
		return err
	}
	for _, d := range []string{dir, filepath.Join(dir, incidentsDir)} {
		f, err := os.CreateTemp(d, ".probe"+tempMarker+"*")
		if err != nil {
			return err
		}
		name := f.Name()
		f.Close()
		if err := os.Remove(name); err != nil {
			return err
		}
	}
	return nil
}

func removeStaleTemps(dir string, now time.Time) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("state: cannot list %s: %v", dir, err)
	}
	var failed []string
	for _, e := range entries {
		if !isTemp(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < staleTemp {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			failed = append(failed, e.Name())
		}
	}
	if len(failed) > 0 {
		return fmt.Sprintf("state: cannot remove leftover temp files in %s: %s; remove them by hand", dir, strings.Join(failed, ", "))
	}
	return ""
}

func isTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempMarker)
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// Persistent reports whether the Store writes to disk (false: memory only).
func (s *Store) Persistent() bool { return s.persistent }

// StatePath is dir/state.json.
func (s *Store) StatePath() string { return filepath.Join(s.dir, stateFile) }

// Load reads state.json into v. found is false when there is none yet. A
// file that cannot be read or decoded is moved aside to
// state.json.corrupt-<UTC time> so the next Save starts clean; warning
// names both paths. Load never fails the guard.
func (s *Store) Load(v any) (found bool, warning string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.persistent {
		if s.memState == nil {
			return false, ""
		}
		if err := json.Unmarshal(s.memState, v); err != nil {
			return false, fmt.Sprintf("state: in-memory state does not decode (%v); starting from defaults", err)
		}
		return true, ""
	}
	path := s.StatePath()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, ""
	}
	if err == nil {
		err = json.Unmarshal(data, v)
		if err == nil {
			return true, ""
		}
	}
	aside := fmt.Sprintf("%s.corrupt-%s", path, s.now().UTC().Format("20060102T150405Z"))
	for i := 2; exists(aside); i++ { // keep every corrupt copy for a post-mortem
		aside = fmt.Sprintf("%s.corrupt-%s-%d", path, s.now().UTC().Format("20060102T150405Z"), i)
	}
	if rerr := os.Rename(path, aside); rerr != nil {
		return false, fmt.Sprintf("state: %s is unreadable (%v) and could not be moved aside to %s (%v); starting from defaults: remove the file by hand", path, err, aside, rerr)
	}
	return false, fmt.Sprintf("state: %s was unreadable (%v); moved it aside to %s and started from defaults (rung 0)", path, err, aside)
}

// Save writes v as state.json, atomically.
func (s *Store) Save(v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("state: encode state: %w", err)
	}
	data = append(data, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.persistent {
		s.memState = data
		return nil
	}
	if err := WriteFileAtomic(s.StatePath(), data, 0o640); err != nil {
		return fmt.Errorf("state: save: %w", err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
