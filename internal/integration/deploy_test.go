package integration

// Real deployments (issue 13): an API key, a pooling model, names from
// every source, --kv-cache-memory-bytes, NCCL's OOM line, memory alerts
// against vLLM's own budget, and the guard's own access lines — each over
// the real guard and the simulator.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func statusDoc(t testing.TB, s *scene) control.Doc {
	t.Helper()
	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return d
}

// guardCLI runs a vllm-guard subcommand and returns its output.
func guardCLI(t testing.TB, args ...string) string {
	t.Helper()
	out, _ := exec.Command(bins.guard, args...).CombinedOutput()
	return string(out)
}

// An API key in the command (flag) or in vLLM's environment: the guard
// sends it, becomes ready, and the key is in none of its outputs — the log
// (vLLM prints its non-default args, the key included), status, the event
// stream, the incident records (one OOM makes one), `check`.
func TestAPIKeyReadyAndNeverShown(t *testing.T) {
	const key = "sk-integration-7f3a9c"
	for _, form := range []string{"flag", "env"} {
		t.Run(form, func(t *testing.T) {
			s := quick(newScene(t))
			if form == "flag" {
				s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--api-key\", %q]", bins.fakevllm, key)
			} else {
				s.env["VLLM_API_KEY"] = key
			}
			oneShot(s, "crash_after=200ms")
			s.start()
			crash := s.WaitEvent("the crash", 1, 60*time.Second, isExited)
			s.WaitEvent("ready after the crash", 1, 60*time.Second, after(crash, isReady))

			// The key works: vLLM refuses a request without it, takes one with it.
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/models", s.port)
			if resp, err := http.Get(url); err != nil || resp.StatusCode != 401 {
				t.Fatalf("vLLM without the key: %v %v", resp, err)
			}
			outputs := map[string]string{
				"status --json": guardCLI(t, "status", "--json", "--socket", s.socket()),
				"status":        guardCLI(t, "status", "--socket", s.socket()),
				"incidents":     guardCLI(t, "incidents", "--json", "--config", filepath.Join(s.dir, "vllm-guard.toml")),
				"check":         guardCLI(t, "check", "--config", filepath.Join(s.dir, "vllm-guard.toml")),
			}
			raw, _ := json.Marshal(s.Events())
			outputs["events"] = string(raw)
			outputs["log"] = strings.Join(s.Raw(), "\n")
			incDir := filepath.Join(s.dir, "state", "incidents")
			ents, _ := os.ReadDir(incDir)
			if len(ents) == 0 {
				t.Fatalf("no incident record in %s", incDir)
			}
			for _, e := range ents {
				b, _ := os.ReadFile(filepath.Join(incDir, e.Name()))
				outputs["incident "+e.Name()] = string(b)
			}
			for what, out := range outputs {
				if strings.Contains(out, key) {
					t.Errorf("the API key appears in %s", what)
				}
			}
			if form == "flag" && !strings.Contains(outputs["log"], `'api_key': ['***']`) {
				t.Errorf("vLLM's non-default args, key masked, are not in the log (masking untested)")
			}
			if !strings.Contains(outputs["incidents"], "crash") {
				t.Errorf("incidents shows no record:\n%s", outputs["incidents"])
			}
			if !strings.Contains(outputs["check"], "***") {
				t.Errorf("check shows no masked key:\n%s", outputs["check"])
			}
		})
	}
}

// Without the key the guard never calls vLLM ready, says why in status,
// and the refused probes (their access lines) are no load progress.
func TestMissingAPIKeyIsTheReason(t *testing.T) {
	s := quick(newScene(t))
	s.extra = "\n[readiness]\npoll_interval = \"50ms\"\n"
	// vLLM gets its key behind the guard's back: neither the command nor
	// [vllm] env names it.
	wrapper := filepath.Join(s.dir, "vllm-with-key.sh")
	os.WriteFile(wrapper, []byte("#!/bin/sh\nVLLM_API_KEY=sk-only-vllm-knows exec "+bins.fakevllm+" \"$@\"\n"), 0o755)
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\"]", wrapper)
	s.start()
	s.WaitEvent("a 401 probe", 1, 60*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindProbeFailed && strings.HasPrefix(e.Probe.Error, "vLLM answers 401: the guard has no valid API key")
	})
	d := statusDoc(t, s)
	if d.Guard.State != "starting" || !strings.HasPrefix(d.Guard.Reason, "vLLM answers 401: the guard has no valid API key") {
		t.Fatalf("status %s: %q", d.Guard.State, d.Guard.Reason)
	}
	if n := s.CountLogs(msgContains(`"GET /v1/models`)); n != 0 {
		t.Fatalf("%d access lines of the guard's own refused probes in its log", n)
	}
}

// Merged vLLM (the simulator's newest era, 0.32): a model adapted with
// --runner pooling --convert classify logs "Supported tasks: ['classify',
// 'token_classify']" and serves /classify but no completions; the auto
// probe asks /classify and the guard calls it ready.
func TestMergedVLLMConvertedClassifierReadyViaAuto(t *testing.T) {
	s := quick(newScene(t))
	s.env["FAKEVLLM_ERA"] = "v1"
	s.command = fmt.Sprintf("[%q, \"serve\", \"org/model\", \"--runner\", \"pooling\", \"--convert\", \"classify\"]", bins.fakevllm)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	d := statusDoc(t, s)
	if !strings.Contains(d.Guard.Probe, "/classify") || !strings.Contains(d.Guard.Probe, "classify") {
		t.Fatalf("probe in use: %q", d.Guard.Probe)
	}
}

// An embedding model (the simulator embeds for a name with "bge") has no
// completions: the auto probe asks its pooling endpoint, and status says so.
func TestEmbeddingModelReadyViaAuto(t *testing.T) {
	s := quick(newScene(t))
	s.command = fmt.Sprintf("[%q, \"serve\", \"BAAI/bge-small-en\"]", bins.fakevllm)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	d := statusDoc(t, s)
	if !strings.Contains(d.Guard.Probe, "/v1/embeddings") || !strings.Contains(d.Guard.Probe, "embed") {
		t.Fatalf("probe in use: %q", d.Guard.Probe)
	}
}

// Names: several --served-model-name values, and a --config YAML read
// relative to [vllm] workdir; a name /v1/models does not list is the reason.
func TestServedNamesFromEverySource(t *testing.T) {
	t.Run("several names", func(t *testing.T) {
		s := quick(newScene(t))
		s.command = fmt.Sprintf("[%q, \"serve\", \"org/model\", \"--served-model-name\", \"alpha\", \"beta\"]", bins.fakevllm)
		s.start()
		s.WaitEvent("ready", 1, 60*time.Second, isReady)
	})
	t.Run("yaml in workdir", func(t *testing.T) {
		s := quick(newScene(t))
		work := filepath.Join(s.dir, "work")
		os.MkdirAll(work, 0o755)
		os.WriteFile(filepath.Join(work, "serve.yaml"), []byte("model: org/from-yaml\nserved-model-name: [yaml-a, yaml-b]\n"), 0o644)
		s.command = fmt.Sprintf("[%q, \"serve\", \"--config\", \"serve.yaml\"]", bins.fakevllm)
		s.editConfig = func(text string) string {
			return strings.Replace(text, "[vllm]\n", fmt.Sprintf("[vllm]\nworkdir = %q\n", work), 1)
		}
		s.start()
		s.WaitEvent("ready", 1, 60*time.Second, isReady)
		out := guardCLI(t, "check", "--config", filepath.Join(s.dir, "vllm-guard.toml"))
		if !strings.Contains(out, `served names:   "yaml-a", "yaml-b"`) {
			t.Fatalf("check:\n%s", out)
		}
	})
	t.Run("a name vLLM does not list", func(t *testing.T) {
		s := quick(newScene(t))
		s.extra = "\n[readiness]\npoll_interval = \"50ms\"\n"
		s.editConfig = func(text string) string {
			return strings.Replace(text, "[vllm]\n", "[vllm]\nserved_model_name = \"not-served\"\n", 1)
		}
		s.start()
		s.WaitEvent("the names probe failing", 1, 60*time.Second, func(e events.Event) bool {
			return e.Kind == events.KindProbeFailed && strings.Contains(e.Probe.Error, "not the served name")
		})
		d := statusDoc(t, s)
		if !strings.Contains(d.Guard.Reason, `/v1/models lists ["test-model"], not the served name "not-served"`) {
			t.Fatalf("reason %q", d.Guard.Reason)
		}
	})
}

// --kv-cache-memory-bytes: after an OOM the next start has fewer bytes, by
// the utilization step's ratio (0.85 → 0.80), and the free-memory check
// and status use them.
func TestKVCacheBytesSteppedDownAfterOOM(t *testing.T) {
	s := quick(newScene(t))
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--kv-cache-memory-bytes\", \"20G\"]", bins.fakevllm)
	oneShot(s, "oom_on_start")
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitEvent("ready after the OOM", 1, 90*time.Second, isReady)
	var argvs [][]string
	var cause string
	for _, e := range s.Events() {
		switch e.Kind {
		case events.KindStarting:
			argvs = append(argvs, e.Argv)
		case events.KindExited:
			cause = string(e.Failure.Verdict.Cause)
		}
	}
	if len(argvs) != 2 || cause != "oom" {
		t.Fatalf("%d starts, cause %q", len(argvs), cause)
	}
	kv := func(argv []string) string {
		for i, a := range argv {
			if a == "--kv-cache-memory-bytes" && i+1 < len(argv) {
				return argv[i+1]
			}
		}
		return ""
	}
	// 20 GiB × 0.80/0.85 = 19275.3 MiB, floored to a MiB.
	if a, b := kv(argvs[0]), kv(argvs[1]); a != "21474836480" || b != fmt.Sprint(uint64(19275)<<20) {
		t.Fatalf("kv bytes %s then %s", a, b)
	}
	if d := statusDoc(t, s); d.Guard.Rung.KVCacheMemoryBytes != 19275<<20 {
		t.Fatalf("status rung %+v", d.Guard.Rung)
	}
}

// NCCL's own OOM line (the simulator's nccl_oom_on_start) is an OOM.
func TestNCCLOOMClassified(t *testing.T) {
	s := quick(newScene(t))
	oneShot(s, "nccl_oom_on_start")
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitEvent("ready after the OOM", 1, 90*time.Second, isReady)
	for _, e := range s.Events() {
		if e.Kind == events.KindExited {
			if c := e.Failure.Verdict.Cause; c != "oom" {
				t.Fatalf("NCCL OOM classified %q: %+v", c, e.Failure.Verdict)
			}
			if e.Failure.Decision.Rung.Index != 1 {
				t.Fatalf("not one rung down: %+v", e.Failure.Decision)
			}
			return
		}
	}
	t.Fatal("no exited event")
}

// A healthy, idle vLLM at 0.9 and at 0.95 utilization holds its budget
// and raises no memory alert over 60 samples (20 ms apart here: 60 s worth
// at the default 1 s).
func TestHealthyVLLMRaisesNoMemoryAlert(t *testing.T) {
	for _, util := range []string{"0.9", "0.95"} {
		t.Run(util, func(t *testing.T) {
			t.Parallel()
			s := quick(newScene(t))
			s.extra = fmt.Sprintf("\n[profile]\ngpu_memory_utilization = %s\n[gpu]\nsample_interval = \"20ms\"\n", util)
			s.start()
			s.WaitEvent("ready", 1, 60*time.Second, isReady)
			d := statusDoc(t, s)
			base := len(d.GPU.Devices[0].History)
			if !testkit.PollEvery(60*time.Second, 50*time.Millisecond, func() bool {
				d = statusDoc(t, s)
				return len(d.GPU.Devices[0].History) >= base+60
			}) {
				t.Fatalf("60 samples did not come in 60 s (%d)", len(d.GPU.Devices[0].History)-base)
			}
			dev := d.GPU.Devices[0]
			if dev.Fraction < dev.Budget-0.05 || dev.Budget < 0.89 {
				t.Fatalf("vLLM does not hold its budget: %+v", dev)
			}
			if len(d.Alerts) != 0 || s.CountEvents(kind(events.KindAlert)) != 0 {
				t.Fatalf("healthy vLLM at %s raised %+v (used %.3f, budget %.3f, warn at %.3f)", util, d.Alerts, dev.Fraction, dev.Budget, dev.WarnAt)
			}
		})
	}
}

// The guard's probes and scrapes leave no access line in its log; a
// client's request does.
func TestOwnAccessLinesDropped(t *testing.T) {
	s := quick(newScene(t))
	s.extra = "\n[gpu]\nsample_interval = \"50ms\"\n[liveness]\ninterval = \"100ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	if !testkit.PollEvery(60*time.Second, 50*time.Millisecond, func() bool { return statusDoc(t, s).VLLM.Scrapes >= 10 }) {
		t.Fatal("vLLM's /metrics was not scraped 10 times within 60 s")
	}
	body := []byte(`{"model": "test-model", "prompt": "hi", "max_tokens": 1}`)
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/completions", s.port), "application/json", bytes.NewReader(body))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("client request: %v %v", resp, err)
	}
	resp.Body.Close()
	s.WaitLog("the client's access line", 1, 10*time.Second, msgContains(`"POST /v1/completions HTTP/1.1" 200`))
	for _, own := range []string{`"GET /metrics`, `"GET /health`, `"GET /v1/models`} {
		if n := s.CountLogs(msgContains(own)); n != 0 {
			t.Errorf("%d access lines of the guard's own %s requests in its log", n, own)
		}
	}
}
