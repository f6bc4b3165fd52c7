package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

// GPU faults through the stand-in NVML (issue 33): the real guard binary
// over the simulator, the GPU's word written to the stand-in's state
// (DIR/events for XIDs, DIR/health for counters and states).

// xid appends an XID event for GPU dev, as the driver delivers one.
func (s *scene) xid(dev, n int) {
	s.t.Helper()
	f, err := os.OpenFile(filepath.Join(s.gpuDir, "events"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%d xid %d\n", dev, n); err != nil {
		s.t.Fatal(err)
	}
}

// health replaces the stand-in's health file atomically.
func (s *scene) health(lines ...string) {
	s.t.Helper()
	p := filepath.Join(s.gpuDir, "health")
	if err := os.WriteFile(p+".tmp", []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		s.t.Fatal(err)
	}
}

// An XID 79 (GPU fallen off the bus) on GPU 0 while vLLM serves: the guard
// kills vLLM, classifies gpu_fault, never starts it again, raises the
// gpu_fault alert naming GPU 0 and XID 79, and exits with its GPU-fault code.
func TestGPUFaultXID79WhileReadyExits(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	alerts := filepath.Join(s.dir, "alerts.jsonl")
	s.extra = fmt.Sprintf("\n[gpu]\nsample_interval = \"100ms\"\n[alerts]\ncommand = [\"sh\", \"-c\", \"cat >> %s; echo >> %s\"]\n", alerts, alerts)
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	s.xid(0, 79)
	if code := s.WaitExit(60 * time.Second); code != exitcode.GPUFault {
		t.Fatalf("guard exit code %d, want %d (GPU fault)", code, exitcode.GPUFault)
	}
	ex := s.WaitEvent("the failure", 1, time.Second, exitedWith("gpu_fault"))
	v := ex.Failure.Verdict
	if v.GPU == nil || v.GPU.Device != 0 || v.GPU.XID != 79 || !v.GPU.Reset || v.GPU.UUID != "GPU-5e1f0000-0000-4000-8000-000000000001" {
		t.Fatalf("verdict %+v gpu %+v", v, v.GPU)
	}
	if ex.Failure.Decision.ExitCode != exitcode.GPUFault || !strings.Contains(ex.Failure.Decision.Reason, "nvidia-smi -r -i 0") {
		t.Fatalf("decision %+v", ex.Failure.Decision)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d starts: vLLM was started again on a GPU that fell off the bus", n)
	}
	data, _ := os.ReadFile(alerts)
	var gpuAlert string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, `"alert":"gpu_fault"`) {
			gpuAlert = l
		}
	}
	for _, want := range []string{`"gpu":0`, "GPU 0", "XID 79", "nvidia-smi -r -i 0"} {
		if !strings.Contains(gpuAlert, want) {
			t.Errorf("gpu_fault alert %q lacks %q (all alerts: %s)", gpuAlert, want, data)
		}
	}
	s.waitNoProcesses(10 * time.Second)
}

// With on_gpu_fault = "stay" the guard stays up in failed, saying which GPU
// and what to do; nothing is started again.
func TestGPUFaultStayFailed(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.extra = "\n[gpu]\nsample_interval = \"100ms\"\non_gpu_fault = \"stay\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	s.xid(0, 79)
	f := s.WaitEvent("failed", 1, 60*time.Second, inState("failed"))
	if !strings.Contains(f.Reason, "GPU 0") || !strings.Contains(f.Reason, "XID 79") || !strings.Contains(f.Reason, "nvidia-smi -r -i 0") {
		t.Fatalf("failed reason %q", f.Reason)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d starts", n)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// An XID 94 (contained ECC error): the driver stopped the contexts on the
// GPU, the GPU serves on: one restart, on the same rung.
func TestGPUFaultXID94RestartsOnTheSameRung(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.extra = "\n[gpu]\nsample_interval = \"100ms\"\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	s.xid(0, 94)
	s.WaitEvent("ready again", 2, 60*time.Second, isReady)
	ex := s.WaitEvent("the failure", 1, time.Second, exitedWith("gpu_fault"))
	d := ex.Failure.Decision
	if d.Action != "restart" || d.Rung.Index != 0 || ex.Failure.Verdict.GPU == nil || ex.Failure.Verdict.GPU.XID != 94 {
		t.Fatalf("failure %+v", ex.Failure)
	}
	if n, m := s.CountEvents(isExited), s.CountEvents(isStarting); n != 1 || m != 2 {
		t.Fatalf("%d failures, %d starts; want 1 and 2", n, m)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// GPU 0 already lost when the guard starts (after an XID 79 and exit 69 the
// guard is started again: Kubernetes restarts the container): NVML cannot
// list it, and vLLM is not started on it; waiting_gpu says so; once the
// GPU is back (reset) it starts.
func TestGPUFaultLostAtStartBlocksStart(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.health("0 lost 1")
	s.extra = "\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	w := s.WaitEvent("waiting for the GPU", 1, 30*time.Second, func(e events.Event) bool {
		return inState("waiting_gpu")(e) && strings.Contains(e.Reason, "GPU 0 is lost")
	})
	if !strings.Contains(w.Reason, "nvidia-smi -r -i 0") {
		t.Fatalf("reason %q", w.Reason)
	}
	if n := s.CountEvents(isStarting); n != 0 {
		t.Fatalf("vLLM started on a lost GPU")
	}
	s.health("0 lost 0")
	s.WaitEvent("ready after the reset", 1, 30*time.Second, isReady)
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// A row remap pending on GPU 0 at start: vLLM is not started; waiting_gpu
// says why; after the reset (the state cleared) it starts.
func TestGPUFaultPendingRemapBlocksStart(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.health("0 remap_unc 2", "0 remap_pending 1")
	s.extra = "\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	w := s.WaitEvent("waiting for the GPU", 1, 30*time.Second, func(e events.Event) bool {
		return inState("waiting_gpu")(e) && strings.Contains(e.Reason, "row remap pending")
	})
	if !strings.Contains(w.Reason, "GPU 0") || !strings.Contains(w.Reason, "nvidia-smi -r -i 0") {
		t.Fatalf("reason %q", w.Reason)
	}
	if n := s.CountEvents(isStarting); n != 0 {
		t.Fatalf("vLLM started on a GPU with a row remap pending")
	}
	s.health("0 remap_unc 2", "0 remap_pending 0")
	s.WaitEvent("ready after the reset", 1, 30*time.Second, isReady)
	s.stopCleanly(30*time.Second, 10*time.Second)
}
