package integration

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// masks what differs from run to run (times, pids, byte counts, sparklines)
// so a golden file holds the shape and the words.
var (
	durations    = regexp.MustCompile(`\b([0-9.]+(ns|µs|ms|s|m|h))+\b`)
	digits       = regexp.MustCompile(`[0-9]+`)
	sparkline    = regexp.MustCompile(`[▁▂▃▄▅▆▇█]+`)
	trend        = regexp.MustCompile(`\b(steady|climbing|spike)\b`)
	lastIncident = regexp.MustCompile(`(?m)^(Last incident: .*?LN:).*$`)
	costModel    = regexp.MustCompile(`(?m)^(  cost model +).*$`)
	buildLabels  = regexp.MustCompile(`\b(goversion|revision|version)="[^"]*"`)
)

func mask(s string) string {
	s = sparkline.ReplaceAllString(s, "~")
	s = trend.ReplaceAllString(s, "TREND")
	s = durations.ReplaceAllString(s, "D")
	s = digits.ReplaceAllString(s, "N")
	// The evidence line is cut to the terminal's width: its end moves with
	// the length of the numbers before it.
	s = lastIncident.ReplaceAllString(s, "$1 …")
	// Whether the fit is confident yet depends on how many samples the
	// run took before the status was read.
	return costModel.ReplaceAllString(s, "$1…")
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./integration -run %s -update to create it)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// After a scripted OOM and a restart on rung 1: the status view and the
// metrics say so, in the shape the golden files hold, and promtool finds
// nothing wrong with a real scrape.
func TestStatusAndMetricsAfterOOMAndRestart(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	httpPort := testkit.FreePort(t)
	s.env["FAKEVLLM_SEQ_COST_MIB"] = "64"
	s.env["FAKEVLLM_BACKGROUND_SEQS"] = "200"
	s.env["FAKEVLLM_BACKGROUND_AFTER"] = "200ms"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "unused")
	s.httpListen = fmt.Sprintf("127.0.0.1:%d", httpPort)
	// Rung 1 runs at 91 % of the GPU, 11 points beyond its budget (the
	// background demand): fixed thresholds above that keep any alert from
	// flickering into the golden view.
	s.extra = "\n[restart]\ninitial_delay = \"200ms\"\n[gpu]\nsample_interval = \"100ms\"\nwarn_fraction = 0.95\ncritical_fraction = 0.97\n"
	s.start()
	s.WaitEvent("ready on rung 1", 2, 60*time.Second, isReady)
	// The scraper reads vLLM every sample (100 ms) and /metrics shows its
	// last reading; wait for vLLM's own metrics to be in.
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	var scrape string
	if !testkit.PollEvery(10*time.Second, 50*time.Millisecond, func() bool {
		scrape = get(t, base+"/metrics", 200)
		// The sample line, not the HELP line (which starts "… 1 when"),
		// and vLLM's gauges themselves.
		return strings.Contains(scrape, "\nvllm_guard_vllm_metrics_up 1\n") && strings.Contains(scrape, "\nvllm_guard_vllm_requests_running ")
	}) {
		t.Fatalf("vLLM's metrics never scraped:\n%s", scrape)
	}
	for _, want := range []string{
		"vllm_guard_profile_rung 1", "vllm_guard_profile_max_num_seqs 128",
		"vllm_guard_starts_total 2", "vllm_guard_ready 1", `vllm_guard_exits_total{cause="oom"} 1`,
		`vllm_guard_state{state="ready"} 1`, "vllm_guard_nvml_up 1",
	} {
		if !strings.Contains(scrape, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	golden(t, "metrics-after-oom.golden", seriesShape(scrape))
	lint := exec.Command("promtool", "check", "metrics")
	lint.Stdin = strings.NewReader(scrape)
	if out, err := lint.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("promtool check metrics on the guard's scrape: %v\n%s", err, out)
	}
	get(t, base+"/readyz", 200)
	get(t, base+"/livez", 200)

	out, err := exec.Command(bins.guard, "status", "--socket", filepath.Join(s.dir, "guard.sock")).CombinedOutput()
	if err != nil {
		t.Fatalf("vllm-guard status: %v\n%s", err, out)
	}
	view := string(out)
	for _, want := range []string{"ready", "rung 1", "max_num_seqs 128", "oom"} {
		if !strings.Contains(view, want) {
			t.Errorf("status view lacks %q:\n%s", want, view)
		}
	}
	golden(t, "status-after-oom.golden", mask(view))
}

// seriesShape lists the series of a scrape (name and labels, no values),
// sorted: the golden file catches a series that disappears or is renamed.
func seriesShape(scrape string) string {
	var lines []string
	for _, l := range strings.Split(scrape, "\n") {
		if l == "" || strings.HasPrefix(l, "#") || !strings.HasPrefix(l, "vllm_guard_") {
			continue
		}
		name := l[:strings.LastIndexByte(l, ' ')]
		if strings.Contains(name, "_bucket{") {
			continue
		}
		// The build's labels change with every commit and Go release.
		name = buildLabels.ReplaceAllString(name, `$1="…"`)
		// Present only while memory climbs: whether it does at the
		// moment of the scrape is not the shape (gpu_climbing is).
		if strings.HasPrefix(name, "vllm_guard_gpu_seconds_to_critical{") {
			continue
		}
		lines = append(lines, name)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}

func get(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d, want %d: %s", url, resp.StatusCode, want, b)
	}
	return string(b)
}

// `vllm-guard status` with no guard: exit 3 (exitcode.NoGuard) and the socket named.
func TestStatusWithoutAGuard(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "none.sock")
	cmd := exec.Command(bins.guard, "status", "--socket", sock)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 3 || !strings.Contains(string(out), sock) {
		t.Fatalf("exit %d, output %q: want 3 and the socket path", cmd.ProcessState.ExitCode(), out)
	}
}
