package metrics

import (
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
)

// TestGPUHealthSeries: the hardware-health series follow the snapshot:
// XIDs counted per GPU and XID, ECC and remap gauges where reported,
// nothing where a driver does not report a feature.
func TestGPUHealthSeries(t *testing.T) {
	m, src := newMetrics()
	if body := scrape(t, m); strings.Contains(body, "vllm_guard_gpu_xid_total{") || strings.Contains(body, "vllm_guard_gpu_lost{") {
		t.Fatal("hardware series before any snapshot")
	}
	yes := true
	src.setHealth(gpumon.Health{Known: true, Devices: []gpumon.DeviceHealth{
		{Index: 0, UUID: "GPU-a", XIDCounts: map[uint64]uint64{79: 1, 13: 2},
			ECC:   &gpumon.ECCCounts{VolatileUncorrected: 2, AggregateUncorrected: 9},
			Remap: &gpumon.RemappedRows{Correctable: 1, Uncorrectable: 3, Pending: true}, RetiredPagesPending: &yes,
			ThrottleKnown: true, Throttle: []string{"hw_thermal"}},
		{Index: 1, UUID: "GPU-b", Lost: true},
	}})
	body := scrape(t, m)
	for _, want := range []string{
		`vllm_guard_gpu_xid_total{gpu="0",xid="79"} 1`, `vllm_guard_gpu_xid_total{gpu="0",xid="13"} 2`,
		`vllm_guard_gpu_ecc_uncorrected_errors{counter="volatile",gpu="0",uuid="GPU-a"} 2`,
		`vllm_guard_gpu_ecc_uncorrected_errors{counter="aggregate",gpu="0",uuid="GPU-a"} 9`,
		`vllm_guard_gpu_remapped_rows{gpu="0",kind="uncorrectable",uuid="GPU-a"} 3`,
		`vllm_guard_gpu_remap_pending{gpu="0",uuid="GPU-a"} 1`, `vllm_guard_gpu_remap_failure{gpu="0",uuid="GPU-a"} 0`,
		`vllm_guard_gpu_retired_pages_pending{gpu="0",uuid="GPU-a"} 1`,
		`vllm_guard_gpu_lost{gpu="0",uuid="GPU-a"} 0`,
		`vllm_guard_gpu_hw_throttle{gpu="0",reason="hw_thermal",uuid="GPU-a"} 1`, `vllm_guard_gpu_hw_throttle{gpu="0",reason="hw_slowdown",uuid="GPU-a"} 0`, `vllm_guard_gpu_lost{gpu="1",uuid="GPU-b"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if strings.Contains(body, `vllm_guard_gpu_ecc_uncorrected_errors{counter="volatile",gpu="1"`) || strings.Contains(body, `vllm_guard_gpu_remap_pending{gpu="1"`) {
		t.Error("GPU 1 reports no ECC or remap, yet has series")
	}
}
