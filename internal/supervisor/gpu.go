package supervisor

import (
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// MonitorGPU adapts the NVML monitor to what the supervisor needs.
func MonitorGPU(m *gpumon.Monitor) GPU { return monitorGPU{m} }

type monitorGPU struct{ m *gpumon.Monitor }

func (g monitorGPU) SetTree(tree func() []int)       { g.m.SetTree(tree) }
func (g monitorGPU) SetLoading(loading bool)         { g.m.SetLoading(loading) }
func (g monitorGPU) RecentFractions(n int) []float64 { return g.m.RecentFractions(n) }

func (g monitorGPU) UsedBytes() []uint64 {
	snap := g.m.Snapshot()
	if !snap.Up {
		return nil
	}
	out := make([]uint64, len(snap.Devices))
	for i, d := range snap.Devices {
		out[i] = d.Used
	}
	return out
}

func (g monitorGPU) Fullest() (used, total uint64, at time.Time, ok bool) {
	snap := g.m.Snapshot()
	best := -1.0
	for _, d := range snap.Devices {
		if d.Total > 0 && d.Fraction > best {
			best, used, total, at = d.Fraction, d.Used, d.Total, d.ReadAt
		}
	}
	return used, total, at, snap.Up && best >= 0
}

func (g monitorGPU) Released(pids []int, baseline []uint64) (bool, []Holder) {
	r := g.m.CheckReleased(pids, baseline)
	if r.Released {
		return true, nil
	}
	if len(r.Held) == 0 {
		// Device totals: memory is still above the level before the launch,
		// but NVML names no process.
		return false, []Holder{{Bytes: r.HeldBytes, Command: r.Message}}
	}
	return false, holders(r.Held)
}

func (g monitorGPU) CheckFree(r policy.Rung) (bool, string, []Holder) {
	fc := g.m.CheckFree(r.GPUMemoryUtilization, r.KVCacheMemoryBytes)
	return fc.OK, fc.Message, holders(fc.Holders)
}

// SetBudget: with --kv-cache-memory-bytes vLLM ignores the utilization for
// its KV cache, so its budget is learned when it is ready.
func (g monitorGPU) SetBudget(r policy.Rung) {
	if r.KVCacheMemoryBytes > 0 {
		g.m.SetBudget(0)
		return
	}
	g.m.SetBudget(r.GPUMemoryUtilization)
}

func (g monitorGPU) CriticalFraction() float64 { return g.m.CriticalFraction() }

func holders(ps []gpumon.Proc) []Holder {
	out := make([]Holder, 0, len(ps))
	for _, p := range ps {
		out = append(out, Holder{PID: p.PID, Bytes: p.Used, Command: p.Command})
	}
	return out
}

// MonitorGPUHealth adapts the NVML monitor's health snapshot.
func MonitorGPUHealth(m *gpumon.Monitor) GPUHealth { return monitorHealth{m} }

type monitorHealth struct{ m *gpumon.Monitor }

func (h monitorHealth) GPUs(since time.Time, fresh bool) []cause.GPUDevice {
	hs := h.m.Health()
	if fresh {
		hs = h.m.HealthNow()
	}
	if !hs.Known || len(hs.Devices) == 0 {
		return nil
	}
	out := make([]cause.GPUDevice, 0, len(hs.Devices))
	for _, d := range hs.Devices {
		g := cause.GPUDevice{Index: d.Index, UUID: d.UUID, Lost: d.Lost, ResetRequired: d.ResetRequired}
		for _, x := range d.XIDs {
			if !x.At.Before(since) {
				g.XIDs = append(g.XIDs, int(x.XID))
			}
		}
		if d.ECC != nil {
			g.ECCKnown, g.ECCVolatile = true, d.ECC.VolatileUncorrected
		}
		if d.Remap != nil {
			g.RemapKnown, g.RemapPending, g.RemapFailure = true, d.Remap.Pending, d.Remap.Failure
		}
		if d.RetiredPagesPending != nil {
			g.RetiredKnown, g.RetiredPend = true, *d.RetiredPagesPending
		}
		out = append(out, g)
	}
	return out
}
