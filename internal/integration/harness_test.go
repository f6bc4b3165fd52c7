// Package integration runs the real vllm-guard binary over the real vLLM
// simulator and the stand-in NVML library, as processes.
package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/procmark"
	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

var bins struct {
	guard, fakevllm, nvmlDir string
}

func TestMain(m *testing.M) {
	if path := os.Getenv(impostorEnv); path != "" {
		os.Exit(serveImpostor(path)) // a helper run of this binary (hostile_test.go)
	}
	code := func() int {
		defer testbin.Cleanup()
		var err error
		if bins.guard, err = testbin.Guard(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if bins.fakevllm, err = testbin.FakeVLLM(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if bins.nvmlDir, err = testbin.FakeNVML(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// freePort returns a TCP port nobody listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// scene is one guard over one simulator, in its own scratch folder.
type scene struct {
	t          testing.TB
	guardBin   string              // default: the race-enabled build
	logLevel   string              // default debug
	noNVML     bool                // run without any libnvidia-ml.so.1
	httpListen string              // [control] http_listen; default off
	guardEnv   map[string]string   // more environment for the guard itself (NOTIFY_SOCKET, WATCHDOG_USEC)
	nofile     int                 // the guard's descriptor limit (LimitNOFILE), soft and hard; default inherited
	skipVLLM   bool                // do not keep vLLM's own lines (benchmarks that flood)
	editConfig func(string) string // edits the config text before start (keys the scene does not expose)
	dir        string
	port       int
	gpuDir     string
	testID     string
	env        map[string]string // FAKEVLLM_* for the simulator
	extra      string            // more TOML
	command    string            // TOML array for [vllm] command; default the simulator
	cmd        *exec.Cmd

	mu     sync.Mutex
	logs   []map[string]any
	raw    []string
	evs    []events.Event // the guard's event stream (run --events), in order
	notify chan struct{}  // a log line or an event arrived
	evDone chan struct{}  // the event stream ended (the guard closed it at exit)
	exited chan struct{}  // the guard exited and both streams were read to the end
	code   int
}

func newScene(t testing.TB) *scene {
	t.Helper()
	dir := t.TempDir()
	s := &scene{t: t, dir: dir, port: freePort(t), gpuDir: filepath.Join(dir, "gpu"),
		testID: fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()),
		env:    map[string]string{"FAKEVLLM_ERA": "v1-ansi"}, logLevel: "debug"}
	if err := os.MkdirAll(filepath.Join(s.gpuDir, "procs"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.writeDevices("GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3")
	return s
}

// writeDevices replaces the stand-in's devices file atomically: the
// library re-reads it at every query, and a truncated file read midway
// looks like a lost GPU.
func (s *scene) writeDevices(lines ...string) {
	p := filepath.Join(s.gpuDir, "devices")
	if err := os.WriteFile(p+".tmp", []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		s.t.Fatal(err)
	}
}

func (s *scene) configText() string {
	var b strings.Builder
	command := s.command
	if command == "" {
		command = fmt.Sprintf("[%q, \"serve\", \"test-model\"]", bins.fakevllm)
	}
	fmt.Fprintf(&b, "[vllm]\ncommand = %s\nport = %d\nstop_timeout = \"3s\"\n\n[vllm.env]\nFAKEVLLM_TEST_ID = %q\n", command, s.port, s.testID)
	for k, v := range s.env {
		fmt.Fprintf(&b, "%s = %q\n", k, v)
	}
	fmt.Fprintf(&b, "\n[control]\nsocket = %q\nhttp_listen = %q\nstate_dir = %q\n\n[log]\nformat = \"json\"\nlevel = %q\n",
		filepath.Join(s.dir, "guard.sock"), s.httpListen, filepath.Join(s.dir, "state"), s.logLevel)
	b.WriteString(s.extra)
	return b.String()
}

// start runs `vllm-guard run` and collects its JSON log and its event
// stream (`--events /dev/fd/3`, a pipe).
func (s *scene) start(args ...string) {
	s.t.Helper()
	s.notify, s.evDone, s.exited = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	cfg := filepath.Join(s.dir, "vllm-guard.toml")
	text := s.configText()
	if s.editConfig != nil {
		text = s.editConfig(text)
	}
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		s.t.Fatal(err)
	}
	bin := s.guardBin
	if bin == "" {
		bin = bins.guard
	}
	s.cmd = exec.Command(bin, append([]string{"run", "--config", cfg, "--events", "/dev/fd/3"}, args...)...)
	if s.nofile > 0 {
		// As systemd's LimitNOFILE: the shell sets both limits, then
		// becomes the guard (same pid), which raises its soft limit to
		// the hard one as every Go program does.
		s.cmd = exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, s.nofile), s.cmd.Path}, s.cmd.Args[1:]...)...)
	}
	evr, evw, err := os.Pipe()
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd.ExtraFiles = []*os.File{evw}
	lib := bins.nvmlDir
	if s.noNVML {
		lib = filepath.Join(s.dir, "no-nvml-here")
	}
	// The race runtime sleeps a second at every exit by default; the keeper
	// (the same race-built binary) exits at each stop of vLLM.
	s.cmd.Env = append(os.Environ(), "FAKENVML_STATE="+s.gpuDir, "LD_LIBRARY_PATH="+lib, "GORACE=atexit_sleep_ms=0")
	for k, v := range s.guardEnv {
		s.cmd.Env = append(s.cmd.Env, k+"="+v)
	}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	evw.Close() // the guard holds the writing end now
	go s.readEvents(evr)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			line := sc.Text()
			if s.skipVLLM && strings.Contains(line, `"logger":"vllm"`) {
				continue
			}
			_ = json.Unmarshal([]byte(line), &m)
			s.mu.Lock()
			s.raw = append(s.raw, line)
			if m != nil {
				s.logs = append(s.logs, m)
			}
			s.mu.Unlock()
			select {
			case s.notify <- struct{}{}:
			default:
			}
		}
		err := s.cmd.Wait()
		s.code = s.cmd.ProcessState.ExitCode()
		_ = err
		// The guard flushed and closed its event stream before it exited;
		// what it wrote is read before anyone hears of the exit.
		<-s.evDone
		close(s.exited)
	}()
	s.t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(15 * time.Second):
				s.cmd.Process.Kill()
				<-s.exited
			}
		}
		s.killLeftovers()
		if s.t.Failed() {
			s.mu.Lock()
			n := len(s.raw)
			from := max(0, n-80)
			s.t.Logf("guard log (last %d lines):\n%s", n-from, strings.Join(s.raw[from:], "\n"))
			var evs []string
			for _, e := range s.evs[max(0, len(s.evs)-40):] {
				b, _ := json.Marshal(e)
				evs = append(evs, string(b))
			}
			s.t.Logf("guard events (last %d):\n%s", len(evs), strings.Join(evs, "\n"))
			s.mu.Unlock()
		}
	})
}

// restart starts a second guard over the same scene (same config, state
// and simulator settings), as systemd would after the first one exited.
func (s *scene) restart() *scene {
	s.t.Helper()
	n := &scene{t: s.t, dir: s.dir, port: s.port, gpuDir: s.gpuDir, testID: s.testID, env: s.env, extra: s.extra,
		command: s.command, guardBin: s.guardBin, logLevel: s.logLevel, noNVML: s.noNVML, httpListen: s.httpListen, skipVLLM: s.skipVLLM,
		guardEnv: s.guardEnv, nofile: s.nofile}
	n.start()
	return n
}

// readEvents decodes the guard's event stream until the guard closes it.
func (s *scene) readEvents(r *os.File) {
	defer close(s.evDone)
	defer r.Close()
	dec := json.NewDecoder(r)
	for {
		var e events.Event
		if err := dec.Decode(&e); err != nil {
			return
		}
		s.mu.Lock()
		s.evs = append(s.evs, e)
		s.mu.Unlock()
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
}

// events is a copy of the events so far.
func (s *scene) events() []events.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.evs)
}

// countEvents is how many events so far match.
func (s *scene) countEvents(match func(events.Event) bool) int {
	n := 0
	for _, e := range s.events() {
		if match(e) {
			n++
		}
	}
	return n
}

// waitEvent waits until n events match, and returns the n-th. It fails the
// test when the guard exits first or timeout passes (a bound, not a
// measurement: the test is correct at any speed below it).
func (s *scene) waitEvent(what string, n int, timeout time.Duration, match func(events.Event) bool) events.Event {
	s.t.Helper()
	deadline := time.After(timeout)
	for {
		found := 0
		for _, e := range s.events() {
			if match(e) {
				if found++; found == n {
					return e
				}
			}
		}
		select {
		case <-s.notify:
		case <-s.exited:
			if s.countEvents(match) >= n {
				continue
			}
			s.t.Fatalf("guard exited (code %d) before %s", s.code, what)
		case <-deadline:
			s.t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

// Event matchers.

func kind(k events.Kind) func(events.Event) bool {
	return func(e events.Event) bool { return e.Kind == k }
}

var (
	isStarting = kind(events.KindStarting)
	isReady    = kind(events.KindReady)
	isExited   = kind(events.KindExited)
)

// inState matches the change into state st.
func inState(st string) func(events.Event) bool {
	return func(e events.Event) bool { return e.Kind == events.KindState && e.State == st }
}

// exitedWith matches an exit whose verdict is cause.
func exitedWith(cause string) func(events.Event) bool {
	return func(e events.Event) bool {
		return e.Kind == events.KindExited && e.Failure != nil && string(e.Failure.Verdict.Cause) == cause
	}
}

// decided matches a decision event naming d.
func decided(d string) func(events.Event) bool {
	return func(e events.Event) bool { return e.Kind == events.KindDecision && e.Decision == d }
}

// after matches what match matches, later in the stream than e.
func after(e events.Event, match func(events.Event) bool) func(events.Event) bool {
	return func(x events.Event) bool { return x.Seq > e.Seq && match(x) }
}

// rungOf is the rung an event names (-1 when it names none).
func rungOf(e events.Event) int {
	if e.Rung == nil {
		return -1
	}
	return e.Rung.Index
}

// count is how many guard log entries match.
func (s *scene) count(match func(map[string]any) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.logs {
		if match(m) {
			n++
		}
	}
	return n
}

// waitLog waits until n guard log entries match, and returns the last one.
func (s *scene) waitLog(what string, n int, timeout time.Duration, match func(map[string]any) bool) map[string]any {
	s.t.Helper()
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		var found []map[string]any
		for _, m := range s.logs {
			if match(m) {
				found = append(found, m)
			}
		}
		s.mu.Unlock()
		if len(found) >= n {
			return found[n-1]
		}
		select {
		case <-s.notify:
		case <-s.exited:
			if s.count(match) >= n {
				continue
			}
			s.t.Fatalf("guard exited (code %d) before %s", s.code, what)
		case <-deadline:
			s.t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

func msg(text string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["msg"] == text }
}

func msgContains(text string) func(map[string]any) bool {
	return func(m map[string]any) bool { s, _ := m["msg"].(string); return strings.Contains(s, text) }
}

// waitExit waits for the guard to exit and returns its code.
func (s *scene) waitExit(timeout time.Duration) int {
	s.t.Helper()
	select {
	case <-s.exited:
		return s.code
	case <-time.After(timeout):
		s.t.Fatalf("guard did not exit within %s", timeout)
		return -1
	}
}

// ours lists live processes of this scene (they carry FAKEVLLM_TEST_ID).
func (s *scene) ours() []int { return procmark.Live("FAKEVLLM_TEST_ID=" + s.testID) }

func (s *scene) killLeftovers() {
	for _, pid := range s.ours() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// stopCleanly sends SIGTERM to the guard and requires exit 0 within exit,
// then no vLLM process of the scene within gone.
func (s *scene) stopCleanly(exit, gone time.Duration) {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	if code := s.waitExit(exit); code != 0 {
		s.t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	s.waitNoProcesses(gone)
}

// waitNoProcesses waits until none of this scene's vLLM processes is alive.
func (s *scene) waitNoProcesses(timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := s.ours()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("vLLM processes left behind: %v", describe(left))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func describe(pids []int) []string {
	var out []string
	for _, p := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		out = append(out, fmt.Sprintf("%d:%s", p, strings.ReplaceAll(string(b), "\x00", " ")))
	}
	return out
}

// verdictText is an exit's summary and evidence, for "does it name X".
func verdictText(e events.Event) string {
	if e.Failure == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(e.Failure.Verdict.Summary)
	for _, l := range e.Failure.Verdict.Evidence {
		b.WriteString("\n" + l.Text)
	}
	return b.String()
}

// simMetrics scrapes the simulator's /metrics on port: each series' name
// (labels dropped) to its value.
func simMetrics(port int) (map[string]float64, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return vllmstats.Flat(resp.Body)
}

// waitFullBatch waits until the simulator runs a full batch of maxNumSeqs
// sequences (the background demand at its height) and returns its metrics
// then. With that batch running, fakevllm_true_safe_max_num_seqs at or
// above maxNumSeqs is the simulator's own truth that the rung holds: its
// memory model cannot run out later. This replaces holding a wall-clock
// window open, which a loaded machine could end before the demand peaked.
func (s *scene) waitFullBatch(maxNumSeqs int, timeout time.Duration) map[string]float64 {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m, err := simMetrics(s.port)
		if err == nil && int(m["vllm:num_requests_running"]) >= maxNumSeqs && m["fakevllm_true_safe_max_num_seqs"] > 0 {
			return m
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the simulator did not run a full batch of %d within %s (last %v, %v)", maxNumSeqs, timeout, m, err)
		}
		select {
		case <-s.exited:
			s.t.Fatalf("guard exited (code %d) before a full batch ran", s.code)
		case <-time.After(50 * time.Millisecond): // the pace of the scrapes
		}
	}
}
