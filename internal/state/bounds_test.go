package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vllm-guard/vllm-guard/internal/cause"
)

// hostileLines is what vLLM prints after clients sent long queries: n
// access lines of 16 KiB each, the client's text mostly '<' (six bytes
// each once escaped as JSON).
func hostileLines(n int) []string {
	lines := make([]string, n)
	for i := range lines {
		q := strings.Repeat("<", 16000-64)
		lines[i] = fmt.Sprintf(`(APIServer pid=1) INFO:     127.0.0.1:%d - "GET /v1/models?q=%s HTTP/1.1" 401`, 40000+i, q)
	}
	return lines
}

// Issue 41 item 6: 200 (and child_lines' 4096) lines of 16 KiB of '<'
// made a 16.7 MB (and a 400 MB) record. A record is bounded by what it is
// for: the newest lines that fit, counted when left out.
func TestRecordIsBoundedWhateverVLLMPrinted(t *testing.T) {
	for _, n := range []int{200, 4096} {
		s := open(t, t.TempDir())
		inc := sampleIncident(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), cause.CauseCrash)
		inc.LastLines = append(hostileLines(n), "the last line vLLM printed")
		inc.Evidence = []cause.Line{{N: 1, Text: strings.Repeat("<", 1<<20)}}
		p, err := s.AddIncident(inc)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > MaxRecordLinesBytes+256<<10 {
			t.Errorf("%d lines: the record is %d bytes, more than its bound (%d of lines)", n, fi.Size(), MaxRecordLinesBytes)
		}
		incs, err := s.Incidents(1)
		if err != nil || len(incs) != 1 || incs[0].Unreadable != "" {
			t.Fatalf("%d lines: the record does not read back: %v %+v", n, err, incs)
		}
		got := incs[0]
		if last := got.LastLines[len(got.LastLines)-1]; last != "the last line vLLM printed" {
			t.Errorf("%d lines: the newest line was not kept: %.80q", n, last)
		}
		if got.LastLinesOmitted+len(got.LastLines) != n+1 || got.LastLinesOmitted == 0 {
			t.Errorf("%d lines: kept %d, omitted %d; want them to add up to %d", n, len(got.LastLines), got.LastLinesOmitted, n+1)
		}
		if len(got.Evidence[0].Text) > MaxRecordLineBytes {
			t.Errorf("%d lines: an evidence line of %d bytes", n, len(got.Evidence[0].Text))
		}
	}
}

// The records are bounded in total bytes as well as in count: the oldest
// go first, before the new one is written.
func TestRecordsArePrunedByTotalBytes(t *testing.T) {
	s := open(t, t.TempDir())
	s.MaxIncidentBytes = 3 << 20
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for i := range 6 {
		inc := sampleIncident(base.Add(time.Duration(i)*time.Minute), cause.CauseCrash)
		inc.LastLines = hostileLines(200)
		if _, err := s.AddIncident(inc); err != nil {
			t.Fatal(err)
		}
		recs, err := s.records()
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, r := range recs {
			total += r.size
		}
		if total > s.MaxIncidentBytes {
			t.Fatalf("after %d records: %d bytes kept, more than the %d bound", i+1, total, s.MaxIncidentBytes)
		}
		if newest := recs[len(recs)-1].name; !strings.HasPrefix(newest, base.Add(time.Duration(i)*time.Minute).Format("20060102T150405")) {
			t.Fatalf("after %d records the newest kept is %s: the new record was dropped", i+1, newest)
		}
	}
	if incs, _ := s.Incidents(0); len(incs) < 2 || len(incs) > 3 {
		t.Errorf("%d records kept under a 3 MiB bound of ~1 MiB records", len(incs))
	}
}

// A full disk (ENOSPC at the write) drops the oldest record, not the new
// one: pruning does not wait on a successful write.
func TestFullDiskDropsTheOldestNotTheNewest(t *testing.T) {
	s := open(t, t.TempDir())
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3 {
		if _, err := s.AddIncident(sampleIncident(base.Add(time.Duration(i)*time.Minute), cause.CauseCrash)); err != nil {
			t.Fatal(err)
		}
	}
	// The disk is full until two old records are gone.
	s.failWrite = func(string) error {
		if n, _ := recordNames(s.inc); len(n) > 1 {
			return &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}
		}
		return nil
	}
	p, err := s.AddIncident(sampleIncident(base.Add(time.Hour), cause.CauseOOM))
	if err != nil {
		t.Fatalf("the new record was not written on a full disk: %v", err)
	}
	names, _ := recordNames(s.inc)
	if len(names) != 2 || names[1] != filepath.Base(p) || !strings.HasPrefix(names[0], base.Add(2*time.Minute).Format("20060102T150405")) {
		t.Errorf("kept %v; want the newest old record and the new one", names)
	}
	// Nothing fits at all: the error says so, no record is lost but the
	// ones that had to go.
	s.failWrite = func(string) error { return &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC} }
	if _, err := s.AddIncident(sampleIncident(base.Add(2*time.Hour), cause.CauseOOM)); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a write that never fits: %v", err)
	}
}

// The reader names what it cannot read (a record larger than it reads, a
// torn one) instead of hiding it, without reading the large one whole,
// and holds one record at a time.
func TestReaderNamesWhatItCannotReadAndHoldsOneRecord(t *testing.T) {
	s := open(t, t.TempDir())
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10 {
		inc := sampleIncident(base.Add(time.Duration(i)*time.Minute), cause.CauseCrash)
		inc.LastLines = hostileLines(200)
		if _, err := s.AddIncident(inc); err != nil {
			t.Fatal(err)
		}
	}
	big := filepath.Join(s.Dir(), "incidents", "20260601T000000.000000Z-oom.json")
	if err := os.WriteFile(big, []byte(`{"cause":"oom","last_lines":["`+strings.Repeat("x", MaxRecordFileBytes)+`"]}`), 0o640); err != nil {
		t.Fatal(err)
	}
	var heap runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heap)
	base0 := heap.HeapAlloc
	var peak uint64
	var got []Incident
	err := s.EachIncident(0, func(inc Incident) error {
		runtime.GC()
		runtime.ReadMemStats(&heap)
		if heap.HeapAlloc > base0 {
			peak = max(peak, heap.HeapAlloc-base0)
		}
		inc.LastLines = nil // keep what the test needs, not the record
		got = append(got, inc)
		return nil
	})
	if err != nil || len(got) != 11 {
		t.Fatalf("EachIncident: %v, %d records", err, len(got))
	}
	if got[0].ID != "20260601T000000.000000Z-oom" || !strings.Contains(got[0].Unreadable, "more than") || got[0].Cause != cause.CauseOOM {
		t.Errorf("the over-large record is not named first: %+v", got[0])
	}
	// One record is ~1 MiB; holding the 10 would be 10 MiB.
	if peak > 4<<20 {
		t.Errorf("the reader held %d bytes between records; one record is ~1 MiB", peak)
	}
}

// FuzzCutJSON: the cut text, written as JSON, takes at most n bytes (plus
// its quotes), stays valid UTF-8 when s is, and is s itself when it fits.
func FuzzCutJSON(f *testing.F) {
	f.Add("<<<<<<<<", 10)
	f.Add("héllo wörld", 5)
	f.Add("\x1b[2J\u2028\xff", 7)
	f.Add(strings.Repeat("a", 600), 512)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 4 || n > 1<<16 {
			return
		}
		got := CutJSON(s, n)
		if EscapedLen(got)-2 > n {
			t.Errorf("CutJSON(%q, %d) = %q takes %d bytes as JSON", s, n, got, EscapedLen(got)-2)
		}
		if EscapedLen(s)-2 <= n && got != s {
			t.Errorf("CutJSON(%q, %d) = %q; it fitted", s, n, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Errorf("CutJSON(%q, %d) = %q is not valid UTF-8", s, n, got)
		}
	})
}
