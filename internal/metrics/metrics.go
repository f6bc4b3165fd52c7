// Package metrics owns the guard's Prometheus series: a private
// registry, prefix vllm_guard_, with the supervisor's state, starts and exits
// by cause, time to ready, the profile rung in force, GPU memory from the
// monitor, vLLM's own queue and KV cache gauges, and the alerts. Other
// packages (the proxy) register their series on Registry().
//
// Every labelled series whose label values are known up front (state,
// cause, alert) is created at 0, so a rate() or an absent() in a rule works
// from the first scrape of a fresh guard.
//
// No sentinel values: a reading that does not exist is an absent series,
// never a -1 or a 0 that a rule would compare (gpu_seconds_to_critical
// exists only while memory climbs, gpu_climbing says whether it does;
// vLLM's gauges exist only while the guard reads vLLM's /metrics). There is
// one OOM counter, exits_total{cause="oom"}.
package metrics

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vllm-guard/vllm-guard/internal/buildinfo"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Namespace is the prefix of every series the guard exports.
const Namespace = "vllm_guard"

// AlertNames are every alert, in the order the series are created.
var AlertNames = []string{"gpu_memory_warn", "gpu_memory_critical", "oom_predicted", "oom", "gave_up", "gpu_fault"}

// TimeToReadyBuckets span a small model on a fast disk (1 s) to a large one
// pulled from a hub and compiled (1 h).
var TimeToReadyBuckets = []float64{1, 2, 5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1800, 3600}

// Metrics holds the guard's series. Its methods are safe from any goroutine.
type Metrics struct {
	reg *prometheus.Registry

	state       *prometheus.GaugeVec
	ready       prometheus.Gauge
	starts      prometheus.Counter
	exits       *prometheus.CounterVec
	timeToReady prometheus.Histogram

	rung        prometheus.Gauge
	maxNumSeqs  prometheus.Gauge
	utilization prometheus.Gauge

	nvmlUp      prometheus.Gauge
	gpuUsed     *prometheus.GaugeVec
	gpuTotal    *prometheus.GaugeVec
	gpuRatio    *prometheus.GaugeVec
	gpuCritical *prometheus.GaugeVec
	gpuClimbing *prometheus.GaugeVec
	gpuBudget   *prometheus.GaugeVec
	gpuWarnAt   *prometheus.GaugeVec
	gpuCritAt   *prometheus.GaugeVec
	kvBytes     prometheus.Gauge

	vllmUp prometheus.Gauge
	// No labels: a vec only so the series can be absent (Reset) while
	// vLLM is not read.
	vllmRunning *prometheus.GaugeVec
	vllmWaiting *prometheus.GaugeVec
	vllmKV      *prometheus.GaugeVec

	alertActive *prometheus.GaugeVec

	mu      sync.Mutex
	gpuSeen map[[2]string]bool // {gpu, uuid} label pairs exported by the last SetGPU

	health *healthCollector // the GPUs' hardware health (gpuhealth.go)
}

// New makes the series and registers them, with the Go runtime and process
// collectors, on a private registry (so nothing a library registers on the
// default one leaks into the guard's /metrics).
func New() *Metrics {
	reg := prometheus.NewRegistry()
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
	}
	gv := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	m := &Metrics{
		reg:   reg,
		state: gv("state", "1 for the supervisor's current state, 0 for the others.", "state"),
		ready: g("ready", "1 while vLLM is ready (loaded and answering), else 0."),
		starts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "starts_total",
			Help: "Launches of vLLM."}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "exits_total",
			Help: "Deaths of vLLM the guard did not ask for, by classified cause."}, []string{"cause"}),
		timeToReady: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "time_to_ready_seconds",
			Help: "Time from launch to the first successful readiness probe.", Buckets: TimeToReadyBuckets}),
		rung:        g("profile_rung", "Rung of the degrade ladder in force (0 = [profile] as written)."),
		maxNumSeqs:  g("profile_max_num_seqs", "--max-num-seqs of the rung in force."),
		utilization: g("profile_gpu_memory_utilization", "--gpu-memory-utilization of the rung in force."),
		nvmlUp:      g("nvml_up", "1 when the last NVML sample succeeded, else 0 (the gpu_* series are then absent)."),
		gpuUsed:     gv("gpu_memory_used_bytes", "GPU memory in use (everything not free), per watched GPU.", "gpu", "uuid"),
		gpuTotal:    gv("gpu_memory_total_bytes", "GPU memory in total, per watched GPU.", "gpu", "uuid"),
		gpuRatio:    gv("gpu_memory_used_ratio", "GPU memory used / total, per watched GPU.", "gpu"),
		gpuCritical: gv("gpu_seconds_to_critical", "Seconds until the memory trend reaches the critical threshold; absent while memory is not climbing (see gpu_climbing).", "gpu"),
		gpuClimbing: gv("gpu_climbing", "1 while the GPU's memory trend is climbing (gpu_seconds_to_critical then exists), else 0.", "gpu"),
		gpuBudget:   gv("gpu_memory_budget_ratio", "What vLLM holds by design, as used/total: its gpu_memory_utilization, or what it held once loaded when that is more (0 until known).", "gpu"),
		gpuWarnAt:   gv("gpu_memory_warn_threshold_ratio", "used/total at which gpu_memory_warn is raised: the budget plus [gpu] warn_over_budget (or the fixed warn_fraction).", "gpu"),
		gpuCritAt:   gv("gpu_memory_critical_threshold_ratio", "used/total at which gpu_memory_critical is raised: the budget plus [gpu] critical_over_budget (or the fixed critical_fraction).", "gpu"),
		kvBytes:     g("profile_kv_cache_memory_bytes", "--kv-cache-memory-bytes of the rung in force; 0 when vLLM sizes its KV cache from gpu_memory_utilization."),
		vllmUp:      g("vllm_metrics_up", "1 when the last scrape of vLLM's /metrics succeeded, else 0 (vLLM not ready, or its /metrics unreadable: the vllm_requests_* and vllm_kv_cache_usage_ratio series are then absent)."),
		vllmRunning: gv("vllm_requests_running", "Requests vLLM is running (vllm:num_requests_running); absent while vllm_metrics_up is 0."),
		vllmWaiting: gv("vllm_requests_waiting", "Requests waiting in vLLM's queue (vllm:num_requests_waiting); absent while vllm_metrics_up is 0."),
		vllmKV:      gv("vllm_kv_cache_usage_ratio", "vLLM's KV cache usage, 0..1 (vllm:kv_cache_usage_perc, formerly gpu_cache_usage_perc); absent while vllm_metrics_up is 0."),
		alertActive: gv("alert_active", "1 while the alert is in force: a memory episode until it clears, oom until vLLM is ready again, gave_up once the guard gave up.", "alert"),
		gpuSeen:     map[[2]string]bool{},
		health:      &healthCollector{},
	}
	bi := buildinfo.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "build_info",
		Help:        "Always 1; the labels say which build of vllm-guard this is.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion}})
	build.Set(1)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build,
		m.state, m.ready, m.starts, m.exits, m.timeToReady,
		m.rung, m.maxNumSeqs, m.utilization,
		m.nvmlUp, m.gpuUsed, m.gpuTotal, m.gpuRatio, m.gpuCritical, m.gpuClimbing, m.gpuBudget, m.gpuWarnAt, m.gpuCritAt, m.kvBytes,
		m.vllmUp, m.vllmRunning, m.vllmWaiting, m.vllmKV,
		m.alertActive,
		m.health,
	)
	for _, s := range status.States {
		m.state.WithLabelValues(string(s))
	}
	for _, c := range policy.Causes {
		m.exits.WithLabelValues(string(c))
	}
	for _, a := range AlertNames {
		m.alertActive.WithLabelValues(a)
	}
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, ErrorHandling: promhttp.ContinueOnError})
}

// Registry is where other packages register their series (the proxy's
// proxy_* ones); use the Namespace prefix.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SetState sets state{state} one-hot and ready.
func (m *Metrics) SetState(s status.State) {
	for _, x := range status.States {
		m.state.WithLabelValues(string(x)).Set(b2f(x == s))
	}
	m.ready.Set(b2f(s == status.StateReady))
}

// Started counts a launch.
func (m *Metrics) Started() { m.starts.Inc() }

// Ready records a launch's time to ready.
func (m *Metrics) Ready(ttr time.Duration) { m.timeToReady.Observe(ttr.Seconds()) }

// Exited counts a death by its cause.
func (m *Metrics) Exited(c policy.Cause) {
	m.exits.WithLabelValues(string(c)).Inc()
}

// SetProfile exports the rung in force.
func (m *Metrics) SetProfile(r policy.Rung) {
	m.rung.Set(float64(r.Index))
	m.maxNumSeqs.Set(float64(r.MaxNumSeqs))
	m.utilization.Set(r.GPUMemoryUtilization)
	m.kvBytes.Set(float64(r.KVCacheMemoryBytes))
}

// SetGPU exports the monitor's snapshot. A device that left the snapshot
// loses its series; when NVML is down the last readings are dropped too,
// so no dashboard plots stale memory as if it were current.
func (m *Metrics) SetGPU(s gpumon.Snapshot) {
	m.nvmlUp.Set(b2f(s.Up))
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[[2]string]bool{}
	if s.Up {
		for _, d := range s.Devices {
			gpu := strconv.Itoa(d.Index)
			seen[[2]string{gpu, d.UUID}] = true
			m.gpuUsed.WithLabelValues(gpu, d.UUID).Set(float64(d.Used))
			m.gpuTotal.WithLabelValues(gpu, d.UUID).Set(float64(d.Total))
			m.gpuRatio.WithLabelValues(gpu).Set(finite(d.Fraction, 0))
			// Seconds to critical exist only while memory climbs; a
			// climb already past critical reads 0.
			stc := d.SecondsToCritical
			climbing := d.Trend == gpumon.TrendClimbing && stc >= 0 && !math.IsNaN(stc) && !math.IsInf(stc, 0)
			m.gpuClimbing.WithLabelValues(gpu).Set(b2f(climbing))
			if climbing {
				m.gpuCritical.WithLabelValues(gpu).Set(stc)
			} else {
				m.gpuCritical.DeleteLabelValues(gpu)
			}
			m.gpuBudget.WithLabelValues(gpu).Set(finite(d.Budget, 0))
			m.gpuWarnAt.WithLabelValues(gpu).Set(finite(d.WarnAt, 0))
			m.gpuCritAt.WithLabelValues(gpu).Set(finite(d.CriticalAt, 0))
		}
	}
	for k := range m.gpuSeen {
		if seen[k] {
			continue
		}
		m.gpuUsed.DeleteLabelValues(k[0], k[1])
		m.gpuTotal.DeleteLabelValues(k[0], k[1])
		if !gpuIndexIn(seen, k[0]) {
			m.gpuRatio.DeleteLabelValues(k[0])
			m.gpuCritical.DeleteLabelValues(k[0])
			m.gpuClimbing.DeleteLabelValues(k[0])
			m.gpuBudget.DeleteLabelValues(k[0])
			m.gpuWarnAt.DeleteLabelValues(k[0])
			m.gpuCritAt.DeleteLabelValues(k[0])
		}
	}
	m.gpuSeen = seen
}

func gpuIndexIn(seen map[[2]string]bool, gpu string) bool {
	for k := range seen {
		if k[0] == gpu {
			return true
		}
	}
	return false
}

// SetVLLM exports what the guard scraped from vLLM's /metrics. When up is
// false (vLLM loading, down, or its /metrics unreadable) the three gauges
// are absent: a 0 would read as an idle vLLM. A value that is not a
// number is absent too.
func (m *Metrics) SetVLLM(running, waiting, kvUsage float64, up bool) {
	m.vllmUp.Set(b2f(up))
	for _, g := range []struct {
		vec *prometheus.GaugeVec
		v   float64
	}{{m.vllmRunning, running}, {m.vllmWaiting, waiting}, {m.vllmKV, kvUsage}} {
		if !up || math.IsNaN(g.v) || math.IsInf(g.v, 0) {
			g.vec.Reset()
			continue
		}
		g.vec.WithLabelValues().Set(g.v)
	}
}

// SetAlert sets alert_active{alert}.
func (m *Metrics) SetAlert(name string, active bool) {
	m.alertActive.WithLabelValues(name).Set(b2f(active))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func finite(v, fallback float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fallback
	}
	return v
}
