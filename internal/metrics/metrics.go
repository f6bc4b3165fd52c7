// Package metrics owns the guard's Prometheus series: a private
// registry, prefix vllm_guard_, with the supervisor's state, starts and exits
// by cause, time to ready, the profile rung in force, GPU memory and
// hardware health from the monitor, vLLM's own queue and KV cache gauges,
// and the alerts. Other packages (the proxy) register their series on
// Registry().
//
// Two kinds of series. What events say (state, ready, starts, exits, time
// to ready, rung, alerts) is pushed by the guard as the events arrive.
// What samplers measure (the GPU monitor, the scraper of vLLM's /metrics)
// is read at scrape time: a collector (collector.go) asks the Sources
// given to New for their latest snapshots and builds the series from them,
// node_exporter's way, so no ticker copies readings in between and a
// scrape is never a sample behind.
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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vllm-guard/vllm-guard/internal/buildinfo"
	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Namespace is the prefix of every series the guard exports.
const Namespace = "vllm_guard"

// AlertNames are every alert, in the order the series are created.
var AlertNames = []string{"gpu_memory_warn", "gpu_memory_critical", "oom_predicted", "oom", "gave_up", "gpu_fault", "state_not_saved"}

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
	kvBytes     prometheus.Gauge

	alertActive *prometheus.GaugeVec
	stateSaved  prometheus.Gauge
}

// New makes the series and registers them, with the Go runtime and process
// collectors, on a private registry (so nothing a library registers on the
// default one leaks into the guard's /metrics). The GPU, GPU-health and
// vLLM series are read from src at each scrape.
func New(src Sources) *Metrics {
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
		kvBytes:     g("profile_kv_cache_memory_bytes", "--kv-cache-memory-bytes of the rung in force; 0 when vLLM sizes its KV cache from gpu_memory_utilization."),
		stateSaved:  g("state_saved", "1 while the guard's state (rung, counters) is on disk as the guard holds it; 0 when the last save failed or state_dir cannot be written (a full disk, a read-only folder): a restarted guard would resume the state on disk."),
		alertActive: gv("alert_active", "1 while the alert is in force: a memory episode until it clears, oom until vLLM is ready again, gave_up once the guard gave up.", "alert"),
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
		m.rung, m.maxNumSeqs, m.utilization, m.kvBytes,
		m.alertActive, m.stateSaved,
		sourceCollector{src},
	)
	for _, s := range status.States {
		m.state.WithLabelValues(string(s))
	}
	for _, c := range cause.Causes {
		m.exits.WithLabelValues(string(c))
	}
	for _, a := range AlertNames {
		m.alertActive.WithLabelValues(a)
	}
	m.stateSaved.Set(1)
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
func (m *Metrics) Exited(c cause.Cause) {
	m.exits.WithLabelValues(string(c)).Inc()
}

// SetProfile exports the rung in force.
func (m *Metrics) SetProfile(r policy.Rung) {
	m.rung.Set(float64(r.Index))
	m.maxNumSeqs.Set(float64(r.MaxNumSeqs))
	m.utilization.Set(r.GPUMemoryUtilization)
	m.kvBytes.Set(float64(r.KVCacheMemoryBytes))
}

// SetStateSaved sets state_saved.
func (m *Metrics) SetStateSaved(saved bool) { m.stateSaved.Set(b2f(saved)) }

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
