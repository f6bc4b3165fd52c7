package control

import (
	"bytes"
	"flag"
	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/proxy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./control -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (rerun with -update if the change is intended)\n--- got:\n%s\n--- want:\n%s", path, got, want)
	}
}

func TestWriteStatusGolden(t *testing.T) {
	var b bytes.Buffer
	WriteStatus(&b, fixtureDoc())
	golden(t, "status.golden", b.Bytes())
	if bytes.Contains(b.Bytes(), []byte("\x1b")) {
		t.Error("the human view holds an escape sequence")
	}
	// Rendering is a function of the document alone.
	var again bytes.Buffer
	WriteStatus(&again, fixtureDoc())
	if !bytes.Equal(b.Bytes(), again.Bytes()) {
		t.Error("two renderings of the same document differ")
	}
}

func TestWriteStatusNotReady(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Doc)
		want []string
	}{
		{"backoff", func(d *Doc) {
			d.Guard.State, d.Guard.Reason, d.Guard.PID = status.StateBackoff, "after oom: backoff 5s", 0
			d.Guard.NextStartAt = d.Now.Add(4 * time.Second)
			d.VLLM.Up = false
		}, []string{"BACKOFF since", "next start     in 4s (12:10:04 UTC)", "vLLM           not running", "not scraped (vLLM not ready)"}},
		{"starting", func(d *Doc) {
			d.Guard.State, d.Guard.Phase, d.Guard.LastProbe = status.StateStarting, "weights", "GET /health: connection refused"
			d.VLLM.Up = false
		}, []string{"STARTING since", "phase weights", "last probe     GET /health: connection refused"}},
		{"failed", func(d *Doc) {
			d.Guard.State, d.Guard.Reason, d.Guard.ExitCode, d.Guard.PID = status.StateFailed, "config_error: unrecognized arguments", 78, 0
			d.Alerts = append(d.Alerts, ActiveAlert{Name: alerts.GaveUp, Since: d.Guard.Since, Message: "the guard gave up: " + d.Guard.Reason})
		}, []string{"FAILED since", "exit code      78", "gave_up", "the guard gave up: config_error"}},
		{"gpu down, scrape failing", func(d *Doc) {
			d.GPU.Up, d.GPU.Reason = false, "GPU metrics unavailable: built without cgo"
			d.VLLM.Up, d.VLLM.LastError, d.VLLM.Failures, d.VLLM.Scrapes = false, "HTTP 500", 2, 9
		}, []string{"GPUs: unavailable (GPU metrics unavailable: built without cgo)", "unknown: vLLM's /metrics failed 2 of 9 scrapes; last: HTTP 500"}},
		{"restarting, holding requests", func(d *Doc) {
			d.Guard.State, d.Guard.Reason, d.Guard.PID = status.StateBackoff, "after oom: backoff 5s", 0
			d.VLLM.Up = false
			d.Proxy = &proxy.Stats{Limit: 16, QueueSize: 512, Queued: 7, Held: 7, Paused: 3, Suspects: 1,
				LastSuspect: &proxy.Suspect{Path: "/v1/completions", Client: "10.0.0.7", BodyBytes: 900000, PromptTokens: 225000, Deaths: 2}}
		}, []string{"holding 7 requests (3 streams paused), resuming when vLLM is ready",
			"1 refused a resend after 2 deaths in flight, last /v1/completions from 10.0.0.7: 900000 bytes, about 225000 prompt tokens"}},
		{"no incident, no alert, hostile text", func(d *Doc) {
			d.LastIncident, d.Alerts = nil, nil
			d.Guard.Reason = "evil\x1b[2Jreason\nsecond line"
			d.Guard.Restarts = map[cause.Cause]int{}
		}, []string{"Alerts: none", "Last incident: none", "restarts       none", "evil [2Jreason second line"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := fixtureDoc()
			c.edit(&d)
			var b bytes.Buffer
			WriteStatus(&b, d)
			out := b.String()
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("missing %q in:\n%s", w, out)
				}
			}
			if strings.Contains(out, "\x1b") {
				t.Errorf("escape sequence in:\n%q", out)
			}
		})
	}
}

func TestSparkline(t *testing.T) {
	cases := []struct {
		in     []float64
		width  int
		lo, hi float64
		want   string
	}{
		{nil, 40, 0, 1, "-"},
		{[]float64{0, 0.13, 0.26, 0.38, 0.51, 0.63, 0.76, 0.88, 1, 1.5, -1}, 40, 0, 1, "▁▂▃▄▅▆▇███▁"},
		{[]float64{0.80, 0.85, 0.90, 0.95}, 40, 0.80, 0.95, "▁▃▆█"},
		// 80 samples in 4 buckets of 20: each bucket shows its peak.
		{append(append(append(make([]float64, 20), append([]float64{0.99}, make([]float64, 19)...)...), make([]float64, 20)...), make([]float64, 20)...), 4, 0, 1, "▁█▁▁"},
	}
	for _, c := range cases {
		if got := Sparkline(c.in, c.width, c.lo, c.hi); got != c.want {
			t.Errorf("Sparkline(%v, %d, %v, %v) = %q, want %q", c.in, c.width, c.lo, c.hi, got, c.want)
		}
	}
	if n := len([]rune(Sparkline(make([]float64, 600), sparkWidth, 0, 1))); n != sparkWidth {
		t.Errorf("600 samples drew %d characters, want %d", n, sparkWidth)
	}
}

func TestSparkScale(t *testing.T) {
	cases := []struct {
		in     []float64
		lo, hi float64
	}{
		{[]float64{0.05, 0.93}, 0.05, 0.93},
		{[]float64{0.775, 0.78}, 0.775, 0.875}, // noise is not drawn full height
		{[]float64{0.98, 0.99}, 0.9, 1},
		{[]float64{-3, 7}, 0, 1},
		{[]float64{math.NaN()}, 0, 1},
	}
	for _, c := range cases {
		lo, hi := SparkScale(c.in)
		if math.Abs(lo-c.lo) > 1e-9 || math.Abs(hi-c.hi) > 1e-9 {
			t.Errorf("SparkScale(%v) = %v, %v; want %v, %v", c.in, lo, hi, c.lo, c.hi)
		}
	}
}

func TestAlertsInForceKeepTheOwnersOrder(t *testing.T) {
	d := fixtureDoc()
	if len(d.Alerts) != 2 || d.Alerts[0].Name != "gpu_memory_warn" || d.Alerts[1].Name != "oom_predicted" {
		t.Fatalf("%+v; want the two memory alerts, oldest first", d.Alerts)
	}
}

// The group's lines: the member's place, the epoch, readiness, and each
// member's word and when it was heard (a lost one said so, a never heard
// one too); a member's word is cleaned like any text.
func TestTheViewShowsTheGroup(t *testing.T) {
	now := time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)
	d := Doc{Now: now, Group: &Group{Rank: 0, Size: 3, Leader: "10.0.0.1:29600", Epoch: 4, Phase: "serving", Rung: 1, Ready: false,
		Members: []GroupMember{{Rank: 0, This: true, Said: "open", Epoch: 4, Present: true},
			{Rank: 1, Said: "running", Epoch: 4, Heard: now.Add(-time.Second), Present: true},
			{Rank: 2, Said: "idle\x1b[31m", Epoch: 3, Heard: now.Add(-10 * time.Second)}}}}
	var b strings.Builder
	writeGroup(&b, d)
	out := b.String()
	for _, want := range []string{"Group: rank 0 of 3, leader 10.0.0.1:29600; epoch 4 (serving) on rung 1; the group is not ready",
		"member 0 (leader)", "open at epoch 4", "this guard", "member 1", "running at epoch 4", "heard 10:59:59 UTC (1s ago)",
		"member 2", "at epoch 3", ": lost"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a member's word reached the view raw:\n%q", out)
	}
	b.Reset()
	writeGroup(&b, Doc{})
	if b.Len() != 0 {
		t.Errorf("a guard without a group shows %q", b.String())
	}
}
