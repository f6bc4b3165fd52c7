package integration

// Issue 41, item 6 and Deliver 5-6: the operator's view cannot be blinded
// or lost, through the running guard.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// guardCmd runs the guard's binary with args and returns its exit code,
// stdout and stderr.
func guardCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bins.guard, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return code, out.String(), errb.String()
}

// longQuery sends one unauthenticated request whose query is 16,000 '<':
// vLLM prints it in a 16 KiB access line (six bytes a character once
// escaped as JSON).
func longQuery(t *testing.T, port int) {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /v1/nothing?q=%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", strings.Repeat("<", 16000))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// The reproduction of item 6: 260 requests with a 16,000-character query,
// then a death of vLLM. `status` answers, exit 0, with a few KiB of vLLM's
// output (it said "over 8 MiB" and exited 3, "no guard answers"), and
// `incidents` lists the record (it failed "unexpected EOF"), which is
// bounded (it was 16.7 MB).
func TestOperatorViewAfterLongQueriesAndADeath(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.skipVLLM = true // 4 MB of the client's text in the test's own log
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	for range 260 {
		longQuery(t, s.port)
	}
	d := waitState(t, s.socket(), "ready", 10*time.Second)
	if err := syscall.Kill(d.Guard.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill vLLM (pid %d): %v", d.Guard.PID, err)
	}
	s.WaitEvent("the death", 1, 30*time.Second, isExited)
	rec := s.WaitEvent("its record", 1, 30*time.Second, kind(events.KindIncident))
	s.WaitEvent("ready again", 2, 30*time.Second, isReady)

	if fi, err := os.Stat(rec.Reason); err != nil || fi.Size() > state.MaxRecordLinesBytes+256<<10 {
		t.Errorf("the record %s: %v, %d bytes; want it bounded near %d", rec.Reason, err, fileSize(fi), state.MaxRecordLinesBytes)
	}
	code, out, errs := guardCmd(t, "status", "--socket", s.socket())
	if code != 0 || !strings.Contains(out, "READY") || !strings.Contains(out, "Last incident:") {
		t.Errorf("status: exit %d, want 0\n%s\n%s", code, out, errs)
	}
	code, out, errs = guardCmd(t, "status", "--socket", s.socket(), "--json")
	var doc control.Doc
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.LastIncident == nil {
		t.Fatalf("status --json: exit %d, %v\n%.500s\n%s", code, err, out, errs)
	}
	lines, _ := json.Marshal(doc.LastIncident)
	if len(lines) > 12<<10 || doc.LastIncident.LastLinesOmitted == 0 {
		t.Errorf("the status document's last incident is %d bytes (%d lines, %d omitted); want a few KiB", len(lines),
			len(doc.LastIncident.LastLines), doc.LastIncident.LastLinesOmitted)
	}
	code, out, errs = guardCmd(t, "incidents", "--socket", s.socket())
	if rows := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(rows) != 2 || !strings.Contains(rows[1], "crash") {
		t.Errorf("incidents: exit %d, want the record listed\n%s\n%s", code, out, errs)
	}
	code, out, errs = guardCmd(t, "incidents", "--socket", s.socket(), "--json", "-n", "0")
	var incs []state.Incident
	if err := json.Unmarshal([]byte(out), &incs); code != 0 || err != nil || len(incs) != 1 || len(incs[0].LastLines) == 0 {
		t.Errorf("incidents --json: exit %d, %v, %d records\n%s", code, err, len(incs), errs)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}

func fileSize(fi os.FileInfo) int64 {
	if fi == nil {
		return -1
	}
	return fi.Size()
}

// A record the guard cannot read (too large, torn) is named by
// `incidents`, on the socket and offline, not skipped ("no incidents
// recorded", exit 0).
func TestIncidentsNameARecordTheyCannotRead(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	dir := filepath.Join(s.dir, "state", "incidents")
	big := filepath.Join(dir, "20260101T000000.000000Z-oom.json")
	if err := os.WriteFile(big, bytes.Repeat([]byte(" "), state.MaxRecordFileBytes+1), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "20260102T000000.000000Z-crash.json"), []byte(`{"cause":"cr`), 0o640); err != nil {
		t.Fatal(err)
	}
	check := func(how string, args ...string) {
		code, out, errs := guardCmd(t, append([]string{"incidents"}, args...)...)
		if code != 0 || !strings.Contains(out, "UNREADABLE record 20260101T000000.000000Z-oom") ||
			!strings.Contains(out, "UNREADABLE record 20260102T000000.000000Z-crash") || !strings.Contains(errs, "2 records could not be read") {
			t.Errorf("incidents %s: exit %d; want both records named\n%s\n%s", how, code, out, errs)
		}
	}
	check("from the guard", "--socket", s.socket())
	s.stopCleanly(30*time.Second, 5*time.Second)
	check("offline", "--config", filepath.Join(s.dir, "vllm-guard.toml"))
}

// A read-only state_dir (here immutable: root may write anywhere else)
// keeps the saved rung in force, and says it cannot save in status,
// metrics and the state_not_saved alert. The old guard ran on rung 0 and
// said so only in its log.
func TestReadOnlyStateDirKeepsTheSavedRung(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.httpListen = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	dir := filepath.Join(s.dir, "state")
	if err := os.MkdirAll(filepath.Join(dir, "incidents"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"rung": 1}`+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "incidents", "20260101T000000.000000Z-oom.json"),
		[]byte(`{"id":"20260101T000000.000000Z-oom","time":"2026-01-01T00:00:00Z","cause":"oom","summary":"an earlier OOM"}`), 0o640); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
		t.Fatalf("chattr +i %s (this test needs root and a file system with the immutable flag, such as ext4 or xfs): %v\n%s", dir, err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", dir).Run() })
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	d := waitState(t, s.socket(), "ready", 10*time.Second)
	if d.Guard.Rung.Index != 1 {
		t.Errorf("rung %d in force; want 1, the saved one", d.Guard.Rung.Index)
	}
	if d.Saved == nil || d.Saved.OK || d.Saved.SavedRung != 1 || !strings.Contains(d.Saved.Error, "not writable") {
		t.Errorf("status's saved_state: %+v; want not saved, rung 1 on disk, why", d.Saved)
	}
	alerted := false
	for _, a := range d.Alerts {
		alerted = alerted || a.Name == "state_not_saved"
	}
	if !alerted {
		t.Errorf("alerts in force: %+v; want state_not_saved", d.Alerts)
	}
	_, out, _ := guardCmd(t, "status", "--socket", s.socket())
	if !strings.Contains(out, "NOT SAVED") {
		t.Errorf("status does not say the state is not saved:\n%s", out)
	}
	// The records already in the folder are still listed, by the guard
	// and offline.
	if code, out, errs := guardCmd(t, "incidents", "--socket", s.socket()); code != 0 || !strings.Contains(out, "2026-01-01 00:00:00  oom") {
		t.Errorf("incidents from the guard over a read-only folder: exit %d\n%s\n%s", code, out, errs)
	}
	resp, err := http.Get("http://" + s.httpListen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"vllm_guard_state_saved 0", `vllm_guard_alert_active{alert="state_not_saved"} 1`, "vllm_guard_profile_rung 1"} {
		if !strings.Contains(body.String(), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
	if code, out, errs := guardCmd(t, "incidents", "--config", filepath.Join(s.dir, "vllm-guard.toml")); code != 0 || !strings.Contains(out, "2026-01-01 00:00:00  oom") {
		t.Errorf("incidents offline over a read-only folder: exit %d\n%s\n%s", code, out, errs)
	}
}

// Deliver 6: `restart` during the guard's final stop is refused, saying
// so; it said "vLLM will be restarted" and nothing was.
func TestRestartDuringTheFinalStopIsRefused(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_FAULT"] = "ignore_sigterm" // the stop waits out stop_timeout
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	s.Signal(syscall.SIGTERM)
	s.WaitEvent("stopping", 1, 30*time.Second, inState("stopping"))
	code, out, errs := guardCmd(t, "restart", "--socket", s.socket())
	if code != 1 || strings.Contains(out, "will be restarted") || !strings.Contains(errs, "stopping") {
		t.Errorf("restart during the final stop: exit %d, want 1 and a refusal\n%s\n%s", code, out, errs)
	}
	if c := s.WaitExit(30 * time.Second); c != 0 {
		t.Errorf("the guard exited %d after its stop", c)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Errorf("%d starts of vLLM; the refused restart must not start it again", n)
	}
}

// vmHWM is a process's peak resident memory in bytes (/proc/PID/status).
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			var kb int64
			fmt.Sscan(f[1], &kb)
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// Records as an earlier guard wrote them (19 MB each: 200 lines of 16,000
// '<') are read one at a time: `incidents -n 0` lists all 20 and the
// guard's peak memory grows by about one record, not by 20 (the old guard
// grew to 1.7 GB).
func TestOldLargeRecordsAreReadOneAtATime(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	// Memory is measured on the shipped build (the race detector's
	// shadow memory and its slow JSON would measure the detector).
	plain, err := testbin.GuardPlain()
	if err != nil {
		t.Fatal(err)
	}
	s.guardBin = plain
	dir := filepath.Join(s.dir, "state", "incidents")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	inc := state.Incident{Cause: "crash", Summary: "killed by SIGKILL"}
	for range 200 {
		inc.LastLines = append(inc.LastLines, `INFO: 127.0.0.1:1 - "GET /v1/nothing?q=`+strings.Repeat("<", 16000)+` HTTP/1.1" 404`)
	}
	// Encoded once (19 MB); each record is the same with its own time.
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	inc.Time, inc.ID = base, base.Format("20060102T150405.000000Z")+"-crash"
	data, err := json.MarshalIndent(inc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		at := base.Add(time.Duration(i) * time.Minute)
		id := at.Format("20060102T150405.000000Z") + "-crash"
		rec := bytes.Replace(data, []byte(`"`+inc.ID+`"`), []byte(`"`+id+`"`), 1)
		rec = bytes.Replace(rec, []byte(`"2026-01-01T00:00:00Z"`), []byte(`"`+at.Format(time.RFC3339)+`"`), 1)
		if err := os.WriteFile(filepath.Join(dir, id+".json"), rec, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	before := vmHWM(t, s.Cmd.Process.Pid)
	cmd := exec.Command(plain, "incidents", "--socket", s.socket(), "-n", "0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	code, out, errs := cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	if err != nil && code < 0 {
		t.Fatal(err)
	}
	if rows := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(rows) != 21 {
		t.Errorf("incidents -n 0: exit %d, %d rows; want the 20 records\n%s", code, len(rows), errs)
	}
	grew := vmHWM(t, s.Cmd.Process.Pid) - before
	t.Logf("the guard's peak memory grew by %d MiB", grew>>20)
	if grew > 256<<20 {
		t.Errorf("the guard's peak memory grew by %d MiB reading 20 records of 19 MB; one at a time is about 100 MiB (the old guard: 1.4 GiB)", grew>>20)
	}
	s.stopCleanly(30*time.Second, 5*time.Second)
}
