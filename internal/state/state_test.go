package state

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

type saved struct {
	Rung  int    `json:"rung"`
	Notes string `json:"notes"`
}

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, warnings, err := Open(dir, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) > 0 {
		t.Fatalf("Open(%s) warned: %v", dir, warnings)
	}
	if !s.Persistent() {
		t.Fatalf("Open(%s) is not persistent", dir)
	}
	return s
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	for _, body := range []string{"first", "second"} {
		if err := WriteFileAtomic(p, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != body {
			t.Fatalf("read back %q, %v; want %q", got, err, body)
		}
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temp files left behind: %v", entries)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "f"), nil, 0o640); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("write into a missing directory: %v; want an error naming the path", err)
	}
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	var v saved
	if found, w := s.Load(&v); found || w != "" {
		t.Fatalf("empty dir: found=%v warning=%q", found, w)
	}
	if err := s.Save(saved{Rung: 2, Notes: "x"}); err != nil {
		t.Fatal(err)
	}
	// A new Store over the same directory: what a restarted guard sees.
	if found, w := open(t, dir).Load(&v); !found || w != "" || v.Rung != 2 {
		t.Fatalf("after restart: found=%v warning=%q v=%+v", found, w, v)
	}
	for _, sub := range []string{dir, filepath.Join(dir, "incidents")} {
		fi, err := os.Stat(sub)
		if err != nil || !fi.IsDir() {
			t.Fatalf("%s not created: %v", sub, err)
		}
	}
}

// A crash between writing the temp file and the rename leaves the old
// state.json whole; the next Open clears the debris once it is stale.
func TestCrashMidWriteKeepsOldState(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Save(saved{Rung: 1}); err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(dir, ".state.json"+tempMarker+"123")
	if err := os.WriteFile(torn, []byte(`{"rung": 3, "no`), 0o640); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "incidents", ".x.json"+tempMarker+"456")
	if err := os.WriteFile(fresh, []byte(`{`), 0o640); err != nil {
		t.Fatal(err)
	}
	var v saved
	if found, w := s.Load(&v); !found || w != "" || v.Rung != 1 {
		t.Fatalf("after a torn write: found=%v warning=%q v=%+v; want the old rung 1", found, w, v)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(torn, old, old); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, dir)
	if _, err := os.Stat(torn); !os.IsNotExist(err) {
		t.Errorf("stale temp file %s not removed: %v", torn, err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh temp file (a write in progress elsewhere) was removed: %v", err)
	}
	if incs, err := s2.Incidents(0); err != nil || len(incs) != 0 {
		t.Errorf("temp files listed as incidents: %v %v", incs, err)
	}
}

func TestCorruptStateMovedAside(t *testing.T) {
	for name, body := range map[string]string{"garbage": "{not json", "empty": "", "wrong type": `{"rung": "two"}`} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			s.now = func() time.Time { return time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("X", 3600)) }
			if err := os.WriteFile(s.StatePath(), []byte(body), 0o640); err != nil {
				t.Fatal(err)
			}
			var v saved
			found, w := s.Load(&v)
			aside := s.StatePath() + ".corrupt-20260304T040607Z"
			if found || !strings.Contains(w, s.StatePath()) || !strings.Contains(w, aside) {
				t.Fatalf("found=%v warning=%q; want a warning naming %s and %s", found, w, s.StatePath(), aside)
			}
			if got, err := os.ReadFile(aside); err != nil || string(got) != body {
				t.Fatalf("moved-aside copy: %q %v", got, err)
			}
			if _, err := os.Stat(s.StatePath()); !os.IsNotExist(err) {
				t.Fatalf("corrupt state.json still in place: %v", err)
			}
			// A second corrupt file in the same second keeps the first copy.
			if err := os.WriteFile(s.StatePath(), []byte("x"), 0o640); err != nil {
				t.Fatal(err)
			}
			if _, w := s.Load(&v); !strings.Contains(w, aside+"-2") {
				t.Fatalf("second corrupt file: warning %q; want it moved to %s-2", w, aside)
			}
			if err := s.Save(saved{Rung: 4}); err != nil {
				t.Fatal(err)
			}
			if found, w := s.Load(&v); !found || w != "" || v.Rung != 4 {
				t.Fatalf("after Save: found=%v warning=%q v=%+v", found, w, v)
			}
		})
	}
}

// Tests run as root, so chmod cannot make a directory unwritable: put the
// state directory under a regular file instead.
func TestUnwritableDirRunsInMemory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(file, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(file, "state")
	s, warnings, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Persistent() || len(warnings) != 1 || !strings.Contains(warnings[0], dir) || !strings.Contains(warnings[0], "without persistence") {
		t.Fatalf("persistent=%v warnings=%q; want memory-only with a warning naming %s", s.Persistent(), warnings, dir)
	}
	var v saved
	if found, _ := s.Load(&v); found {
		t.Fatal("found state before any Save")
	}
	if err := s.Save(saved{Rung: 3}); err != nil {
		t.Fatal(err)
	}
	if found, w := s.Load(&v); !found || w != "" || v.Rung != 3 {
		t.Fatalf("in-memory Load: found=%v warning=%q v=%+v", found, w, v)
	}
	s.MaxIncidents = 2
	for i := range 3 {
		if p, err := s.AddIncident(Incident{Time: time.Unix(int64(i), 0), Cause: cause.CauseCrash}); err != nil || p != "" {
			t.Fatalf("in-memory AddIncident: %q %v", p, err)
		}
	}
	incs, err := s.Incidents(0)
	if err != nil || len(incs) != 2 || incs[0].Time.Unix() != 2 || incs[1].Time.Unix() != 1 {
		t.Fatalf("in-memory incidents: %+v %v; want the 2 newest, newest first", incs, err)
	}
	if _, _, err := Open("", nil); err == nil {
		t.Error("Open(\"\") succeeded")
	}
}

func sampleIncident(at time.Time, c cause.Cause) Incident {
	return Incident{
		Time:        at,
		Cause:       c,
		Confidence:  "high",
		Summary:     "GPU out of memory while serving",
		Evidence:    []cause.Line{{N: 812, Stream: "stderr", Text: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}},
		ExitCode:    1,
		Phase:       cause.PhaseReady,
		RungBefore:  policy.Rung{Index: 0, MaxNumSeqs: 256, GPUMemoryUtilization: 0.85},
		RungAfter:   policy.Rung{Index: 1, MaxNumSeqs: 128, GPUMemoryUtilization: 0.80},
		Action:      policy.ActionRestart,
		Reason:      "OOM: one rung down",
		Delay:       5 * time.Second,
		LastLines:   []string{"a", "b"},
		Memory:      []MemSample{{T: at.Add(-time.Second), Fraction: 0.96}, {T: at, Fraction: 0.99}},
		MemoryTrend: "rising 0.90→0.99 in 2m",
	}
}

func TestIncidentRoundTrip(t *testing.T) {
	s := open(t, t.TempDir())
	at := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	in := sampleIncident(at, cause.CauseOOM)
	p, err := s.AddIncident(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(s.Dir(), "incidents", "20260102T030405.600000Z-oom.json"); p != want {
		t.Errorf("path %s, want %s", p, want)
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	if generic["delay"] != "5s" || generic["cause"] != "oom" || generic["id"] != "20260102T030405.600000Z-oom" {
		t.Errorf("JSON fields: delay=%v cause=%v id=%v", generic["delay"], generic["cause"], generic["id"])
	}
	incs, err := s.Incidents(1)
	if err != nil || len(incs) != 1 {
		t.Fatalf("Incidents: %v %v", incs, err)
	}
	in.ID = "20260102T030405.600000Z-oom"
	got, _ := json.Marshal(incs[0])
	want, _ := json.Marshal(in)
	if !bytes.Equal(got, want) || incs[0].Delay != 5*time.Second {
		t.Errorf("round trip:\n got %s\nwant %s", got, want)
	}
}

func TestIncidentsOrderPruneAndSkip(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	dir := t.TempDir()
	s, _, err := Open(dir, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	s.MaxIncidents = 3
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	// Added out of order: names (and so pruning) follow the incident time.
	for _, m := range []int{2, 0, 4, 1, 3} {
		if _, err := s.AddIncident(sampleIncident(base.Add(time.Duration(m)*time.Minute), cause.CauseCrash)); err != nil {
			t.Fatal(err)
		}
	}
	// Same time and cause twice: two records, none overwritten.
	if _, err := s.AddIncident(sampleIncident(base.Add(4*time.Minute), cause.CauseCrash)); err != nil {
		t.Fatal(err)
	}
	names, err := recordNames(s.inc)
	if err != nil || len(names) != 3 {
		t.Fatalf("after pruning to 3: %v %v", names, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "incidents", "20990101T000000.000000Z-oom.json"), []byte("{torn"), 0o640); err != nil {
		t.Fatal(err)
	}
	incs, err := s.Incidents(0)
	if err != nil {
		t.Fatal(err)
	}
	// The torn record is named (its file, its time and cause from the
	// name, why), not hidden; then the others, newest first.
	if len(incs) != 4 || incs[0].ID != "20990101T000000.000000Z-oom" || incs[0].Cause != cause.CauseOOM ||
		incs[0].Time.Year() != 2099 || !strings.Contains(incs[0].Unreadable, "not a readable record") {
		t.Fatalf("the torn record is not named first: %+v", incs)
	}
	var mins []int
	for _, inc := range incs[1:] {
		mins = append(mins, int(inc.Time.Sub(base)/time.Minute))
	}
	if len(mins) != 3 || mins[0] != 4 || mins[1] != 4 || mins[2] != 3 {
		t.Errorf("incidents newest first: minutes %v, want [4 4 3]", mins)
	}
	if logs.FilterMessage("an incident record cannot be read").Len() != 1 {
		t.Errorf("no warning for the unreadable record: %v", logs.All())
	}
	if incs, _ := s.Incidents(2); len(incs) != 2 {
		t.Errorf("Incidents(2) returned %d", len(incs))
	}
}

func TestIncidentTable(t *testing.T) {
	var buf bytes.Buffer
	if err := writeIncidents(&buf, nil); err != nil || buf.String() != "no incidents recorded\n" {
		t.Fatalf("empty: %q %v", buf.String(), err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	oom := sampleIncident(at, cause.CauseOOM)
	giveUp := sampleIncident(at.Add(time.Hour), cause.CauseConfigError)
	giveUp.Action = policy.ActionGiveUp
	giveUp.Evidence = []cause.Line{{N: 3, Text: "error: unrecognized arguments:\t--bogus " + strings.Repeat("x", 200)}}
	giveUp.MemoryTrend = ""
	buf.Reset()
	if err := writeIncidents(&buf, []Incident{giveUp, oom}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME (UTC)") {
		t.Fatalf("want a header and 2 rows:\n%s", buf.String())
	}
	for _, want := range []string{"2026-01-02 04:04:05", "config_error", "0 (256, 0.85) → gave up", "L3: error: unrecognized arguments: --bogus", "…"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("row 1 lacks %q: %s", want, lines[1])
		}
	}
	for _, want := range []string{"2026-01-02 03:04:05", "oom", "0 (256, 0.85) → 1 (128, 0.80)", "rising 0.90→0.99 in 2m", "L812: torch.OutOfMemoryError"} {
		if !strings.Contains(lines[2], want) {
			t.Errorf("row 2 lacks %q: %s", want, lines[2])
		}
	}
	if strings.Contains(lines[1], "\t") || len([]rune(lines[1])) > 200 {
		t.Errorf("row not kept to one bounded line: %q", lines[1])
	}
}

// The account of what became of a death's requests comes after the record:
// the file is replaced whole (a new file renamed over it, no temp file
// left, the other fields kept), masked, and shown in the table.
func TestUpdateIncidentRewritesAtomically(t *testing.T) {
	s := open(t, t.TempDir())
	at := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	p, err := s.AddIncident(sampleIncident(at, cause.CauseOOM))
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	req := &DeathRequests{RequestOutcomes: RequestOutcomes{Touched: 4, Continued: 1, Replayed: 1, ServedAfterHold: 1, NotResumed: map[string]int{"n": 1}},
		Streams:          &RequestOutcomes{Touched: 2, Continued: 1, NotResumed: map[string]int{"n": 1}},
		NonStreaming:     &RequestOutcomes{Touched: 1, Replayed: 1},
		ArrivedWhileDown: &RequestOutcomes{Touched: 1, ServedAfterHold: 1}}
	found, err := s.UpdateIncident(at.In(time.FixedZone("x", 3600)), cause.CauseOOM, func(inc *Incident) {
		inc.Requests = req
		inc.Summary = "api_key=sk-secret-value-1234"
	})
	if err != nil || !found {
		t.Fatalf("UpdateIncident: found %v, %v", found, err)
	}
	after, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(before, after) {
		t.Error("the record was written in place, not replaced by a rename: a reader could see half of it")
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("incidents folder holds %d entries after the rewrite, want the one record: %v", len(entries), entries)
	}
	raw, _ := os.ReadFile(p)
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatalf("rewritten record: %v\n%s", err, raw)
	}
	r, _ := generic["requests"].(map[string]any)
	nr, _ := r["not_resumed"].(map[string]any)
	streams, _ := r["streams"].(map[string]any)
	if r["touched"] != 4.0 || r["continued"] != 1.0 || r["pending"] != 0.0 || nr["n"] != 1.0 || streams["touched"] != 2.0 ||
		generic["delay"] != "5s" || generic["memory_trend"] != "rising 0.90→0.99 in 2m" {
		t.Errorf("rewritten record lost or lacks fields:\n%s", raw)
	}
	if strings.Contains(string(raw), "sk-secret-value-1234") {
		t.Errorf("rewritten record not masked:\n%s", raw)
	}
	incs, _ := s.Incidents(1)
	var table bytes.Buffer
	if err := writeIncidents(&table, incs); err != nil {
		t.Fatal(err)
	}
	if want := "4 touched: 1 continued, 1 replayed, 1 served after hold, 1 not resumed (n)"; !strings.Contains(table.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, table.String())
	}
	if found, err := s.UpdateIncident(at.Add(time.Second), cause.CauseOOM, func(*Incident) {}); found || err != nil {
		t.Errorf("UpdateIncident of no record: found %v, %v", found, err)
	}
}

// writeIncidents writes the `vllm-guard incidents` table of incs, as the
// command does record by record.
func writeIncidents(w io.Writer, incs []Incident) error {
	var t IncidentTable
	for _, inc := range incs {
		t.Add(inc)
	}
	return t.Write(w)
}
