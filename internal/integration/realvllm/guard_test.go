package realvllm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/procmark"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"github.com/vllm-guard/vllm-guard/internal/testkit/guardrun"
)

// Bounds, not measurements: a scenario is correct at any speed below them.
// A start of the tiny model on two loaded cores takes 20–90 s.
const (
	startBound = 4 * time.Minute
	exitBound  = 2 * time.Minute
)

// vllmEnv is the environment every real vLLM of the tier gets: the CPU
// platform, a small KV cache, no hub, no telemetry, caches in the test's
// folder unless the scenario keeps them.
func vllmEnv(dir, testID string) map[string]string {
	return map[string]string{
		"VLLM_TARGET_DEVICE":     "cpu",
		"VLLM_CPU_KVCACHE_SPACE": "1",
		"HF_HUB_OFFLINE":         "1",
		"TRANSFORMERS_OFFLINE":   "1",
		"VLLM_NO_USAGE_STATS":    "1",
		"DO_NOT_TRACK":           "1",
		"VLLM_CACHE_ROOT":        filepath.Join(dir, "vllm-cache"),
		"XDG_CACHE_HOME":         filepath.Join(dir, "xdg-cache"),
		"HOME":                   dir,
		"REALVLLM_TEST_ID":       testID,
	}
}

// model is the path of one of the tiny models.
func model(name string) string { return filepath.Join(real.models, name) }

// scene is one guard over one real vLLM, in its own scratch folder.
type scene struct {
	t        testing.TB
	dir      string
	port     int
	testID   string
	args     []string          // after `vllm serve`: the model and flags
	command  []string          // the whole [vllm] command, when set (wrappers)
	env      map[string]string // [vllm.env]
	extra    string            // more TOML
	proxy    int               // [proxy] listen port, 0 off
	httpPort int               // [control] http_listen port, 0 off
	wrap     []string          // argv the guard runs under (a cgroup entry)
	backoff  string            // [restart] initial_delay and max_delay; default 1s and 2s

	// The running guard: its log, its event stream and every wait on them
	// (internal/testkit/guardrun, shared with the simulator's scene).
	*guardrun.Guard
}

func newScene(t testing.TB, args ...string) *scene {
	t.Helper()
	dir := t.TempDir()
	id := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())
	return &scene{t: t, dir: dir, port: testkit.FreePort(t), testID: id, args: args, env: vllmEnv(dir, id)}
}

func (s *scene) socket() string { return filepath.Join(s.dir, "guard.sock") }

func (s *scene) configText() string {
	var b strings.Builder
	command := s.command
	if command == nil {
		command = append([]string{real.vllm, "serve"}, s.args...)
	}
	q := make([]string, len(command))
	for i, a := range command {
		q[i] = strconv.Quote(a)
	}
	fmt.Fprintf(&b, "[vllm]\ncommand = [%s]\nport = %d\nstop_timeout = \"30s\"\n\n[vllm.env]\n", strings.Join(q, ", "), s.port)
	keys := make([]string, 0, len(s.env))
	for k := range s.env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %q\n", k, s.env[k])
	}
	httpListen := ""
	if s.httpPort != 0 {
		httpListen = fmt.Sprintf("127.0.0.1:%d", s.httpPort)
	}
	first, most, jitter := "1s", "2s", 0.2
	if s.backoff != "" {
		first, most, jitter = s.backoff, s.backoff, 0
	}
	fmt.Fprintf(&b, "\n[readiness]\nstall_timeout = \"3m\"\n\n[restart]\ninitial_delay = %q\nmax_delay = %q\njitter = %.1f\n", first, most, jitter)
	fmt.Fprintf(&b, "\n[control]\nsocket = %q\nhttp_listen = %q\nstate_dir = %q\n\n[log]\nformat = \"json\"\nlevel = \"debug\"\n",
		s.socket(), httpListen, filepath.Join(s.dir, "state"))
	if s.proxy != 0 {
		fmt.Fprintf(&b, "\n[proxy]\nlisten = \"127.0.0.1:%d\"\n", s.proxy)
	}
	b.WriteString(s.extra)
	return b.String()
}

func (s *scene) configPath() string {
	p := filepath.Join(s.dir, "vllm-guard.toml")
	if err := os.WriteFile(p, []byte(s.configText()), 0o644); err != nil {
		s.t.Fatal(err)
	}
	return p
}

// start runs `vllm-guard run` (with no NVML library: there is no GPU) and
// collects its JSON log and its event stream.
func (s *scene) start(extra ...string) {
	s.t.Helper()
	argv := append([]string{real.guard, "run", "--config", s.configPath(), "--events", "/dev/fd/3"}, extra...)
	s.Guard = guardrun.Start(s.t, guardrun.Spec{
		Argv: append(slices.Clone(s.wrap), argv...),
		Env:  append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(s.dir, "no-nvml-here"), "GORACE=atexit_sleep_ms=0"),
	})
	s.Explain = func() string { return s.tail(40) }
	s.t.Cleanup(s.cleanup)
}

func (s *scene) cleanup() {
	s.Stop(exitBound)
	for _, pid := range s.ours() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if s.t.Failed() {
		s.keepArtifact()
	}
}

// keepArtifact writes what vLLM printed (as the guard relayed it) and the
// guard's own log and events to build/realvllm/<test>.log.
func (s *scene) keepArtifact() { s.keepArtifactAs(strings.ReplaceAll(s.t.Name(), "/", "_")) }

// keepArtifactAs is keepArtifact to build/realvllm/<name>.log.
func (s *scene) keepArtifactAs(name string) {
	dir := filepath.Join(real.root, "build", "realvllm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	var b strings.Builder
	b.WriteString("# vLLM's output as the guard relayed it\n")
	for _, l := range s.vllmLines() {
		b.WriteString(l + "\n")
	}
	b.WriteString("\n# the guard's log\n")
	for _, l := range s.Raw() {
		b.WriteString(l + "\n")
	}
	b.WriteString("\n# the guard's events\n")
	for _, e := range s.Events() {
		j, _ := json.Marshal(e)
		b.WriteString(string(j) + "\n")
	}
	p := filepath.Join(dir, name+".log")
	if os.WriteFile(p, []byte(b.String()), 0o644) == nil {
		s.t.Logf("vLLM's output, the guard's log and events kept in %s", p)
	}
}

// incidents are the incident records in the guard's state folder, oldest
// first (their names begin with the failure's time).
func (s *scene) incidents() []state.Incident {
	s.t.Helper()
	files, err := filepath.Glob(filepath.Join(s.dir, "state", "incidents", "*.json"))
	if err != nil {
		s.t.Fatal(err)
	}
	slices.Sort(files)
	var out []state.Incident
	for _, f := range files {
		var inc state.Incident
		b, err := os.ReadFile(f)
		if err == nil {
			err = json.Unmarshal(b, &inc)
		}
		if err != nil {
			// Written by rename: never seen half-written.
			s.t.Fatalf("incident record %s: %v", f, err)
		}
		out = append(out, inc)
	}
	return out
}

// waitDeathRequests waits for the only incident record to hold what became
// of the requests its death touched: the guard rewrites the record once the
// last of them has finished and vLLM is back, and logs that it did.
func (s *scene) waitDeathRequests(bound time.Duration) state.Incident {
	s.t.Helper()
	var rec state.Incident
	s.Until("account of the death's requests in its incident record", bound, func() bool {
		incs := s.incidents()
		if len(incs) > 1 {
			s.t.Fatalf("%d incident records; want the one death's", len(incs))
		}
		if len(incs) == 1 && incs[0].Requests != nil {
			rec = incs[0]
			return true
		}
		return false
	})
	return rec
}

// tail is the last n lines of vLLM's output, for failure messages.
func (s *scene) tail(n int) string {
	l := s.vllmLines()
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// vllmLines is what vLLM printed, as the guard relayed it (logger "vllm").
func (s *scene) vllmLines() []string {
	var out []string
	for _, m := range s.Logs() {
		if m["logger"] == "vllm" {
			text, _ := m["msg"].(string)
			out = append(out, text)
		}
	}
	return out
}

// runLines is what the vLLM of the n-th start (1-based) printed.
func (s *scene) runLines(n int) []string {
	pid := 0
	for _, e := range s.Events() {
		if isStarting(e) {
			if n--; n == 0 {
				pid = e.PID
			}
		}
	}
	var out []string
	for _, m := range s.vllmEntries() {
		if p, _ := m["pid"].(float64); int(p) == pid && pid != 0 {
			text, _ := m["msg"].(string)
			out = append(out, text)
		}
	}
	return out
}

// vllmEntries are the guard's log entries of vLLM's lines.
func (s *scene) vllmEntries() []map[string]any {
	var out []map[string]any
	for _, m := range s.Logs() {
		if m["logger"] == "vllm" {
			out = append(out, m)
		}
	}
	return out
}

// logTimes are the guard's times of the relayed vLLM lines containing text.
func (s *scene) logTimes(text string) []time.Time {
	var out []time.Time
	for _, m := range s.Logs() {
		if msg, _ := m["msg"].(string); m["logger"] == "vllm" && strings.Contains(msg, text) {
			if ts, ok := m["ts"].(string); ok { // milliseconds: the guard's log clock
				if tm, err := time.Parse(time.RFC3339Nano, ts); err == nil {
					out = append(out, tm)
				}
			}
		}
	}
	return out
}

// ours lists the live processes of this scene's vLLM (they carry its test ID).
func (s *scene) ours() []int { return procmark.Live("REALVLLM_TEST_ID=" + s.testID) }

// byTitle is the scene's live vLLM process whose title starts with title
// (VLLM::EngineCore, VLLM::Worker), 0 when none.
func (s *scene) byTitle(title string) int {
	for _, pid := range s.ours() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.HasPrefix(string(b), title) {
			return pid
		}
	}
	return 0
}

// waitGone waits until none of pids is alive (zombies count as gone).
func waitGone(t *testing.T, pids []int, bound time.Duration) {
	t.Helper()
	var left []int
	if testkit.Poll(bound, func() bool {
		left = left[:0]
		for _, p := range pids {
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			if err != nil {
				continue
			}
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue
			}
			left = append(left, p)
		}
		return len(left) == 0
	}) {
		return
	}
	t.Fatalf("processes of the old tree still alive after %s: %v", bound, left)
}

// guardCLI runs the guard's CLI against this scene.
func (s *scene) guardCLI(args ...string) (string, int) {
	s.t.Helper()
	cmd := exec.Command(real.guard, args...)
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatal(err)
	}
	return string(out), code
}

// status is `vllm-guard status --json` decoded.
func (s *scene) status() map[string]any {
	s.t.Helper()
	out, _ := s.guardCLI("status", "--json", "--socket", s.socket())
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		s.t.Fatalf("status --json: %v\n%s", err, out)
	}
	return m
}

// Event matchers (internal/testkit/guardrun's, shared with the
// simulator's scene).

var (
	kind       = guardrun.OfKind
	decided    = guardrun.Decided
	causeOf    = guardrun.CauseOf
	isStarting = kind(events.KindStarting)
	isReady    = kind(events.KindReady)
	isExited   = kind(events.KindExited)
)

// httpClient has a bound on every request: a hung server fails the test
// instead of hanging it.
var httpClient = &http.Client{Timeout: 2 * time.Minute}
