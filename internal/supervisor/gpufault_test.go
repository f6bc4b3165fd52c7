package supervisor

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// fakeHealth is the GPUs' hardware state as a test sets it.
type fakeHealth struct {
	mu   sync.Mutex
	dev  cause.GPUDevice
	xids []struct {
		xid int
		at  time.Time
	}
}

func newFakeHealth() *fakeHealth {
	return &fakeHealth{dev: cause.GPUDevice{Index: 0, UUID: "GPU-0000", ECCKnown: true, RemapKnown: true}}
}

func (h *fakeHealth) GPUs(since time.Time, _ bool) []cause.GPUDevice {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.dev
	d.XIDs = nil
	for _, x := range h.xids {
		if !x.at.Before(since) {
			d.XIDs = append(d.XIDs, x.xid)
		}
	}
	return []cause.GPUDevice{d}
}

func (h *fakeHealth) xid(n int) {
	h.mu.Lock()
	h.xids = append(h.xids, struct {
		xid int
		at  time.Time
	}{n, time.Now()})
	h.mu.Unlock()
}

// startReadyWithHealth starts the machine with a fake hardware view, and
// waits until it is ready.
func (s *scenario) startReadyWithHealth() *fakeHealth {
	s.t.Helper()
	h := newFakeHealth()
	s.health = h
	s.startReady()
	return h
}

func (h *fakeHealth) set(f func(d *cause.GPUDevice)) { h.mu.Lock(); f(&h.dev); h.mu.Unlock() }

// TestMachineGPUFaultXID79: an XID 79 while ready ends the run (vLLM is
// killed, never restarted), the cause is gpu_fault with the GPU and the
// XID, and the guard exits with the GPU-fault code.
func TestMachineGPUFaultXID79(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		h := s.startReadyWithHealth()
		h.xid(79)
		s.advance(2 * time.Second) // the heartbeat sees it
		s.wantExited(exitcode.GPUFault, "the exit")
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseGPUFault || f.Verdict.GPU == nil || f.Verdict.GPU.XID != 79 || f.Decision.Action != policy.ActionGiveUp {
			t.Fatalf("failure %+v", f)
		}
		if s.l.n() != 1 || s.l.last().kills.Load() == 0 {
			t.Fatalf("%d launches, %d kills: want one launch, killed", s.l.n(), s.l.last().kills.Load())
		}
		if st := s.sup.Status(); st.State != StateFailed || !strings.Contains(st.Reason, "GPU 0") || !strings.Contains(st.Reason, "nvidia-smi -r -i 0") {
			t.Fatalf("status %s: %s", st.State, st.Reason)
		}
	})
}

// TestMachineGPUFaultStay: with on_gpu_fault = "stay" the guard stays up,
// failed, naming the GPU.
func TestMachineGPUFaultStay(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.GPU.OnGPUFault = "stay" }, func(t *testing.T, s *scenario) {
		h := s.startReadyWithHealth()
		h.xid(48)
		s.advance(2 * time.Second)
		s.wantState(StateFailed)
		if st := s.sup.Status(); !strings.Contains(st.Reason, "XID 48") || st.ExitCode != exitcode.GPUFault {
			t.Fatalf("status %+v", st)
		}
		s.wantLaunches(1, "vLLM launches")
		s.wantStopped(exitcode.OK, "stop")
	})
}

// TestMachineGPUFaultXID94: a contained ECC error ends the run and restarts
// it on the same rung; a second within the window gives up.
func TestMachineGPUFaultXID94(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		h := s.startReadyWithHealth()
		h.xid(94)
		s.advance(2 * time.Second)
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseGPUFault || f.Decision.Action != policy.ActionRestart || f.Decision.Rung.Index != 0 {
			t.Fatalf("first XID 94: %+v", f)
		}
		s.advance(s.cfg.GPU.SampleInterval.Duration + s.cfg.Restart.InitialDelay.Duration + time.Second)
		s.wantLaunches(2, "after an XID 94")
		s.ready()
		h.xid(94)
		s.advance(2 * time.Second)
		s.wantExited(exitcode.GPUFault, "second XID 94")
		s.wantLaunches(2, "vLLM launches")
	})
}

// TestMachineGPUPendingRemapBlocksStart: no start on a GPU with a row
// remap pending; waiting_gpu says why; a reset (the flag cleared) lets it
// start.
func TestMachineGPUPendingRemapBlocksStart(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		h := newFakeHealth()
		h.set(func(d *cause.GPUDevice) { d.RemapPending = true })
		s.health = h
		s.start()
		s.advance(5 * time.Second)
		s.wantState(StateWaitingGPU)
		if st := s.sup.Status(); !strings.Contains(st.Reason, "row remap pending") || !strings.Contains(st.Reason, "GPU 0") {
			t.Fatalf("reason %q", st.Reason)
		}
		s.wantLaunches(0, "on a GPU with a remap pending")
		h.set(func(d *cause.GPUDevice) { d.RemapPending = false })
		s.advance(2 * time.Second)
		s.wantLaunches(1, "after the reset")
		s.stop()
	})
}

// A process of vLLM's tree that no kill round ends, on a host whose GPUs
// NVML watches, is stuck in the driver: gpu_fault, needs a reset, no
// second start.
func TestMachineUnkillableProcessIsAGPUFault(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.health = newFakeHealth()
		s.startReady()
		p := s.l.last()
		p.survivors = []int{4244}
		p.stuckFor = 50 * time.Second
		p.unkillable = true
		p.end(exitInfo{Code: -1, Signal: "SIGKILL"})
		s.advance(51 * time.Second)
		s.wantExited(exitcode.GPUFault, "the exit")
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseGPUFault || f.Verdict.GPU == nil || !f.Verdict.GPU.Reset ||
			!strings.Contains(f.Verdict.GPU.Meaning, "4244") || s.l.n() != 1 {
			t.Fatalf("failure %+v (GPU %+v), %d launches", f, f.Verdict.GPU, s.l.n())
		}
	})
}
