package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/redact"
)

// Incident is one failure of vLLM as `vllm-guard incidents` shows it and
// as incidents/<time>-<cause>.json keeps it.
type Incident struct {
	ID         string        `json:"id"` // the file name without .json; set by AddIncident when empty
	Time       time.Time     `json:"time"`
	Cause      cause.Cause   `json:"cause"`
	Confidence string        `json:"confidence,omitempty"` // "high" | "low"
	Summary    string        `json:"summary"`
	Evidence   []cause.Line  `json:"evidence"`
	ExitCode   int           `json:"exit_code"`        // -1 when killed by a signal
	Signal     string        `json:"signal,omitempty"` // "SIGKILL" etc.
	Phase      cause.Phase   `json:"phase,omitempty"`
	RungBefore policy.Rung   `json:"rung_before"`
	RungAfter  policy.Rung   `json:"rung_after"`
	Action     policy.Action `json:"action"`
	Reason     string        `json:"reason,omitempty"`
	Delay      time.Duration `json:"-"` // written as "delay": "5s"
	LastLines  []string      `json:"last_lines"`
	// LastLinesOmitted counts the earlier lines left out of LastLines: a
	// record keeps at most MaxRecordLinesBytes of them (escaped as JSON),
	// the status document a few KiB.
	LastLinesOmitted int         `json:"last_lines_omitted,omitempty"`
	Memory           []MemSample `json:"memory"` // GPU memory of the last minutes, oldest first
	MemoryTrend      string      `json:"memory_trend,omitempty"`
	// GPU: for a gpu_fault, the GPU (index, UUID), the XID and its meaning,
	// the uncorrected ECC counts before and after, whether it needs a reset.
	GPU *cause.GPUFault `json:"gpu,omitempty"`
	// Suspects are the requests the proxy refused to send again at this
	// death: each was in flight at [proxy] resume_limit deaths in a row,
	// and may be what kills vLLM.
	Suspects []SuspectRequest `json:"suspect_requests,omitempty"`
	// Held is what the proxy held for vLLM when the record was made: the
	// requests the death touched (in flight, given their slot back) and
	// those that came since; nil without the proxy.
	Held *HeldRequests `json:"held_requests,omitempty"`
	// Requests is what became of the requests the death touched, by kind:
	// written into the record once every one of them has finished (or at
	// the next death or the guard's stop, with those still going as
	// pending); nil until then, and without the proxy.
	Requests *DeathRequests `json:"requests,omitempty"`
	// VLLM and Role name the vLLM that died when the guard keeps a warm
	// standby ("a" or "b"; "serving" or "standby"); TakenOverBy names the
	// standby that served at once when the serving one died ("": none was
	// ready, or no standby).
	VLLM        string `json:"vllm,omitempty"`
	Role        string `json:"role,omitempty"`
	TakenOverBy string `json:"taken_over_by,omitempty"`
	// Unreadable is set, by the reader only, on a record it could not
	// read: ID names its file, Time is the one in its name, and this says
	// why (too large, not JSON, not a regular file). The record is named,
	// never hidden.
	Unreadable string `json:"unreadable,omitempty"`
}

// DeathRequests is what became of the requests one death of vLLM touched
// (the proxy's account): all kinds together, then each kind.
type DeathRequests struct {
	RequestOutcomes
	// Streams had delivered tokens to their client at the death (continued
	// or ended); StreamsBeforeFirstToken had not (sent again);
	// NonStreaming are every other inference request in flight (non-streaming
	// completions and chat, embeddings and other pooling: sent again);
	// ArrivedWhileDown arrived, or waited in the queue, while vLLM was down
	// for this death (held). A kind the death did not touch is absent.
	Streams                 *RequestOutcomes `json:"streams,omitempty"`
	StreamsBeforeFirstToken *RequestOutcomes `json:"streams_before_first_token,omitempty"`
	NonStreaming            *RequestOutcomes `json:"non_streaming,omitempty"`
	ArrivedWhileDown        *RequestOutcomes `json:"arrived_while_down,omitempty"`
	// UnfinishedAt is set when the record was completed with requests
	// still going (Pending > 0): "next_death" (vLLM died again first) or
	// "guard_stop".
	UnfinishedAt string `json:"unfinished_at,omitempty"`
}

// RequestOutcomes counts requests a death touched by what finally became of
// each. The words are those of vllm_guard_proxy_resumed_total{how} and
// vllm_guard_proxy_resume_failed_total{reason}.
type RequestOutcomes struct {
	Touched int `json:"touched"`
	// Continued: a stream carried on from the tokens delivered; Replayed:
	// sent again from its body, answered; ServedAfterHold: arrived while
	// vLLM was down and answered once it was back.
	Continued       int `json:"continued,omitempty"`
	Replayed        int `json:"replayed,omitempty"`
	ServedAfterHold int `json:"served_after_hold,omitempty"`
	// Refused: 503 (or a stream's error event) because vLLM did not come
	// back within the hold limit, was not coming back, or the queue or the
	// body buffer was full. Suspect: ended because it was in flight at
	// [proxy] resume_limit deaths (suspect_requests names it).
	Refused int `json:"refused,omitempty"`
	Suspect int `json:"suspect,omitempty"`
	// NotResumed: ended with the error event (or 503) instead of being
	// resumed, by reason: n, beam_search, structured_output, resume_off,
	// body_not_kept ... (the reason label of resume_failed_total).
	NotResumed map[string]int `json:"not_resumed,omitempty"`
	// ClientGone: its client left before it was answered. Failed: ended
	// some other way (an error from vLLM after it was back).
	ClientGone int `json:"client_gone,omitempty"`
	Failed     int `json:"failed,omitempty"`
	// Pending: not finished when the record was completed.
	Pending int `json:"pending"`
}

// HeldRequests counts the requests the proxy held when a record was made.
type HeldRequests struct {
	Requests      int `json:"requests"`
	PausedStreams int `json:"paused_streams"`
}

// SuspectRequest is a request the proxy would not send again (proxy.Suspect).
type SuspectRequest struct {
	Time         time.Time `json:"time"`
	Path         string    `json:"path"`
	Client       string    `json:"client"`
	BodyBytes    int64     `json:"body_bytes"`
	PromptTokens float64   `json:"prompt_tokens"`
	Deaths       int       `json:"deaths"`
}

// MemSample is one GPU memory reading: used/total (the highest over the
// watched GPUs) at time T.
type MemSample struct {
	T        time.Time `json:"t"`
	Fraction float64   `json:"fraction"`
}

// incidentFields has Incident's fields without its JSON methods.
type incidentFields Incident

// MarshalJSON writes Delay as a duration string an operator can read.
func (inc Incident) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		incidentFields
		Delay string `json:"delay"`
	}{incidentFields(inc), inc.Delay.String()})
}

func (inc *Incident) UnmarshalJSON(b []byte) error {
	aux := struct {
		*incidentFields
		Delay string `json:"delay"`
	}{incidentFields: (*incidentFields)(inc)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	inc.Delay = 0
	if aux.Delay != "" {
		d, err := time.ParseDuration(aux.Delay)
		if err != nil {
			return fmt.Errorf("delay %q: %w", aux.Delay, err)
		}
		inc.Delay = d
	}
	return nil
}

// AddIncident writes inc to incidents/<time>-<cause>.json atomically,
// bounded (Bounded), after removing the oldest records beyond
// MaxIncidents and MaxIncidentBytes: room is made before the write, so a
// full disk never keeps the oldest records and drops the newest. When the
// write still finds no room (ENOSPC, a quota) the oldest records go one by
// one until it fits or none is left. A zero Time is set to now. Secrets in
// its text (vLLM's lines, evidence) are masked first. When the records are
// kept in memory (no usable incidents folder) it keeps the record there
// and returns "".
func (s *Store) AddIncident(inc Incident) (path string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inc = masked(inc)
	if inc.Time.IsZero() {
		inc.Time = s.now()
	}
	inc.Time = inc.Time.UTC()
	base := inc.Time.Format("20060102T150405.000000Z") + "-" + fileSafe(string(inc.Cause))
	if s.inc == nil {
		if inc.ID == "" {
			inc.ID = base
		}
		s.addMemory(inc)
		return "", nil
	}
	name := base + ".json"
	for i := 2; s.exists(s.inc, name); i++ {
		name = fmt.Sprintf("%s-%d.json", base, i)
	}
	if inc.ID == "" {
		inc.ID = strings.TrimSuffix(name, ".json")
	}
	data, err := json.MarshalIndent(inc, "", "  ")
	if err != nil {
		return "", fmt.Errorf("state: encode incident %s: %w", inc.ID, err)
	}
	data = append(data, '\n')
	path = filepath.Join(s.dir, incidentsDir, name)
	s.prune(int64(len(data)))
	for {
		err = s.writeRecord(name, data)
		if err == nil || !noRoom(err) || !s.pruneOldest(name) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("state: incident record: %w", err)
	}
	return path, nil
}

// noRoom is a write that failed for want of space: the disk, a quota, a
// file size limit.
func noRoom(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EFBIG)
}

// addMemory keeps a record in memory, within both bounds.
func (s *Store) addMemory(inc Incident) {
	size := 0
	if data, err := json.Marshal(inc); err == nil {
		size = len(data)
	}
	s.memIncidents = append(s.memIncidents, memIncident{inc, size})
	total := 0
	for _, m := range s.memIncidents {
		total += m.size
	}
	for len(s.memIncidents) > 1 && (len(s.memIncidents) > s.maxIncidents() || int64(total) > s.maxIncidentBytes()) {
		total -= s.memIncidents[0].size
		s.memIncidents = slices.Delete(s.memIncidents, 0, 1)
	}
}

// UpdateIncident rewrites the record of the failure at the time at (of
// cause) with update applied, atomically (a reader sees the old record or
// the new, never half of one) and masked as AddIncident masks. It reports
// whether the record was found: it may have been pruned since.
func (s *Store) UpdateIncident(at time.Time, cause cause.Cause, update func(*Incident)) (found bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at = at.UTC()
	if s.inc == nil {
		for i := range s.memIncidents {
			if inc := &s.memIncidents[i].inc; inc.Time.Equal(at) && inc.Cause == cause {
				update(inc)
				*inc = masked(*inc)
				return true, nil
			}
		}
		return false, nil
	}
	// The record's name is its time and cause, with -2, -3 ... when
	// several share them (AddIncident).
	base := at.Format("20060102T150405.000000Z") + "-" + fileSafe(string(cause))
	for i := 1; ; i++ {
		name := base + ".json"
		if i > 1 {
			name = fmt.Sprintf("%s-%d.json", base, i)
		}
		data, err := readCapped(s.inc, name, MaxRecordFileBytes)
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("state: read incident record %s: %w", name, err)
		}
		var inc Incident
		if err := json.Unmarshal(data, &inc); err != nil {
			return false, fmt.Errorf("state: decode incident record %s: %w", name, err)
		}
		if !inc.Time.Equal(at) || inc.Cause != cause {
			continue
		}
		update(&inc)
		if data, err = json.MarshalIndent(masked(inc), "", "  "); err != nil {
			return false, fmt.Errorf("state: encode incident %s: %w", inc.ID, err)
		}
		if err := s.writeRecord(name, append(data, '\n')); err != nil {
			return false, fmt.Errorf("state: incident record: %w", err)
		}
		return true, nil
	}
}

// Redacted returns inc with the secrets in its text masked: vLLM's lines
// carry its command line and `non-default args` (api_key).
func Redacted(inc Incident) Incident {
	inc.Summary = redact.String(inc.Summary)
	inc.Reason = redact.String(inc.Reason)
	if inc.Evidence != nil {
		ev := make([]cause.Line, len(inc.Evidence))
		for i, l := range inc.Evidence {
			l.Text = redact.String(l.Text)
			ev[i] = l
		}
		inc.Evidence = ev
	}
	if inc.LastLines != nil {
		lines := make([]string, len(inc.LastLines))
		for i, l := range inc.LastLines {
			lines[i] = redact.String(l)
		}
		inc.LastLines = lines
	}
	return inc
}

func (s *Store) maxIncidents() int {
	if s.MaxIncidents <= 0 {
		return DefaultMaxIncidents
	}
	return s.MaxIncidents
}

func (s *Store) maxIncidentBytes() int64 {
	if s.MaxIncidentBytes <= 0 {
		return DefaultMaxIncidentBytes
	}
	return s.MaxIncidentBytes
}

// writeRecord writes one record file atomically (the tests' fault seam).
func (s *Store) writeRecord(name string, data []byte) error {
	if s.failWrite != nil {
		if err := s.failWrite(name); err != nil {
			return err
		}
	}
	return writeAtomic(s.inc, name, data, fileMode)
}

// record is one incident file and its size.
type record struct {
	name string
	size int64
}

// records lists the incident files with their sizes, oldest first.
func (s *Store) records() ([]record, error) {
	entries, err := readDir(s.inc)
	if err != nil {
		return nil, err
	}
	var out []record
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(n, ".json") || strings.HasPrefix(n, ".") {
			continue
		}
		var size int64
		if fi, err := e.Info(); err == nil {
			size = fi.Size()
		}
		out = append(out, record{n, size})
	}
	slices.SortFunc(out, func(a, b record) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// prune removes the oldest records until one more of incoming bytes fits
// within both bounds (MaxIncidents, MaxIncidentBytes). It runs before the
// write, whatever the write then does. File names start with a
// fixed-width UTC time, so name order is time order. Only regular files
// inside the incidents folder itself are ever removed.
func (s *Store) prune(incoming int64) {
	dir := filepath.Join(s.dir, incidentsDir)
	recs, err := s.records()
	if err != nil {
		s.log.Warn("cannot list incident records to prune them", zap.String("dir", dir), zap.Error(err))
		return
	}
	var total int64
	for _, r := range recs {
		total += r.size
	}
	for len(recs) > 0 && (len(recs)+1 > s.maxIncidents() || total+incoming > s.maxIncidentBytes()) {
		s.remove(recs[0].name)
		total -= recs[0].size
		recs = recs[1:]
	}
}

// pruneOldest removes the oldest record but keep; false when there is none.
func (s *Store) pruneOldest(keep string) bool {
	recs, err := s.records()
	if err != nil {
		return false
	}
	for _, r := range recs {
		if r.name != keep {
			s.log.Warn("no room for the new incident record: removing the oldest", zap.String("file", filepath.Join(s.dir, incidentsDir, r.name)))
			return s.remove(r.name)
		}
	}
	return false
}

func (s *Store) remove(name string) bool {
	if err := s.inc.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("cannot remove an old incident record", zap.String("file", filepath.Join(s.dir, incidentsDir, name)), zap.Error(err))
		return false
	}
	return true
}

// recordNames lists the incident files, oldest first.
func recordNames(root *os.Root) ([]string, error) {
	entries, err := readDir(root)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && strings.HasSuffix(n, ".json") && !strings.HasPrefix(n, ".") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Incidents returns up to n records (all when n ≤ 0), newest first; see
// EachIncident. It holds them all: for tests and small n.
func (s *Store) Incidents(n int) ([]Incident, error) {
	var out []Incident
	err := s.EachIncident(n, func(inc Incident) error {
		out = append(out, inc)
		return nil
	})
	return out, err
}

// EachIncident hands up to n records (all when n ≤ 0), newest first (by
// file name, which is the record's time), to each, one at a time: it never
// holds more than one record. A file that cannot be read or decoded (too
// large, torn, not a regular file) is handed on as a record with
// Unreadable saying why, named by its file. An error from each stops it.
func (s *Store) EachIncident(n int, each func(Incident) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	root, k := s.inc, 0
	if root == nil {
		for i := len(s.memIncidents) - 1; i >= 0 && (n <= 0 || k < n); i, k = i-1, k+1 {
			if err := each(s.memIncidents[i].inc); err != nil {
				return err
			}
		}
		if root = s.incRead; root == nil {
			return nil
		}
	}
	dir := filepath.Join(s.dir, incidentsDir)
	names, err := recordNames(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state: list incident records in %s: %w", dir, err)
	}
	for i := len(names) - 1; i >= 0 && (n <= 0 || k < n); i, k = i-1, k+1 {
		inc, err := s.readRecord(root, names[i])
		if err != nil {
			s.log.Warn("an incident record cannot be read", zap.String("file", filepath.Join(dir, names[i])), zap.Error(err))
			inc = unreadable(names[i], err)
		}
		if err := each(inc); err != nil {
			return err
		}
	}
	return nil
}

// readRecord reads and decodes one record, streaming from the file (no
// copy of its bytes besides the decoder's): at most MaxRecordFileBytes.
func (s *Store) readRecord(root *os.Root, name string) (Incident, error) {
	f, size, err := openCapped(root, name, MaxRecordFileBytes)
	if err != nil {
		return Incident{}, err
	}
	defer f.Close()
	var inc Incident
	dec := json.NewDecoder(io.LimitReader(f, size))
	if err := dec.Decode(&inc); err != nil {
		return Incident{}, fmt.Errorf("not a readable record (%v); look at it with jq, or remove it", err)
	}
	// Records written before masking and bounds existed may hold secrets
	// and megabytes of lines.
	return masked(inc), nil
}

// unreadable is the record that names a file the reader could not read.
func unreadable(name string, err error) Incident {
	id := strings.TrimSuffix(name, ".json")
	inc := Incident{ID: id, Unreadable: oneLine(err.Error())}
	if len(id) >= len("20060102T150405.000000Z") {
		if t, perr := time.Parse("20060102T150405.000000Z", id[:len("20060102T150405.000000Z")]); perr == nil {
			inc.Time = t
		}
	}
	if i := strings.IndexByte(id, '-'); i > 0 {
		inc.Cause = cause.Cause(strings.TrimRightFunc(id[i+1:], func(r rune) bool { return r == '-' || r >= '0' && r <= '9' }))
	}
	return inc
}

func fileSafe(s string) string {
	if s == "" {
		return "unknown"
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, s)
}

// evidenceWidth bounds the evidence column so a row fits a wide terminal.
const evidenceWidth = 100

// IncidentTable is the `vllm-guard incidents` table built one record at a
// time: it keeps each row's cells (a few hundred bytes), never the record.
type IncidentTable struct {
	rows [][6]string
}

// Add puts inc's row in the table. A record that could not be read gets a
// row that names its file and says why.
func (t *IncidentTable) Add(inc Incident) {
	when := "-"
	if !inc.Time.IsZero() {
		when = inc.Time.UTC().Format("2006-01-02 15:04:05")
	}
	cause := oneLine(string(inc.Cause))
	if cause == "" {
		cause = "-"
	}
	if inc.Unreadable != "" {
		t.rows = append(t.rows, [6]string{when, cause, "-", "-", "-",
			bounded("UNREADABLE record "+oneLine(inc.ID)+": "+oneLine(inc.Unreadable), 2*evidenceWidth)})
		return
	}
	after := rung(inc.RungAfter)
	if inc.Action == policy.ActionGiveUp {
		after = "gave up"
	}
	trend := oneLine(inc.MemoryTrend)
	if trend == "" {
		trend = "-"
	}
	t.rows = append(t.rows, [6]string{when, cause, rung(inc.RungBefore) + " → " + after,
		bounded(trend, evidenceWidth), inc.Requests.Line(), evidence(inc)})
}

// Write writes the table (or "no incidents recorded").
func (t *IncidentTable) Write(w io.Writer) error {
	if len(t.rows) == 0 {
		_, err := io.WriteString(w, "no incidents recorded\n")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME (UTC)\tCAUSE\tRUNG (max_num_seqs, gpu_util)\tMEMORY\tREQUESTS\tEVIDENCE")
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r[:], "\t"))
	}
	return tw.Flush()
}

// bounded cuts s to width runes, "…" where cut.
func bounded(s string, width int) string {
	if r := []rune(s); len(r) > width {
		return string(r[:width-1]) + "…"
	}
	return s
}

// Line is the requests a death touched and what became of them, in one
// line: "4 touched: 1 continued, 1 replayed, 1 served after hold, 1 not
// resumed (n)"; "-" when the record has no account (yet).
func (r *DeathRequests) Line() string {
	if r == nil {
		return "-"
	}
	parts := []string{}
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(r.Continued, "continued")
	add(r.Replayed, "replayed")
	add(r.ServedAfterHold, "served after hold")
	add(r.Refused, "refused")
	add(r.Suspect, "suspect")
	reasons := slices.Sorted(maps.Keys(r.NotResumed))
	for _, why := range reasons {
		add(r.NotResumed[why], "not resumed ("+oneLine(why)+")")
	}
	add(r.ClientGone, "client gone")
	add(r.Failed, "failed")
	if r.Pending > 0 {
		at := "pending"
		if r.UnfinishedAt != "" {
			at += " at " + strings.ReplaceAll(oneLine(r.UnfinishedAt), "_", " ")
		}
		add(r.Pending, at)
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d touched", r.Touched)
	}
	return fmt.Sprintf("%d touched: %s", r.Touched, strings.Join(parts, ", "))
}

func rung(r policy.Rung) string {
	return fmt.Sprintf("%d (%d, %.2f)", r.Index, r.MaxNumSeqs, r.GPUMemoryUtilization)
}

func evidence(inc Incident) string {
	s := inc.Summary
	if len(inc.Evidence) > 0 {
		s = fmt.Sprintf("L%d: %s", inc.Evidence[0].N, strings.TrimSpace(inc.Evidence[0].Text))
	}
	s = oneLine(s)
	if s == "" {
		return "-"
	}
	return bounded(s, evidenceWidth)
}

// oneLine keeps a table cell on one line and the terminal safe: tabs,
// newlines and other control characters (C0 and C1: escape sequences) from
// vLLM's output become spaces, and so do the invisible format characters
// (bidirectional overrides) that could make a line read as another.
func oneLine(s string) string { return Clean(s) }

// Clean makes text from another process safe to print on a terminal:
// every control character (C0, C1, DEL) and format character (Cf:
// bidirectional overrides, zero-width) becomes a space, invalid UTF-8 a
// U+FFFD.
func Clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
