package metrics

import (
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

// The GPU monitor and vLLM's scraper are the sources the guard wires in.
var (
	_ GPUSource  = (*gpumon.Monitor)(nil)
	_ VLLMSource = (*vllmstats.Scraper)(nil)
)

// TestScrapeReadsTheSourcesNow: the samplers' readings change between two
// scrapes and nothing else happens (no ticker, no Set call): the second
// scrape shows the new readings, GPU, hardware health and vLLM alike.
func TestScrapeReadsTheSourcesNow(t *testing.T) {
	m, src := newMetrics()
	src.setGPU(gpu(0.25, -1))
	src.setVLLM(3, 1, 0.5, true)
	src.setHealth(gpumon.Health{Known: true, Devices: []gpumon.DeviceHealth{{Index: 0, UUID: "GPU-a"}}})
	body := scrape(t, m)
	for _, want := range []string{`vllm_guard_gpu_memory_used_ratio{gpu="0"} 0.25`, `vllm_guard_gpu_climbing{gpu="0"} 0`,
		"vllm_guard_vllm_requests_running 3", "vllm_guard_vllm_kv_cache_usage_ratio 0.5",
		`vllm_guard_gpu_lost{gpu="0",uuid="GPU-a"} 0`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("first scrape lacks %q:\n%s", want, ours(body))
		}
	}

	src.setGPU(gpu(0.75, 30))
	src.setVLLM(7, 4, 0.875, true)
	src.setHealth(gpumon.Health{Known: true, Devices: []gpumon.DeviceHealth{{Index: 0, UUID: "GPU-a", Lost: true}}})
	body = scrape(t, m)
	for _, want := range []string{`vllm_guard_gpu_memory_used_ratio{gpu="0"} 0.75`, `vllm_guard_gpu_climbing{gpu="0"} 1`,
		`vllm_guard_gpu_seconds_to_critical{gpu="0"} 30`,
		"vllm_guard_vllm_requests_running 7", "vllm_guard_vllm_requests_waiting 4", "vllm_guard_vllm_kv_cache_usage_ratio 0.875",
		`vllm_guard_gpu_lost{gpu="0",uuid="GPU-a"} 1`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("second scrape lacks %q (a scrape must read the sources' latest snapshot):\n%s", want, ours(body))
		}
	}
}

// TestNVMLUnavailableGPUSeriesAbsent: a monitor that says NVML is
// unavailable (no driver, no cgo) gives nvml_up 0 and no GPU memory
// series, not zeros; a guard wired with no sources reads the same, and
// vLLM's gauges are absent with vllm_metrics_up 0.
func TestNVMLUnavailableGPUSeriesAbsent(t *testing.T) {
	down := gpumon.Snapshot{Up: false, Reason: "GPU metrics unavailable: NVML not found",
		// A device left over from an earlier sample must not show.
		Devices: gpu(0.5, 10).Devices}
	m, src := newMetrics()
	src.setGPU(down)
	for name, body := range map[string]string{"NVML down": scrape(t, m), "no sources": scrape(t, New(Sources{}))} {
		if !strings.Contains(body, "vllm_guard_nvml_up 0\n") || !strings.Contains(body, "vllm_guard_vllm_metrics_up 0\n") {
			t.Errorf("%s: want nvml_up 0 and vllm_metrics_up 0:\n%s", name, ours(body))
		}
		for _, fam := range []string{"gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_memory_used_ratio", "gpu_seconds_to_critical",
			"gpu_climbing", "gpu_memory_budget_ratio", "gpu_memory_warn_threshold_ratio", "gpu_memory_critical_threshold_ratio",
			"vllm_requests_running", "vllm_requests_waiting", "vllm_kv_cache_usage_ratio"} {
			if strings.Contains(body, "\n"+Namespace+"_"+fam+"{") || strings.Contains(body, "\n"+Namespace+"_"+fam+" ") {
				t.Errorf("%s: %s_%s is exported:\n%s", name, Namespace, fam, ours(body))
			}
		}
	}
}
