package metrics

import (
	"bufio"
	"bytes"
	"flag"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

func TestMain(m *testing.M) { testkit.Main(m) }

// scrape fetches /metrics over real HTTP, as Prometheus would.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape: Content-Type %q, want the text format", ct)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return string(b)
}

// source stands for the GPU monitor and vLLM's scraper at once: the
// readings a scrape finds are the ones a test last set, as the samplers'
// latest snapshots would be.
type source struct {
	mu     sync.Mutex
	gpu    gpumon.Snapshot
	health gpumon.Health
	vllm   vllmstats.Stats
}

func (s *source) Snapshot() gpumon.Snapshot { s.mu.Lock(); defer s.mu.Unlock(); return s.gpu }
func (s *source) Health() gpumon.Health     { s.mu.Lock(); defer s.mu.Unlock(); return s.health }
func (s *source) Latest() vllmstats.Stats   { s.mu.Lock(); defer s.mu.Unlock(); return s.vllm }

func (s *source) setGPU(g gpumon.Snapshot) { s.mu.Lock(); defer s.mu.Unlock(); s.gpu = g }
func (s *source) setHealth(h gpumon.Health) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health = h
}
func (s *source) setVLLM(running, waiting, kvUsage float64, up bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vllm = vllmstats.Stats{Up: up, Running: running, Waiting: waiting, KVUsage: kvUsage}
}

// newMetrics is the guard's metrics reading a source the test controls.
func newMetrics() (*Metrics, *source) {
	src := &source{}
	return New(Sources{GPU: src, VLLM: src}), src
}

// ours keeps the guard's own families (the Go and process collectors vary
// from run to run).
func ours(exposition string) string {
	var out strings.Builder
	sc := bufio.NewScanner(strings.NewReader(exposition))
	for sc.Scan() {
		l := sc.Text()
		name := strings.TrimPrefix(strings.TrimPrefix(l, "# HELP "), "# TYPE ")
		if strings.HasPrefix(name, Namespace+"_") {
			out.WriteString(l + "\n")
		}
	}
	return out.String()
}

// gpu is one device's sample; stc < 0 means not climbing, as the monitor
// reports it.
func gpu(fraction, stc float64) gpumon.Snapshot {
	const total = 80 << 30
	return gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{
		Index: 0, UUID: "GPU-5e1f0000-0000-4000-8000-000000000001", Name: "NVIDIA H100 80GB HBM3",
		Used: uint64(fraction * total), Total: total, Fraction: fraction, SecondsToCritical: stc, Trend: trendOf(stc),
	}}}
}

func trendOf(stc float64) string {
	if stc >= 0 {
		return gpumon.TrendClimbing
	}
	return gpumon.TrendSteady
}

// script is the sequence of the golden file: start, ready, OOM exit,
// rung 1, start, ready.
func script(m *Metrics, src *source) {
	rung0 := policy.Rung{Index: 0, MaxNumSeqs: 256, GPUMemoryUtilization: 0.85}
	rung1 := policy.Rung{Index: 1, MaxNumSeqs: 128, GPUMemoryUtilization: 0.80}
	m.SetProfile(rung0)
	src.setVLLM(0, 0, 0, false)
	m.SetState(status.StateStarting)
	m.Started()
	src.setGPU(gpu(0.10, -1))
	src.setGPU(gpu(0.86, -1))
	m.SetState(status.StateReady)
	m.Ready(42 * time.Second)
	src.setVLLM(200, 17, 0.93, true)
	src.setGPU(gpu(0.95, 45))
	m.SetAlert("gpu_memory_warn", true)
	m.SetAlert("oom_predicted", true)
	m.SetState(status.StateStopping)
	m.Exited(cause.CauseOOM)
	src.setVLLM(0, 0, 0, false)
	src.setGPU(gpu(0.01, -1))
	m.SetAlert("gpu_memory_warn", false)
	m.SetAlert("oom_predicted", false)
	m.SetState(status.StateWaitingGPU)
	m.SetState(status.StateBackoff)
	m.SetProfile(rung1)
	m.SetState(status.StateStarting)
	m.Started()
	m.SetState(status.StateReady)
	m.Ready(31500 * time.Millisecond)
	src.setGPU(gpu(0.81, -1))
	src.setVLLM(120, 0, 0.6, true)
}

func TestGoldenExposition(t *testing.T) {
	m, src := newMetrics()
	script(m, src)
	// The Go version differs from machine to machine; the revision is
	// "unknown" in a test binary (Go stamps none), the version "dev".
	got := regexp.MustCompile(`goversion="go[^"]*"`).ReplaceAllString(ours(scrape(t, m)), `goversion="GO"`)
	golden := filepath.Join("testdata", "sequence.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read %s (run go test ./metrics -update to create it): %v", golden, err)
	}
	if got != string(want) {
		t.Errorf("exposition differs from %s (go test ./metrics -update rewrites it after a deliberate change)\n--- got\n%s", golden, got)
	}
}

// TestPromtoolCheckMetrics lints a real scrape, Go and process series
// included, with Prometheus's own linter.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := needPromtool(t)
	m, src := newMetrics()
	script(m, src)
	body := scrape(t, m)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

func needPromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found in PATH: install Debian's package prometheus (apt-get install prometheus), or run scripts/setup.sh")
	}
	return p
}

func TestPreCreatedSeries(t *testing.T) {
	body := scrape(t, New(Sources{}))
	for _, want := range []string{
		`vllm_guard_state{state="starting"} 0`, `vllm_guard_state{state="stopped"} 0`,
		`vllm_guard_exits_total{cause="oom"} 0`, `vllm_guard_exits_total{cause="host_oom"} 0`,
		`vllm_guard_alert_active{alert="gave_up"} 0`, `vllm_guard_alert_active{alert="gpu_memory_warn"} 0`,
		`vllm_guard_starts_total 0`, `vllm_guard_time_to_ready_seconds_count 0`,
		`vllm_guard_ready 0`, `vllm_guard_nvml_up 0`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("a fresh guard's scrape lacks %q", want)
		}
	}
	if strings.Contains(body, "vllm_guard_gpu_memory_used_bytes{") {
		t.Error("GPU series exported before any sample")
	}
	// One OOM counter: exits_total{cause="oom"}.
	if strings.Contains(body, "vllm_guard_oom_total") {
		t.Error("vllm_guard_oom_total is back: it duplicates exits_total{cause=\"oom\"}")
	}
	for _, absent := range []string{"vllm_guard_vllm_requests_running", "vllm_guard_vllm_requests_waiting", "vllm_guard_vllm_kv_cache_usage_ratio"} {
		if strings.Contains(body, "\n"+absent+" ") {
			t.Errorf("a fresh guard exports %s before vLLM was ever read", absent)
		}
	}
}

func TestBuildInfo(t *testing.T) {
	body := scrape(t, New(Sources{}))
	re := regexp.MustCompile(`(?m)^vllm_guard_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`)
	if !re.MatchString(body) {
		t.Errorf("no vllm_guard_build_info{goversion,revision,version} 1 in\n%s", ours(body))
	}
}

// No series carries a sentinel: after the whole golden sequence (a climb,
// steady spells, vLLM down and up) no value is negative.
func TestNoSentinelValues(t *testing.T) {
	m, src := newMetrics()
	script(m, src)
	for l := range strings.Lines(ours(scrape(t, m))) {
		if !strings.HasPrefix(l, "#") && strings.Contains(l, " -") {
			t.Errorf("a negative value: %s", l)
		}
	}
}

func TestSetStateOneHot(t *testing.T) {
	m := New(Sources{})
	for _, s := range status.States {
		m.SetState(s)
		body := scrape(t, m)
		for _, x := range status.States {
			want := `vllm_guard_state{state="` + string(x) + `"} 0`
			if x == s {
				want = `vllm_guard_state{state="` + string(x) + `"} 1`
			}
			if !strings.Contains(body, want+"\n") {
				t.Errorf("after SetState(%s): want %q", s, want)
			}
		}
		ready := "vllm_guard_ready 0\n"
		if s == status.StateReady {
			ready = "vllm_guard_ready 1\n"
		}
		if !strings.Contains(body, ready) {
			t.Errorf("after SetState(%s): want %q", s, ready)
		}
	}
}

func TestGPUSeriesDropDepartedDevicesAndStaleReadings(t *testing.T) {
	m, src := newMetrics()
	two := gpu(0.5, 12.5)
	two.Devices = append(two.Devices, gpumon.Device{Index: 3, UUID: "GPU-b", Used: 1 << 30, Total: 2 << 30, Fraction: 0.5, SecondsToCritical: -1})
	src.setGPU(two)
	body := scrape(t, m)
	for _, want := range []string{`vllm_guard_gpu_seconds_to_critical{gpu="0"} 12.5`, `vllm_guard_gpu_climbing{gpu="0"} 1`,
		`vllm_guard_gpu_climbing{gpu="3"} 0`,
		`vllm_guard_gpu_memory_total_bytes{gpu="3",uuid="GPU-b"} 2.147483648e+09`, `vllm_guard_nvml_up 1`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("two GPUs: want %q in\n%s", want, ours(body))
		}
	}
	if strings.Contains(body, `vllm_guard_gpu_seconds_to_critical{gpu="3"}`) {
		t.Errorf("GPU 3 is not climbing, yet has seconds to critical:\n%s", ours(body))
	}
	// The climb stops: its seconds to critical go, climbing reads 0. A
	// trend that says climbing with no finite time is not a climb.
	flat := gpu(0.5, -1)
	flat.Devices = append(flat.Devices, gpumon.Device{Index: 3, UUID: "GPU-b", Used: 1 << 30, Total: 2 << 30, Fraction: 0.5,
		Trend: gpumon.TrendClimbing, SecondsToCritical: math.Inf(1)})
	src.setGPU(flat)
	body = scrape(t, m)
	if strings.Contains(body, "vllm_guard_gpu_seconds_to_critical{") || !strings.Contains(body, `vllm_guard_gpu_climbing{gpu="0"} 0`+"\n") ||
		!strings.Contains(body, `vllm_guard_gpu_climbing{gpu="3"} 0`+"\n") {
		t.Errorf("the climb ended: want no seconds to critical and climbing 0:\n%s", ours(body))
	}
	src.setGPU(two)

	src.setGPU(gpu(0.5, -1)) // GPU 3 left the snapshot
	body = scrape(t, m)
	if strings.Contains(body, `gpu="3"`) {
		t.Errorf("GPU 3 left the snapshot but its series remain:\n%s", ours(body))
	}
	if !strings.Contains(body, `vllm_guard_gpu_memory_used_ratio{gpu="0"} 0.5`+"\n") {
		t.Errorf("GPU 0 lost its series:\n%s", ours(body))
	}

	src.setGPU(gpumon.Snapshot{Up: false, Reason: "GPU metrics unavailable: no driver"})
	body = scrape(t, m)
	if strings.Contains(body, "vllm_guard_gpu_memory_used_ratio{") || !strings.Contains(body, "vllm_guard_nvml_up 0\n") {
		t.Errorf("NVML down: want nvml_up 0 and no stale GPU readings:\n%s", ours(body))
	}
}

// While vLLM is not read its gauges are absent, not 0 (an idle vLLM).
func TestVLLMSeriesAbsentWhileDown(t *testing.T) {
	m, src := newMetrics()
	src.setVLLM(5, 2, 0.4, true)
	body := scrape(t, m)
	for _, want := range []string{"vllm_guard_vllm_metrics_up 1", "vllm_guard_vllm_requests_running 5",
		"vllm_guard_vllm_requests_waiting 2", "vllm_guard_vllm_kv_cache_usage_ratio 0.4"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("up: want %q in\n%s", want, ours(body))
		}
	}
	src.setVLLM(5, 2, 0.4, false)
	body = scrape(t, m)
	if !strings.Contains(body, "vllm_guard_vllm_metrics_up 0\n") {
		t.Errorf("down: want vllm_metrics_up 0 in\n%s", ours(body))
	}
	for _, absent := range []string{"vllm_guard_vllm_requests_running", "vllm_guard_vllm_requests_waiting", "vllm_guard_vllm_kv_cache_usage_ratio"} {
		if strings.Contains(body, absent) {
			t.Errorf("down: %s is still exported:\n%s", absent, ours(body))
		}
	}
	src.setVLLM(1, 0, math.NaN(), true)
	body = scrape(t, m)
	if !strings.Contains(body, "vllm_guard_vllm_requests_running 1\n") || strings.Contains(body, "vllm_guard_vllm_kv_cache_usage_ratio ") {
		t.Errorf("up again, KV usage not a number: want running 1 and no KV series:\n%s", ours(body))
	}
}

func TestRegistryTakesOtherSeries(t *testing.T) {
	m := New(Sources{})
	if m.Registry() == nil {
		t.Fatal("nil registry")
	}
	// The proxy registers its series here: the handler must serve them.
	m.Registry().MustRegister(newTestCounter())
	if body := scrape(t, m); !strings.Contains(body, "vllm_guard_proxy_test_total 0\n") {
		t.Errorf("a series registered on Registry() is not served:\n%s", ours(body))
	}
}

func newTestCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "proxy_test_total", Help: "test"})
}
