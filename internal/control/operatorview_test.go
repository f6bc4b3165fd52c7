package control

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// hostileIncident is the record of a death after clients sent 200 long
// queries: each a 16 KiB access line of '<' (six bytes each as JSON).
func hostileIncident(at time.Time) *state.Incident {
	inc := &state.Incident{ID: "x", Time: at, Cause: cause.CauseCrash, Summary: strings.Repeat("<", 64<<10),
		Evidence: []cause.Line{{N: 3, Text: strings.Repeat("<", 16<<10)}}}
	for i := range 200 {
		inc.LastLines = append(inc.LastLines, fmt.Sprintf(`INFO: 127.0.0.1:%d - "GET /v1/models?q=%s HTTP/1.1" 401`, i, strings.Repeat("<", 16000)))
	}
	return inc
}

// Issue 41 item 6: the socket's status document is a few KiB of vLLM's
// output whatever vLLM printed, and `status` answers (exit 0), where it
// said "over 8 MiB" and exited 3, "no guard answers".
func TestStatusAnswersWhateverVLLMPrinted(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	plain := fixtureDoc()
	plain.LastIncident = nil
	b.doc = plain
	_, path := startSocket(t, b, nil)
	_, base := call(t, path, http.MethodGet, "/status", nil)

	d := fixtureDoc()
	d.LastIncident = hostileIncident(fixtureNow)
	d.Guard.Reason = strings.Repeat("<", 1<<20)
	b.mu.Lock()
	b.doc = d
	b.mu.Unlock()
	code, body := call(t, path, http.MethodGet, "/status", nil)
	if code != 200 || len(body)-len(base) > 8<<10 {
		t.Errorf("socket /status: %d, %d bytes more than without vLLM's lines (want a few KiB)", code, len(body)-len(base))
	}
	got, err := DecodeDoc(strings.NewReader(body))
	if err != nil || got.LastIncident == nil || len(got.LastIncident.LastLines) == 0 ||
		got.LastIncident.LastLinesOmitted+len(got.LastIncident.LastLines) != 200 {
		t.Errorf("the last incident's newest lines, the others counted: %v %+v", err, got.LastIncident)
	}
	code, out, errs := runCmd(statusCmd, "--socket", path)
	if code != ExitReady || !strings.Contains(out, "READY") {
		t.Errorf("status: exit %d, want 0\n%s\n%s", code, out, errs)
	}
}

// A guard's answer that cannot be read (an older guard's 16 MB document)
// is an error about that guard, exit 1; exit 3 says no guard answers.
func TestStatusOfAnUnreadableAnswerIsNotNoGuard(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "old.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"version":"` + strings.Repeat("<", maxDoc) + `"}`))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	code, _, errs := runCmd(statusCmd, "--socket", path)
	if code != ExitNotReady || !strings.Contains(errs, "larger than") {
		t.Errorf("an over-large document: exit %d, want 1\n%s", code, errs)
	}
	code, out, _ := runCmd(statusCmd, "--all", "--runtime-dir", dir)
	if code != ExitNotReady || !strings.Contains(out, "bad answer") {
		t.Errorf("--all over an over-large document: exit %d, want 1 and \"bad answer\"\n%s", code, out)
	}
}

// A record is read, served and printed one at a time; 10 records of 1 MiB
// (10 MiB, which the old client cut at 8 MiB: "unexpected EOF") are all
// listed, and one the guard could not read is named.
func TestIncidentsStreamAndNameUnreadable(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	b.incs = append(b.incs, state.Incident{ID: "20260101T000000.000000Z-oom", Time: fixtureNow, Cause: cause.CauseOOM,
		Unreadable: "20260101T000000.000000Z-oom.json is 40000000 bytes, more than the 33554432 a record can be"})
	for i := range 10 {
		inc := state.Incident{Time: fixtureNow.Add(-time.Duration(i) * time.Minute), Cause: cause.CauseCrash}
		for range 64 {
			inc.LastLines = append(inc.LastLines, strings.Repeat("x", 16<<10))
		}
		b.incs = append(b.incs, inc)
	}
	_, path := startSocket(t, b, nil)
	code, out, errs := runCmd(incidents, "--socket", path, "-n", "0")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if code != ExitReady || len(rows) != 12 || !strings.Contains(rows[1], "UNREADABLE record 20260101T000000.000000Z-oom") ||
		!strings.Contains(errs, "1 record could not be read") {
		t.Errorf("incidents: exit %d, %d rows, want a header, the unreadable one named, 10\n%.600s\n%s", code, len(rows), out, errs)
	}
	code, out, _ = runCmd(incidents, "--socket", path, "-n", "0", "--json")
	var incs []state.Incident
	if err := json.Unmarshal([]byte(out), &incs); code != ExitReady || err != nil || len(incs) != 11 || incs[0].Unreadable == "" {
		t.Errorf("incidents --json: exit %d, %v, %d records", code, err, len(incs))
	}
}

// The client reads one record at a time: a record over its bound is an
// error naming it, without reading the rest of the answer.
func TestDecodeIncidentsBoundsOneRecord(t *testing.T) {
	const limit = 1 << 20
	huge := `[{"id":"a"},{"id":"b","summary":"` + strings.Repeat("x", limit) + `"},{"id":"c"}]`
	var seen []string
	err := decodeIncidents(strings.NewReader(huge), limit, func(inc state.Incident) error {
		seen = append(seen, inc.ID)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "record 2 is larger than") || len(seen) != 1 {
		t.Errorf("an over-large record: %v, seen %v", err, seen)
	}
	if err := DecodeIncidents(strings.NewReader(`[{"id":"a"},`), func(state.Incident) error { return nil }); err == nil {
		t.Error("a cut answer decoded without error")
	}
}

// Issue 41 item 6: a guard's version and state are printed cleaned: a
// socket in a folder another user owns cannot put escapes on root's
// terminal through `status` or `status --all`.
func TestStatusCleansEveryStringFromTheGuard(t *testing.T) {
	d := fixtureDoc()
	d.Version = "1.0\x1b]0;owned\x07\x1b[2J\u202e"
	d.Guard.State = "ready\x1b[31m\u009b2J"
	var view bytes.Buffer
	WriteStatus(&view, d)
	var table bytes.Buffer
	WriteInstances(&table, []Instance{{Name: "a", Status: &d}, {Name: "b", Error: "refused: \x1b[2J"}})
	for name, out := range map[string]string{"status": view.String(), "status --all": table.String()} {
		if strings.ContainsAny(out, "\x1b\x07\u009b\u202e") {
			t.Errorf("%s prints a terminal control from the guard's document: %q", name, out)
		}
	}
	if !strings.Contains(view.String(), "1.0 ]0;owned") {
		t.Errorf("the version is not shown, cleaned: %q", view.String())
	}
}

// The JSON views escape what a terminal could act on (C1 controls,
// bidirectional overrides), which encoding/json writes raw; the document
// reads back the same.
func TestStatusJSONIsTerminalSafe(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	d := fixtureDoc()
	d.Version = "1.0\u009b2J\u202eevil"
	b.doc = d
	_, path := startSocket(t, b, nil)
	code, out, errs := runCmd(statusCmd, "--socket", path, "--json")
	if code != ExitReady || strings.ContainsAny(out, "\u009b\u202e") {
		t.Fatalf("status --json: exit %d, raw terminal controls in it\n%s", code, errs)
	}
	got, err := DecodeDoc(strings.NewReader(out))
	if err != nil || got.Version != d.Version {
		t.Errorf("status --json reads back %q, %v; want %q", got.Version, err, d.Version)
	}
}

// Issue 41 item 7: `status --all` does not follow a symlink in the
// runtime folder to a socket elsewhere (root's, say).
func TestStatusAllDoesNotFollowASymlink(t *testing.T) {
	elsewhere := shortDir(t)
	listenIn(t, elsewhere, "root", newFakeBackend(status.StateReady))
	dir := shortDir(t)
	if err := os.Symlink(filepath.Join(elsewhere, "root.sock"), filepath.Join(dir, "evil.sock")); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCmd(statusCmd, "--all", "--runtime-dir", dir)
	if code != ExitNoGuard || !strings.Contains(out, "symlink") || strings.Contains(out, "ready") {
		t.Errorf("--all over a symlinked socket: exit %d, want 3 and the symlink named, not followed\n%s\n%s", code, out, errs)
	}
}

// The client's no-follow dial reaches the socket it opened: a real socket
// answers through it.
func TestNoFollowClientReachesTheSocket(t *testing.T) {
	dir := shortDir(t)
	listenIn(t, dir, "a", newFakeBackend(status.StateReady))
	c := newClient(filepath.Join(dir, "a.sock"), true)
	defer c.CloseIdleConnections()
	if d, err := c.Status(t.Context()); err != nil || d.Guard.State != status.StateReady {
		t.Errorf("no-follow status: %v %s", err, d.Guard.State)
	}
}

// The human view says when the state is not saved, and which rung a
// restarted guard resumes; nothing when it is saved.
func TestStatusSaysTheStateIsNotSaved(t *testing.T) {
	d := fixtureDoc()
	d.Saved = &SavedState{OK: true, Dir: "/var/lib/vllm-guard", SavedRung: 1}
	var ok bytes.Buffer
	WriteStatus(&ok, d)
	if strings.Contains(ok.String(), "saved state") {
		t.Errorf("a saved state is mentioned:\n%s", ok.String())
	}
	d.Saved = &SavedState{Dir: "/var/lib/vllm-guard", SavedRung: 0, Error: "state: save: write: no space left on device\x1b[2J",
		Since: fixtureNow.Add(-time.Minute)}
	var bad bytes.Buffer
	WriteStatus(&bad, d)
	if !strings.Contains(bad.String(), "NOT SAVED since 12:09:00 UTC (1m00s ago): state: save: write: no space left on device") ||
		!strings.Contains(bad.String(), "a restarted guard resumes rung 0 (the one on disk), not rung 1") || strings.Contains(bad.String(), "\x1b") {
		t.Errorf("the view of a state not saved:\n%s", bad.String())
	}
}
