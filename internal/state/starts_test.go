package state

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/starttimes"
)

func TestStartsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if h, w := s.LoadStarts(); len(h.Starts) != 0 || w != "" {
		t.Fatalf("no file yet: %+v %q", h, w)
	}
	h := starttimes.History{}.Add(starttimes.Start{Model: "m", TimeToReady: 31 * time.Second, Cold: true, Boot: "b",
		Phases: []starttimes.Phase{{Name: "weights", Took: 20 * time.Second}}})
	if err := s.SaveStarts(h); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(s.StartsPath()); err != nil || fi.Mode().Perm() != fileMode {
		t.Fatalf("starts.json: %v %v, want mode %v", fi, err, fileMode)
	}
	got, w := open(t, dir).LoadStarts()
	if w != "" || len(got.Starts) != 1 || got.Starts[0].TimeToReady != 31*time.Second || got.Starts[0].Phases[0].Took != 20*time.Second {
		t.Fatalf("read back: %+v %q", got, w)
	}
}

func TestCorruptStartsMovedAside(t *testing.T) {
	for name, body := range map[string]string{"garbage": "{not json", "wrong type": `{"starts": 3}`,
		"too large": `{"starts": [` + strings.Repeat(" ", maxStartsBytes) + `]}`} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			s.now = func() time.Time { return time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC) }
			if err := os.WriteFile(s.StartsPath(), []byte(body), 0o640); err != nil {
				t.Fatal(err)
			}
			h, w := s.LoadStarts()
			aside := s.StartsPath() + ".corrupt-20260304T050607Z"
			if len(h.Starts) != 0 || !strings.Contains(w, aside) || !strings.Contains(w, "moved it aside") {
				t.Fatalf("%+v, warning %q; want one naming %s", h, w, aside)
			}
			if got, err := os.ReadFile(aside); err != nil || string(got) != body {
				t.Fatalf("moved-aside copy: %d bytes, %v", len(got), err)
			}
			if _, err := os.Stat(s.StartsPath()); !os.IsNotExist(err) {
				t.Fatalf("corrupt starts.json still in place: %v", err)
			}
			if err := s.SaveStarts(starttimes.History{}.Add(starttimes.Start{Model: "m", TimeToReady: time.Second})); err != nil {
				t.Fatal(err)
			}
			if h, w := s.LoadStarts(); len(h.Starts) != 1 || w != "" {
				t.Fatalf("after a save: %+v %q", h, w)
			}
		})
	}
}

// Records another process could have written: what cannot be a start's is
// left out, and said.
func TestStartsOutOfRangeLeftOut(t *testing.T) {
	s := open(t, t.TempDir())
	body := `{"starts":[{"model":"m","rung":0,"time_to_ready_ns":31000000000},{"model":"","time_to_ready_ns":1},{"model":"m","time_to_ready_ns":-5}]}`
	if err := os.WriteFile(s.StartsPath(), []byte(body), 0o640); err != nil {
		t.Fatal(err)
	}
	h, w := s.LoadStarts()
	if len(h.Starts) != 1 || !strings.Contains(w, "2 records") {
		t.Fatalf("%+v %q", h, w)
	}
}

func TestStartsInMemory(t *testing.T) {
	s := &Store{dir: "/nonexistent", now: time.Now}
	h := starttimes.History{}.Add(starttimes.Start{Model: "m", TimeToReady: time.Second})
	if err := s.SaveStarts(h); err != nil {
		t.Fatal(err)
	}
	if got, w := s.LoadStarts(); len(got.Starts) != 1 || w != "" {
		t.Fatalf("in memory: %+v %q", got, w)
	}
}

// Whatever starts.json holds, LoadStarts returns a record within bounds,
// each start one a start could be, or moves the file aside and says so.
func FuzzLoadStarts(f *testing.F) {
	f.Add([]byte(`{"starts":[{"model":"m","rung":0,"time_to_ready_ns":31000000000,"cold":true,"phases":[{"phase":"weights","took_ns":1}]}]}`))
	f.Add([]byte(`{"starts":[{"model":"","time_to_ready_ns":-1}]}`))
	f.Add([]byte(`{"starts":null}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, body []byte) {
		s := open(t, t.TempDir())
		if err := os.WriteFile(s.StartsPath(), body, 0o640); err != nil {
			t.Fatal(err)
		}
		h, w := s.LoadStarts()
		if len(h.Starts) > starttimes.MaxStarts {
			t.Fatalf("%d starts, more than %d", len(h.Starts), starttimes.MaxStarts)
		}
		for _, st := range h.Starts {
			if st.Model == "" || st.TimeToReady <= 0 || st.Rung < 0 {
				t.Fatalf("a start that cannot be one: %+v", st)
			}
		}
		if strings.Contains(w, "moved it aside") {
			if _, err := os.Stat(s.StartsPath()); !os.IsNotExist(err) {
				t.Fatalf("said moved aside, but %s is still there: %v", s.StartsPath(), err)
			}
		}
	})
}
