package state

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"unicode/utf8"
)

// Bounds of an incident record: whatever vLLM printed and whatever a
// client made it quote, a record stays small enough to read, serve and
// keep by the hundred. The full lines are in the guard's log (journald).
const (
	// MaxRecordLineBytes bounds one of vLLM's lines in a record (the log
	// pump keeps lines of up to 16 KiB).
	MaxRecordLineBytes = 16 << 10
	// MaxRecordLinesBytes bounds a record's last lines together, measured
	// as written (JSON escaping turns a '<' into six bytes): the newest
	// lines are kept, LastLinesOmitted counts the others.
	MaxRecordLinesBytes = 1 << 20
	// maxRecordEvidence bounds the evidence lines of a record.
	maxRecordEvidence = 64
	// maxRecordText bounds the summary, the reason and a suspect's path.
	maxRecordText = 16 << 10
	// MaxRecordFileBytes is the largest record file the reader reads (the
	// bound of earlier versions, whose records were not bounded; it reads
	// one at a time and bounds what it read); a larger one is named as
	// unreadable. Records this version writes stay near 1 MiB.
	MaxRecordFileBytes = 32 << 20
	// DefaultMaxIncidentBytes bounds incidents/ in bytes as MaxIncidents
	// does in count: a quarter of the chart's default 1 GiB state volume.
	DefaultMaxIncidentBytes = 256 << 20
)

// Bounded returns inc within a record's bounds: each text cut (UTF-8
// intact, "…" where cut), the evidence lines at most maxRecordEvidence,
// and only the newest last lines that fit MaxRecordLinesBytes as JSON,
// the others counted in LastLinesOmitted.
func Bounded(inc Incident) Incident {
	inc.Summary = Cut(inc.Summary, maxRecordText)
	inc.Reason = Cut(inc.Reason, maxRecordText)
	if len(inc.Evidence) > maxRecordEvidence {
		inc.Evidence = inc.Evidence[:maxRecordEvidence]
	}
	inc.Evidence = slices.Clone(inc.Evidence)
	for i := range inc.Evidence {
		inc.Evidence[i].Text = Cut(inc.Evidence[i].Text, MaxRecordLineBytes)
	}
	var omitted int
	inc.LastLines, omitted = NewestLines(inc.LastLines, MaxRecordLineBytes, MaxRecordLinesBytes)
	inc.LastLinesOmitted += omitted
	inc.Suspects = slices.Clone(inc.Suspects)
	for i := range inc.Suspects {
		inc.Suspects[i].Path = Cut(inc.Suspects[i].Path, maxRecordText)
		inc.Suspects[i].Client = Cut(inc.Suspects[i].Client, maxRecordText)
	}
	return inc
}

// masked is Bounded(Redacted(inc)), with the lines Bounded would leave
// out dropped first (whole, before masking: a line is masked uncut), so
// masking costs what is kept, not what vLLM printed.
func masked(inc Incident) Incident {
	_, from := NewestLines(inc.LastLines, MaxRecordLineBytes, MaxRecordLinesBytes)
	if from > 0 {
		inc.LastLines = inc.LastLines[from:]
		inc.LastLinesOmitted += from
	}
	return Bounded(Redacted(inc))
}

// NewestLines keeps the newest of lines, each cut to lineBytes as JSON, while
// their JSON (escaped, with quotes and commas) fits totalBytes; omitted
// counts the older lines left out. lines is not changed.
func NewestLines(lines []string, lineBytes, totalBytes int) (kept []string, omitted int) {
	if lines == nil {
		return nil, 0
	}
	total, from := 2, len(lines)
	cuts := make([]string, 0, min(len(lines), 64))
	for from > 0 {
		l := CutJSON(lines[from-1], lineBytes)
		size := EscapedLen(l) + 1
		if total+size > totalBytes {
			break
		}
		total += size
		cuts = append(cuts, l)
		from--
	}
	kept = make([]string, len(cuts))
	for i, l := range cuts {
		kept[len(cuts)-1-i] = l
	}
	return kept, from
}

// EscapedLen is the length of s written as a JSON string, quotes
// included (as encoding/json writes it: '<', '>', '&' as \u003c ...).
func EscapedLen(s string) int {
	b, err := json.Marshal(s)
	if err != nil {
		return 6 * len(s)
	}
	return len(b)
}

// Cut bounds s to at most n bytes, cut at a UTF-8 boundary and ending in
// "…" when cut.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := max(n-len("…"), 0)
	for i > 0 && s[i]&0xc0 == 0x80 { // not inside a UTF-8 sequence
		i--
	}
	return s[:i] + "…"
}

// CutJSON bounds s so that written as a JSON string (quotes excluded) it
// takes at most n bytes: a '<' counts six (\u003c), as encoding/json
// writes it. Cut at a rune, "…" where cut.
func CutJSON(s string, n int) string {
	if len(s)*6 <= n {
		return s
	}
	size := 0
	for i, r := range s {
		c := escapedRune(r, s[i:])
		if size+c > n {
			// Room for the "…" (3 bytes): step back as needed.
			j := i
			for size+3 > n && j > 0 {
				_, w := utf8.DecodeLastRuneInString(s[:j])
				r2, _ := utf8.DecodeRuneInString(s[j-w:])
				size -= escapedRune(r2, s[j-w:])
				j -= w
			}
			return s[:j] + "…"
		}
		size += c
	}
	return s
}

// escapedRune is what r (at the start of rest) takes in a JSON string.
func escapedRune(r rune, rest string) int {
	switch {
	case r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return 6
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t' || r == '\b' || r == '\f':
		return 2
	case r < 0x20:
		return 6
	case r == utf8.RuneError:
		if _, w := utf8.DecodeRuneInString(rest); w == 1 {
			return 6 // an invalid byte becomes \ufffd
		}
	}
	return utf8.RuneLen(r)
}

// openCapped opens name in root for reading: a regular file only (a
// symlink is not followed, a FIFO is opened without blocking and refused),
// of at most limit bytes; size is its size.
func openCapped(root *os.Root, name string, limit int64) (*os.File, int64, error) {
	path := filepath.Join(root.Name(), name)
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, &errNotRegular{path: path, mode: fi.Mode()}
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	// Swapped between the Lstat and the open: what was opened decides.
	if fi, err = f.Stat(); err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, &errNotRegular{path: path, mode: fi.Mode()}
	}
	if fi.Size() > limit {
		f.Close()
		return nil, 0, fmt.Errorf("%s is %d bytes, more than the %d a record can be: not read (look at it with jq, or remove it)", path, fi.Size(), limit)
	}
	return f, fi.Size(), nil
}
