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
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

	// Modes of what the guard creates: the guard's user and its group may
	// read, nobody else may look.
	dirMode  os.FileMode = 0o750
	fileMode os.FileMode = 0o640

	// Bounds of a read: state.json is a few KiB (an incident record:
	// MaxRecordFileBytes). Anything larger is not ours.
	maxStateBytes = 4 << 20
)

// WriteFileAtomic replaces path with data: a temp file in the same directory
// is written, synced, closed and renamed over path, then the directory is
// synced so the rename itself survives a power loss. The directory is
// opened as an os.Root: the file is never created through a symlink.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer root.Close()
	return writeAtomic(root, base, data, perm)
}

// writeAtomic is WriteFileAtomic for name inside root.
func writeAtomic(root *os.Root, name string, data []byte, perm os.FileMode) (err error) {
	path := filepath.Join(root.Name(), name)
	var f *os.File
	var tmp string
	for range 100 {
		tmp = "." + name + tempMarker + strconv.FormatUint(rand.Uint64(), 36)
		f, err = root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: create temp file: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			root.Remove(tmp)
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
	if err = root.Rename(tmp, name); err != nil {
		return fmt.Errorf("write %s: rename from %s: %w", path, tmp, err)
	}
	if err = syncDir(root); err != nil {
		return fmt.Errorf("write %s: the file is in place but the directory fsync failed: %w", path, err)
	}
	return nil
}

func syncDir(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// errNotRegular is a state file that is something else: a FIFO (opening it
// would block), a device, a folder, a symlink (never followed).
type errNotRegular struct {
	path string
	mode fs.FileMode
}

func (e *errNotRegular) Error() string {
	what := "not a regular file"
	switch t := e.mode.Type(); {
	case t&fs.ModeNamedPipe != 0:
		what = "a FIFO, not a regular file"
	case t&fs.ModeSymlink != 0:
		what = "a symlink, which the guard does not follow"
	case t&fs.ModeDir != 0:
		what = "a folder, not a regular file"
	case t&(fs.ModeDevice|fs.ModeCharDevice) != 0:
		what = "a device, not a regular file"
	case t&fs.ModeSocket != 0:
		what = "a socket, not a regular file"
	}
	return fmt.Sprintf("%s is %s", e.path, what)
}

// readCapped reads name in root: a regular file only (a symlink is not
// followed, a FIFO is opened without blocking and refused), at most limit
// bytes.
func readCapped(root *os.Root, name string, limit int64) ([]byte, error) {
	path := filepath.Join(root.Name(), name)
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &errNotRegular{path: path, mode: fi.Mode()}
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Swapped between the Lstat and the open: what was opened decides.
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &errNotRegular{path: path, mode: fi.Mode()}
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a vllm-guard file can be", path, fi.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s grew past %d bytes while read", path, limit)
	}
	return data, nil
}

// Store reads and writes the state directory. It is safe for concurrent use.
type Store struct {
	// MaxIncidents is how many incident records are kept; the oldest beyond
	// it are removed when a new one is added. Open sets DefaultMaxIncidents.
	MaxIncidents int
	// MaxIncidentBytes bounds the records' files together; the oldest go
	// first. Open sets DefaultMaxIncidentBytes.
	MaxIncidentBytes int64

	dir        string
	persistent bool     // state.json on disk
	root       *os.Root // dir, when persistent
	inc        *os.Root // dir/incidents, when the records are on disk
	log        *zap.Logger

	mu           sync.Mutex
	memState     []byte        // in-memory mode: the last Save
	memStarts    []byte        // in-memory mode: the last SaveStarts
	memIncidents []memIncident // records not on disk: oldest first
	now          func() time.Time
	// readOnly: dir can be read but not written (a read-only mount, a
	// full or foreign folder): state.json is read from it, Save keeps the
	// new state in memory and fails, saying the saved one stays in force.
	readOnly error
	// incRead: dir/incidents of a read-only dir, read only.
	incRead *os.Root
	// failWrite, when set, is asked before each record write (tests).
	failWrite func(name string) error
}

// memIncident is a record kept in memory and the size of its JSON.
type memIncident struct {
	inc  Incident
	size int
}

// Open prepares dir (mode 0750) and dir/incidents. When dir cannot be
// created or written, the returned Store keeps everything in memory and the
// warnings say so: the guard runs on, without persistence. An incidents
// that is a symlink or not a folder is refused (never followed): the
// records are then kept in memory, and a warning says so. Folders looser
// than 0750 are tightened. The error is for a call that cannot work at all
// (an empty dir).
func Open(dir string, log *zap.Logger) (*Store, []string, error) {
	if dir == "" {
		return nil, nil, errors.New("state: no state directory given; set [control] state_dir")
	}
	if err := checkDir(dir); err != nil {
		return nil, nil, err // a symlink or another user's folder: never followed, never tightened
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Store{MaxIncidents: DefaultMaxIncidents, MaxIncidentBytes: DefaultMaxIncidentBytes, dir: dir, log: log, now: time.Now}
	root, err := openStateDir(dir)
	if errors.Is(err, errNotWritable) {
		// The saved state is still the one a restarted guard resumes: read
		// it, and keep it in force.
		if ro, rerr := os.OpenRoot(dir); rerr == nil {
			s.root, s.readOnly = ro, err
			// The records already there are still listed (after the new
			// ones, kept in memory); a symlink is not followed.
			if fi, lerr := ro.Lstat(incidentsDir); lerr == nil && fi.IsDir() {
				if inc, oerr := ro.OpenRoot(incidentsDir); oerr == nil {
					s.incRead = inc
				}
			}
			return s, []string{fmt.Sprintf("state: %s cannot be written (%v): the saved state (rung) is read and stays in force, but nothing new is saved and new incident records are kept in memory only. Make the folder writable by the guard", dir, err)}, nil
		}
	}
	if err != nil {
		return s, []string{fmt.Sprintf("state: cannot use %s (%v); running without persistence: the rung and the incident records will not survive a restart of the guard. Fix the directory's ownership or permissions, or set [control] state_dir to a writable directory", dir, err)}, nil
	}
	s.root, s.persistent = root, true
	var warnings []string
	if w := tighten(root, ".", log); w != "" {
		warnings = append(warnings, w)
	}
	if inc, w := openIncidentsDir(root, log); inc != nil {
		s.inc = inc
		if w != "" {
			warnings = append(warnings, w)
		}
	} else {
		warnings = append(warnings, w)
	}
	for _, r := range []*os.Root{s.root, s.inc} {
		if r == nil {
			continue
		}
		if w := removeStaleTemps(r, s.now()); w != "" {
			warnings = append(warnings, w)
		}
	}
	return s, warnings, nil
}

// openStateDir creates dir when missing (0750) and opens it as a root; a
// file written there proves it writable.
func openStateDir(dir string) (*os.Root, error) {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	if err := probeWritable(root); err != nil {
		root.Close()
		return nil, fmt.Errorf("%w: %w", errNotWritable, err)
	}
	return root, nil
}

// errNotWritable is a state folder that opens but takes no new file.
var errNotWritable = errors.New("not writable")

// openIncidentsDir opens root/incidents, creating it 0750 when missing. A
// symlink there is refused: following it let pruning remove another
// folder's files.
func openIncidentsDir(root *os.Root, log *zap.Logger) (*os.Root, string) {
	path := filepath.Join(root.Name(), incidentsDir)
	memory := "; incident records are kept in memory only (they will not survive a restart of the guard)"
	fi, err := root.Lstat(incidentsDir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := root.Mkdir(incidentsDir, dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Sprintf("state: cannot create %s: %v%s", path, err, memory)
		}
		root.Chmod(incidentsDir, dirMode) // Mkdir's mode passed through the umask
		fi, err = root.Lstat(incidentsDir)
	}
	if err != nil {
		return nil, fmt.Sprintf("state: %s: %v%s", path, err, memory)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ := root.Readlink(incidentsDir)
		return nil, fmt.Sprintf("state: %s is a symlink (to %q); the guard does not follow it%s. Replace it with a folder (mode 0750)", path, target, memory)
	}
	if !fi.IsDir() {
		return nil, fmt.Sprintf("state: %s is not a folder (%s)%s. Remove it; the guard creates the folder", path, fi.Mode().Type(), memory)
	}
	inc, err := root.OpenRoot(incidentsDir)
	if err != nil {
		return nil, fmt.Sprintf("state: open %s: %v%s", path, err, memory)
	}
	if opened, err := inc.Stat("."); err != nil || !os.SameFile(fi, opened) {
		inc.Close()
		return nil, fmt.Sprintf("state: %s changed while it was opened%s", path, memory)
	}
	if err := probeWritable(inc); err != nil {
		inc.Close()
		return nil, fmt.Sprintf("state: cannot write in %s: %v%s", path, err, memory)
	}
	return inc, tighten(root, incidentsDir, log)
}

// tighten takes group write and every permission of others away from a
// folder of the guard's, and says so in the log; it returns a warning when
// it could not.
func tighten(root *os.Root, name string, log *zap.Logger) string {
	fi, err := root.Lstat(name)
	if err != nil || !fi.IsDir() {
		return ""
	}
	perm := fi.Mode().Perm()
	if perm&0o027 == 0 {
		return ""
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Sprintf("state: %s is mode %04o (writable or readable by others) and not the guard's to change; make it 0750",
			filepath.Join(root.Name(), name), perm)
	}
	if err := root.Chmod(name, perm&^0o027); err != nil {
		return fmt.Sprintf("state: cannot tighten %s from mode %04o: %v; make it 0750", filepath.Join(root.Name(), name), perm, err)
	}
	log.Info("tightened a state folder: incident records hold vLLM's log lines", zap.String("folder", filepath.Join(root.Name(), name)),
		zap.String("from", fmt.Sprintf("%04o", perm)), zap.String("to", fmt.Sprintf("%04o", perm&^0o027)))
	return ""
}

func probeWritable(root *os.Root) error {
	name := ".probe" + tempMarker + strconv.FormatUint(rand.Uint64(), 36)
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	return root.Remove(name)
}

func removeStaleTemps(root *os.Root, now time.Time) string {
	entries, err := readDir(root)
	if err != nil {
		return fmt.Sprintf("state: cannot list %s: %v", root.Name(), err)
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
		if err := root.Remove(e.Name()); err != nil {
			failed = append(failed, e.Name())
		}
	}
	if len(failed) > 0 {
		return fmt.Sprintf("state: cannot remove leftover temp files in %s: %s; remove them by hand", root.Name(), strings.Join(failed, ", "))
	}
	return ""
}

func readDir(root *os.Root) ([]fs.DirEntry, error) {
	d, err := root.Open(".")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadDir(-1)
}

func isTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempMarker)
}

// Close releases the open folders. The Store must not be used after.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, r := range []*os.Root{s.inc, s.incRead, s.root} {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	s.inc, s.incRead, s.root, s.persistent = nil, nil, nil, false
	return errors.Join(errs...)
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// Persistent reports whether the Store writes state.json to disk (false:
// memory only).
func (s *Store) Persistent() bool { return s.persistent }

// NotWritable says why the state folder cannot be written ("" when it
// can): the saved state was read from it and stays in force.
func (s *Store) NotWritable() string {
	if s.readOnly == nil {
		return ""
	}
	return s.readOnly.Error()
}

// RecordsReadable reports whether incident records can be read from
// dir/incidents (written there, or a read-only folder's).
func (s *Store) RecordsReadable() bool { return s.inc != nil || s.incRead != nil }

// IncidentsOnDisk reports whether incident records are written to
// dir/incidents (false: kept in memory).
func (s *Store) IncidentsOnDisk() bool { return s.inc != nil }

// StatePath is dir/state.json.
func (s *Store) StatePath() string { return filepath.Join(s.dir, stateFile) }

// Load reads state.json into v. found is false when there is none yet. A
// file that cannot be read or decoded, or that is not a regular file (a
// FIFO, a symlink), is moved aside to state.json.corrupt-<UTC time> so the
// next Save starts clean; warning names both paths. Load never fails the
// guard, and never blocks on what it finds.
func (s *Store) Load(v any) (found bool, warning string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.persistent && s.readOnly != nil && s.memState == nil {
		data, err := readCapped(s.root, stateFile, maxStateBytes)
		if errors.Is(err, fs.ErrNotExist) {
			return false, ""
		}
		if err == nil {
			if err = json.Unmarshal(data, v); err == nil {
				return true, ""
			}
		}
		return false, fmt.Sprintf("state: %s is unreadable (%v) and the folder is not writable, so it stays; starting from defaults (rung 0)", s.StatePath(), err)
	}
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
	data, err := readCapped(s.root, stateFile, maxStateBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return false, ""
	}
	if err == nil {
		err = json.Unmarshal(data, v)
		if err == nil {
			return true, ""
		}
	}
	stamp := s.now().UTC().Format("20060102T150405Z")
	aside := stateFile + ".corrupt-" + stamp
	for i := 2; s.exists(s.root, aside); i++ { // keep every corrupt copy for a post-mortem
		aside = fmt.Sprintf("%s.corrupt-%s-%d", stateFile, stamp, i)
	}
	asidePath := filepath.Join(s.dir, aside)
	if rerr := s.root.Rename(stateFile, aside); rerr != nil {
		return false, fmt.Sprintf("state: %s is unreadable (%v) and could not be moved aside to %s (%v); starting from defaults: remove the file by hand", path, err, asidePath, rerr)
	}
	return false, fmt.Sprintf("state: %s was unreadable (%v); moved it aside to %s and started from defaults (rung 0)", path, err, asidePath)
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
		if s.readOnly != nil {
			return fmt.Errorf("state: save: %s is not writable (%w); the new state is kept in memory only", s.dir, s.readOnly)
		}
		return nil
	}
	if err := writeAtomic(s.root, stateFile, data, fileMode); err != nil {
		return fmt.Errorf("state: save: %w", err)
	}
	return nil
}

func (s *Store) exists(root *os.Root, name string) bool {
	_, err := root.Lstat(name)
	return err == nil
}
