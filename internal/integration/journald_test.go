package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// journaldWrapper runs the guard as systemd does under a real
// systemd-journald: in a private mount namespace (a tmpfs on /run, so the
// host's journal is never touched), journald is started, the guard's stdout
// and stderr are a journal stream (systemd-cat) and JOURNAL_STREAM names
// it, as systemd sets it for a unit. SIGTERM is passed to the guard; when it
// exits, the journal is synced and written to OUT/all.json and
// OUT/err.json (`journalctl -p err`), and the wrapper exits with the
// guard's code.
const journaldWrapper = `#!/bin/bash
exec unshare --mount --propagation private /bin/bash -c '
set -u
out=$1 guard=$2; shift 2
mount -t tmpfs tmpfs /run || exit 90
mkdir -p /run/systemd/journal /run/systemd/journald.conf.d
printf "[Journal]\nStorage=volatile\nReadKMsg=no\n" > /run/systemd/journald.conf.d/test.conf
journald=/lib/systemd/systemd-journald
[ -x $journald ] || journald=/usr/lib/systemd/systemd-journald
[ -s /etc/machine-id ] || { echo "journald needs /etc/machine-id" >&2; exit 91; }
SYSTEMD_LOG_TARGET=console $journald &
jd=$!
until [ -S /run/systemd/journal/stdout ] && [ -S /run/systemd/journal/socket ]; do
  kill -0 $jd || exit 92
  sleep 0.01
done
systemd-cat -t vllm-guard -- /bin/sh -c "JOURNAL_STREAM=\$(stat -L -c %%d:%%i /proc/self/fd/2); export JOURNAL_STREAM; exec \"\$0\" \"\$@\"" "$guard" "$@" &
g=$!
trap "kill -TERM $g" TERM INT
wait $g; code=$?
while kill -0 $g 2>/dev/null; do wait $g; code=$?; done
journalctl --sync
journalctl -o json --no-pager > "$out/all.json"
journalctl -p err -o json --no-pager > "$out/err.json"
kill $jd; wait $jd
exit $code
' journald-wrapper %q %q "$@"
`

// Under journald the guard writes native entries with their priority and
// fields (issue 17 item 3): ` + "`journalctl -p err`" + ` finds vLLM's
// traceback (every line of it, with VLLM_PID and VLLM_STREAM) and the
// guard's own errors, and not its informational lines.
func TestJournalctlFindsErrors(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	oneShot(s, "oom_on_start")
	s.editConfig = func(text string) string { return strings.Replace(text, `format = "json"`, `format = "auto"`, 1) }
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	out := filepath.Join(s.dir, "journal")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(s.dir, "journald-wrapper")
	if err := os.WriteFile(wrapper, fmt.Appendf(nil, journaldWrapper, out, bins.guard), 0o755); err != nil {
		t.Fatal(err)
	}
	s.guardBin = wrapper
	s.start()
	s.WaitEvent("the OOM at start", 1, 60*time.Second, exitedWith("oom"))
	s.WaitEvent("ready after the OOM", 1, 60*time.Second, isReady)

	// A broken file on SIGHUP: the guard's own error.
	cfg := filepath.Join(s.dir, "vllm-guard.toml")
	good, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(good, "\n[liveness]\ninterval = 5\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	s.guardSignal(syscall.SIGHUP)
	s.WaitEvent("the reload refused", 1, 30*time.Second, decided(events.DecisionReload))
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if code := s.WaitExit(60 * time.Second); code != 0 {
		t.Fatalf("wrapper exit %d; want the guard's 0 (9x: the wrapper could not start journald)", code)
	}

	errs := readJournal(t, filepath.Join(out, "err.json"))
	all := readJournal(t, filepath.Join(out, "all.json"))
	find := func(entries []map[string]string, ident, text string) map[string]string {
		for _, e := range entries {
			if e["SYSLOG_IDENTIFIER"] == ident && strings.Contains(e["MESSAGE"], text) {
				return e
			}
		}
		return nil
	}
	header := find(errs, "vllm", "Traceback (most recent call last):")
	exc := find(errs, "vllm", "RuntimeError: CUDA out of memory")
	frame := find(errs, "vllm", `File "`)
	for name, e := range map[string]map[string]string{"traceback header": header, "exception line": exc, "frame line": frame} {
		if e == nil {
			t.Errorf("journalctl -p err: no %s of vLLM's OOM traceback; entries:\n%s", name, dumpJournal(errs))
			continue
		}
		if e["PRIORITY"] != "3" || e["VLLM_STREAM"] != "stderr" || e["VLLM_PID"] == "" || e["VLLM_PID"] != e["SYSLOG_PID"] {
			t.Errorf("vLLM's %s: %v; want PRIORITY 3, VLLM_STREAM stderr, VLLM_PID = SYSLOG_PID", name, e)
		}
	}
	reload := find(errs, "vllm-guard", "config reload failed")
	if reload == nil || reload["VLLM_GUARD_STATE"] != "ready" || !strings.Contains(reload["VLLM_GUARD_ERROR"], "vllm-guard.toml:") {
		t.Errorf("journalctl -p err: the guard's reload error %v; want it with VLLM_GUARD_STATE=ready and the file:line in VLLM_GUARD_ERROR", reload)
	}
	if e := find(errs, "vllm-guard", "vLLM ready"); e != nil {
		t.Errorf("an informational line under -p err: %v", e)
	}
	if e := find(all, "vllm-guard", "vLLM ready"); e == nil || e["PRIORITY"] != "6" {
		t.Errorf("the guard's ready line in the journal: %v; want PRIORITY 6", e)
	}
	if e := find(all, "vllm", "Starting vLLM API server"); e == nil || e["PRIORITY"] != "6" || e["VLLM_STREAM"] == "" {
		t.Errorf("vLLM's startup line in the journal: %v; want PRIORITY 6 with VLLM_STREAM", e)
	}
}

// guardSignal sends sig to the guard itself under a wrapper: the wrapper's
// descendant that runs the guard binary.
func (s *scene) guardSignal(sig syscall.Signal) {
	s.t.Helper()
	for _, pid := range descendants(s.Cmd.Process.Pid) {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == bins.guard {
			if err := syscall.Kill(pid, sig); err != nil {
				s.t.Fatal(err)
			}
			return
		}
	}
	s.t.Fatalf("no guard process under the wrapper %d", s.Cmd.Process.Pid)
}

// descendants lists the processes under pid, nearest first.
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var p int
		if _, err := fmt.Sscan(e.Name(), &p); err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		var ppid int
		if i := strings.LastIndexByte(string(b), ')'); i > 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 1 {
				fmt.Sscan(f[1], &ppid)
			}
		}
		children[ppid] = append(children[ppid], p)
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}

func readJournal(t *testing.T, path string) []map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var raw map[string]any
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		e := map[string]string{}
		for k, v := range raw {
			if s, ok := v.(string); ok {
				e[k] = s
			}
		}
		out = append(out, e)
	}
	return out
}

func dumpJournal(entries []map[string]string) string {
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "  [%s] %s: %s\n", e["PRIORITY"], e["SYSLOG_IDENTIFIER"], e["MESSAGE"])
	}
	return b.String()
}
