// Package integration runs the real vllm-guard binary over the real vLLM
// simulator and the stand-in NVML library, as processes.
package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/procmark"
	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"github.com/vllm-guard/vllm-guard/internal/testkit/guardrun"
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
	stateDir   string            // [control] state_dir; default dir/state
	command    string            // TOML array for [vllm] command; default the simulator

	// The running guard: its log, its event stream (run --events) and
	// every wait on them (internal/testkit/guardrun, shared with the real
	// vLLM's scene).
	*guardrun.Guard
}

func newScene(t testing.TB) *scene {
	t.Helper()
	dir := t.TempDir()
	s := &scene{t: t, dir: dir, port: testkit.FreePort(t), gpuDir: filepath.Join(dir, "gpu"),
		testID: fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()),
		env:    map[string]string{"FAKEVLLM_ERA": "v1-ansi"}, logLevel: "debug"}
	// vLLM's cache (the startup plan the guard turns on) stays in the scene.
	s.env["XDG_CACHE_HOME"] = filepath.Join(dir, "cache")
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
	stateDir := s.stateDir
	if stateDir == "" {
		stateDir = filepath.Join(s.dir, "state")
	}
	fmt.Fprintf(&b, "\n[control]\nsocket = %q\nhttp_listen = %q\nstate_dir = %q\n\n[log]\nformat = \"json\"\nlevel = %q\n",
		filepath.Join(s.dir, "guard.sock"), s.httpListen, stateDir, s.logLevel)
	b.WriteString(s.extra)
	return b.String()
}

// start runs `vllm-guard run` and collects its JSON log and its event
// stream (`--events /dev/fd/3`, a pipe).
func (s *scene) start(args ...string) {
	s.t.Helper()
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
	argv := append([]string{bin, "run", "--config", cfg, "--events", "/dev/fd/3"}, args...)
	if s.nofile > 0 {
		// As systemd's LimitNOFILE: the shell sets both limits, then
		// becomes the guard (same pid), which raises its soft limit to
		// the hard one as every Go program does.
		argv = append([]string{"/bin/sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, s.nofile)}, argv...)
	}
	lib := bins.nvmlDir
	if s.noNVML {
		lib = filepath.Join(s.dir, "no-nvml-here")
	}
	// The race runtime sleeps a second at every exit by default; the keeper
	// (the same race-built binary) exits at each stop of vLLM.
	env := append(os.Environ(), "FAKENVML_STATE="+s.gpuDir, "LD_LIBRARY_PATH="+lib, "GORACE=atexit_sleep_ms=0")
	for k, v := range s.guardEnv {
		env = append(env, k+"="+v)
	}
	spec := guardrun.Spec{Argv: argv, Env: env}
	if s.skipVLLM {
		spec.Skip = func(line string) bool { return strings.Contains(line, `"logger":"vllm"`) }
	}
	s.Guard = guardrun.Start(s.t, spec)
	s.t.Cleanup(func() {
		s.Stop(15 * time.Second)
		s.killLeftovers()
		if s.t.Failed() {
			raw, evs := s.Raw(), s.Events()
			from := max(0, len(raw)-80)
			s.t.Logf("guard log (last %d lines):\n%s", len(raw)-from, strings.Join(raw[from:], "\n"))
			var lines []string
			for _, e := range evs[max(0, len(evs)-40):] {
				b, _ := json.Marshal(e)
				lines = append(lines, string(b))
			}
			s.t.Logf("guard events (last %d):\n%s", len(lines), strings.Join(lines, "\n"))
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

// Event matchers (internal/testkit/guardrun's, shared with the real vLLM's
// scene).

var (
	kind       = guardrun.OfKind
	inState    = guardrun.InState
	exitedWith = guardrun.ExitedWith
	decided    = guardrun.Decided
	after      = guardrun.After
	isStarting = kind(events.KindStarting)
	isReady    = kind(events.KindReady)
	isExited   = kind(events.KindExited)
)

// rungOf is the rung an event names (-1 when it names none).
func rungOf(e events.Event) int {
	if e.Rung == nil {
		return -1
	}
	return e.Rung.Index
}

func msg(text string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["msg"] == text }
}

func msgContains(text string) func(map[string]any) bool {
	return func(m map[string]any) bool { s, _ := m["msg"].(string); return strings.Contains(s, text) }
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
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if code := s.WaitExit(exit); code != 0 {
		s.t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	s.waitNoProcesses(gone)
}

// waitNoProcesses waits until none of this scene's vLLM processes is alive.
func (s *scene) waitNoProcesses(timeout time.Duration) {
	s.t.Helper()
	var left []int
	if !testkit.PollEvery(timeout, 20*time.Millisecond, func() bool { left = s.ours(); return len(left) == 0 }) {
		s.t.Fatalf("vLLM processes left behind: %v", describe(left))
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
		case <-s.Exited():
			s.t.Fatalf("guard exited (code %d) before a full batch ran", s.Code())
		case <-time.After(50 * time.Millisecond): // the pace of the scrapes
		}
	}
}
