package metrics

import (
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

// GPUSource is what the GPU series are read from at scrape time:
// gpumon.Monitor. Both methods return a copy of the monitor's last sample
// under its state lock (never an NVML call), so a scrape costs a copy.
type GPUSource interface {
	Snapshot() gpumon.Snapshot
	Health() gpumon.Health
}

// VLLMSource is what vLLM's gauges are read from at scrape time:
// vllmstats.Scraper, whose Latest is its last scrape, a value.
type VLLMSource interface {
	Latest() vllmstats.Stats
}

// Sources are the samplers the scrape-time series come from. Either may be
// nil: its series then read as down (nvml_up 0, vllm_metrics_up 0, the
// rest absent).
type Sources struct {
	GPU  GPUSource
	VLLM VLLMSource
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(Namespace+"_"+name, help, labels, nil)
}

var (
	descNVMLUp      = desc("nvml_up", "1 when the last NVML sample succeeded, else 0 (the gpu_* series are then absent).")
	descGPUUsed     = desc("gpu_memory_used_bytes", "GPU memory in use (everything not free), per watched GPU.", "gpu", "uuid")
	descGPUTotal    = desc("gpu_memory_total_bytes", "GPU memory in total, per watched GPU.", "gpu", "uuid")
	descGPURatio    = desc("gpu_memory_used_ratio", "GPU memory used / total, per watched GPU.", "gpu")
	descGPUCritical = desc("gpu_seconds_to_critical", "Seconds until the memory trend reaches the critical threshold; absent while memory is not climbing (see gpu_climbing).", "gpu")
	descGPUClimbing = desc("gpu_climbing", "1 while the GPU's memory trend is climbing (gpu_seconds_to_critical then exists), else 0.", "gpu")
	descGPUBudget   = desc("gpu_memory_budget_ratio", "What vLLM holds by design, as used/total: its gpu_memory_utilization, or what it held once loaded when that is more (0 until known).", "gpu")
	descGPUWarnAt   = desc("gpu_memory_warn_threshold_ratio", "used/total at which gpu_memory_warn is raised: the budget plus [gpu] warn_over_budget (or the fixed warn_fraction).", "gpu")
	descGPUCritAt   = desc("gpu_memory_critical_threshold_ratio", "used/total at which gpu_memory_critical is raised: the budget plus [gpu] critical_over_budget (or the fixed critical_fraction).", "gpu")

	descVLLMUp      = desc("vllm_metrics_up", "1 when the last scrape of vLLM's /metrics succeeded, else 0 (vLLM not ready, or its /metrics unreadable: the vllm_requests_* and vllm_kv_cache_usage_ratio series are then absent).")
	descVLLMRunning = desc("vllm_requests_running", "Requests vLLM is running (vllm:num_requests_running); absent while vllm_metrics_up is 0.")
	descVLLMWaiting = desc("vllm_requests_waiting", "Requests waiting in vLLM's queue (vllm:num_requests_waiting); absent while vllm_metrics_up is 0.")
	descVLLMKV      = desc("vllm_kv_cache_usage_ratio", "vLLM's KV cache usage, 0..1 (vllm:kv_cache_usage_perc, formerly gpu_cache_usage_perc); absent while vllm_metrics_up is 0.")
)

// sourceCollector builds the GPU, GPU-health and vLLM series from the
// sources' latest snapshots each time /metrics is scraped (node_exporter's
// way): nothing copies them between scrapes, so a scrape is never a sample
// behind, and a device or reading that is gone has no series to delete.
type sourceCollector struct{ src Sources }

func (c sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNVMLUp, descGPUUsed, descGPUTotal, descGPURatio, descGPUCritical,
		descGPUClimbing, descGPUBudget, descGPUWarnAt, descGPUCritAt,
		descVLLMUp, descVLLMRunning, descVLLMWaiting, descVLLMKV} {
		ch <- d
	}
	describeHealth(ch)
}

func (c sourceCollector) Collect(ch chan<- prometheus.Metric) {
	var s gpumon.Snapshot
	var h gpumon.Health
	if c.src.GPU != nil {
		s, h = c.src.GPU.Snapshot(), c.src.GPU.Health()
	}
	collectGPU(ch, s)
	collectHealth(ch, h)
	var v vllmstats.Stats
	if c.src.VLLM != nil {
		v = c.src.VLLM.Latest()
	}
	collectVLLM(ch, v)
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// collectGPU exports the monitor's snapshot: the watched devices while
// NVML answers, none when it does not, so no dashboard plots stale memory
// as if it were current.
func collectGPU(ch chan<- prometheus.Metric, s gpumon.Snapshot) {
	ch <- gauge(descNVMLUp, b2f(s.Up))
	if !s.Up {
		return
	}
	for _, d := range s.Devices {
		gpu := strconv.Itoa(d.Index)
		ch <- gauge(descGPUUsed, float64(d.Used), gpu, d.UUID)
		ch <- gauge(descGPUTotal, float64(d.Total), gpu, d.UUID)
		ch <- gauge(descGPURatio, finite(d.Fraction, 0), gpu)
		// Seconds to critical exist only while memory climbs; a climb
		// already past critical reads 0.
		stc := d.SecondsToCritical
		climbing := d.Trend == gpumon.TrendClimbing && stc >= 0 && !math.IsNaN(stc) && !math.IsInf(stc, 0)
		ch <- gauge(descGPUClimbing, b2f(climbing), gpu)
		if climbing {
			ch <- gauge(descGPUCritical, stc, gpu)
		}
		ch <- gauge(descGPUBudget, finite(d.Budget, 0), gpu)
		ch <- gauge(descGPUWarnAt, finite(d.WarnAt, 0), gpu)
		ch <- gauge(descGPUCritAt, finite(d.CriticalAt, 0), gpu)
	}
}

// collectVLLM exports the last scrape of vLLM's /metrics. While it is not
// up (vLLM loading, down, or its /metrics unreadable) the three gauges are
// absent: a 0 would read as an idle vLLM. A value that is not a number is
// absent too.
func collectVLLM(ch chan<- prometheus.Metric, v vllmstats.Stats) {
	ch <- gauge(descVLLMUp, b2f(v.Up))
	if !v.Up {
		return
	}
	for _, g := range []struct {
		d *prometheus.Desc
		v float64
	}{{descVLLMRunning, v.Running}, {descVLLMWaiting, v.Waiting}, {descVLLMKV, v.KVUsage}} {
		if !math.IsNaN(g.v) && !math.IsInf(g.v, 0) {
			ch <- gauge(g.d, g.v)
		}
	}
}
