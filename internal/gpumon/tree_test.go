package gpumon

import (
	"os"
	"sync/atomic"
	"testing"
)

// A process that joins the tree between the tree's read and NVML's (vLLM's
// EngineCore, started while the guard samples) is ours in that very
// sample, not a neighbour's until the next one (issue 24 item 11): NVML
// lists a pid the host can see and the tree did not name, so the monitor
// asks the tree again.
func TestProcessStartedDuringASampleIsOurs(t *testing.T) {
	f := newFake(t, twoGPUs)
	engine := sleeper(t)
	self := os.Getpid()
	f.hold(self, 0, GiB)
	f.hold(engine.Process.Pid, 0, 40*GiB)

	m := New(f.nvml(), Options{}, nil)
	var calls atomic.Int32
	m.SetTree(func() []int {
		if calls.Add(1) == 1 {
			return []int{self} // read before the engine started
		}
		return []int{self, engine.Process.Pid}
	})
	mustOpen(t, m)
	m.tick()
	procs := m.Snapshot().Devices[0].Processes
	if len(procs) != 2 {
		t.Fatalf("GPU 0 processes: %+v", procs)
	}
	for _, p := range procs {
		if !p.Ours {
			t.Errorf("pid %d (%s) is not ours after one sample: the tree names it once asked again", p.PID, p.Command)
		}
	}
	if s := m.Snapshot(); s.Attribution != "pid" {
		t.Errorf("attribution %q, want pid", s.Attribution)
	}
}
