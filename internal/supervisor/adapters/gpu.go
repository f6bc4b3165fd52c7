package adapters

import (
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
)

// MonitorGPU adapts the NVML monitor to what the supervisor needs.
func MonitorGPU(m *gpumon.Monitor) GpuAdapter { return GpuAdapter{m} }

type GpuAdapter struct{ M *gpumon.Monitor }

func (g GpuAdapter) SetTree(tree func() []int)       { g.M.SetTree(tree) }
func (g GpuAdapter) SetLoading(loading bool)         { g.M.SetLoading(loading) }
func (g GpuAdapter) RecentFractions(n int) []float64 { return g.M.RecentFractions(n) }

func (g GpuAdapter) UsedBytes() []uint64 {
	snap := g.M.Snapshot()
	if !snap.Up {
		return nil
	}
	out := make([]uint64, len(snap.Devices))
	for i, d := range snap.Devices {
		out[i] = d.Used
	}
	return out
}

func (g GpuAdapter) Fullest() (used, total uint64, at time.Time, ok bool) {
	snap := g.M.Snapshot()
	best := -1.0
	for _, d := range snap.Devices {
		if d.Total > 0 && d.Fraction > best {
			best, used, total, at = d.Fraction, d.Used, d.Total, d.ReadAt
		}
	}
	return used, total, at, snap.Up && best >= 0
}

func (g GpuAdapter) Released(pids []int, baseline []uint64) (bool, []heart.Holder) {
	r := g.M.CheckReleased(pids, baseline)
	if r.Released {
		return true, nil
	}
	if len(r.Held) == 0 {
		// Device totals: memory is still above the level before the launch,
		// but NVML names no process.
		return false, []heart.Holder{{Bytes: r.HeldBytes, Command: r.Message}}
	}
	return false, Holders(r.Held)
}

func (g GpuAdapter) CheckFree(r policy.Rung) (bool, string, []heart.Holder) {
	fc := g.M.CheckFree(r.GPUMemoryUtilization, r.KVCacheMemoryBytes)
	return fc.OK, fc.Message, Holders(fc.Holders)
}

// SetBudget: with --kv-cache-memory-bytes vLLM ignores the utilization for
// its KV cache, so its budget is learned when it is ready.
func (g GpuAdapter) SetBudget(r policy.Rung) {
	if r.KVCacheMemoryBytes > 0 {
		g.M.SetBudget(0)
		return
	}
	g.M.SetBudget(r.GPUMemoryUtilization)
}

func (g GpuAdapter) CriticalFraction() float64 { return g.M.CriticalFraction() }

func Holders(ps []gpumon.Proc) []heart.Holder {
	out := make([]heart.Holder, 0, len(ps))
	for _, p := range ps {
		out = append(out, heart.Holder{PID: p.PID, Bytes: p.Used, Command: p.Command})
	}
	return out
}

// MonitorGPUHealth adapts the NVML monitor's health snapshot.
func MonitorGPUHealth(m *gpumon.Monitor) HealthAdapter { return HealthAdapter{m} }

type HealthAdapter struct{ M *gpumon.Monitor }

func (h HealthAdapter) GPUs(since time.Time, fresh bool) []cause.GPUDevice {
	hs := h.M.Health()
	if fresh {
		hs = h.M.HealthNow()
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
