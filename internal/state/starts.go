package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/vllm-guard/vllm-guard/internal/starttimes"
)

// starts.json: what this host's earlier starts of vLLM took
// (internal/starttimes), for the time to ready the status expects. Its
// own file beside state.json: losing it costs an estimate, never the
// rung.
const (
	startsFile     = "starts.json"
	maxStartsBytes = 1 << 20 // a full record is a few tens of KiB
)

// StartsPath is dir/starts.json.
func (s *Store) StartsPath() string { return filepath.Join(s.dir, startsFile) }

// LoadStarts reads starts.json (an empty record when there is none). A
// file that cannot be read or decoded is moved aside to
// starts.json.corrupt-<UTC time>, and warning says so; records that
// cannot be a start's are dropped, and said. It never fails the guard.
func (s *Store) LoadStarts() (h starttimes.History, warning string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var data []byte
	var err error
	switch {
	case s.memStarts != nil:
		data = s.memStarts
	case s.root != nil:
		data, err = readCapped(s.root, startsFile, maxStartsBytes)
	default:
		return h, ""
	}
	if errors.Is(err, fs.ErrNotExist) {
		return h, ""
	}
	if err == nil {
		err = json.Unmarshal(data, &h)
	}
	if err != nil {
		return starttimes.History{}, s.startsAside(err)
	}
	h, dropped := h.Clean()
	if dropped > 0 {
		warning = fmt.Sprintf("state: %s held %d records that cannot be a start's (no model, a time to ready out of range) or more than are kept; they were left out", s.StartsPath(), dropped)
	}
	return h, warning
}

// startsAside moves an unreadable starts.json aside (when the folder can
// be written) and says so.
func (s *Store) startsAside(err error) string {
	path := s.StartsPath()
	if !s.persistent {
		return fmt.Sprintf("state: %s is unreadable (%v); the expected time to ready starts afresh", path, err)
	}
	aside := startsFile + ".corrupt-" + s.now().UTC().Format("20060102T150405Z")
	for i := 2; s.exists(s.root, aside); i++ {
		aside = fmt.Sprintf("%s.corrupt-%s-%d", startsFile, s.now().UTC().Format("20060102T150405Z"), i)
	}
	if rerr := s.root.Rename(startsFile, aside); rerr != nil {
		return fmt.Sprintf("state: %s is unreadable (%v) and could not be moved aside (%v); the expected time to ready starts afresh: remove the file by hand", path, err, rerr)
	}
	return fmt.Sprintf("state: %s was unreadable (%v); moved it aside to %s; the expected time to ready starts afresh", path, err, filepath.Join(s.dir, aside))
}

// SaveStarts writes h as starts.json, atomically.
func (s *Store) SaveStarts(h starttimes.History) error {
	data, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("state: encode the starts' record: %w", err)
	}
	data = append(data, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.persistent {
		s.memStarts = data
		if s.readOnly != nil {
			return fmt.Errorf("state: save %s: the folder is not writable (%w); the record is kept in memory only", s.StartsPath(), s.readOnly)
		}
		return nil
	}
	if err := writeAtomic(s.root, startsFile, data, fileMode); err != nil {
		return fmt.Errorf("state: save the starts' record: %w", err)
	}
	return nil
}
