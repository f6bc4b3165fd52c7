package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the proxy_* series of section 10.
type metrics struct {
	requests *prometheus.CounterVec
	rejected *prometheus.CounterVec
	duration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, lim *limiter) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm_guard_proxy_requests_total",
			Help: "Requests answered by the proxy, by HTTP status code (499: the client left before any answer).",
		}, []string{"code"}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm_guard_proxy_rejected_total",
			Help: "Requests the proxy refused, by reason: queue_full, queue_timeout (429), not_ready (503), body_too_large (413).",
		}, []string{"reason"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm_guard_proxy_request_duration_seconds",
			Help: "Time from a request's arrival at the proxy to the end of its answer, queueing included.",
			// From a refused request to a long generation.
			Buckets: []float64{.001, .005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}),
	}
	for _, r := range reasons {
		m.rejected.WithLabelValues(r)
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm_guard_proxy_inflight",
		Help: "Requests forwarded to vLLM and not finished.",
	}, func() float64 { return float64(lim.stats().Inflight) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm_guard_proxy_queue_depth",
		Help: "Requests waiting for a slot or for vLLM to be ready.",
	}, func() float64 { return float64(lim.stats().Queued) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm_guard_proxy_limit",
		Help: "Requests allowed in flight now: max_num_seqs of the rung × inflight_factor, halved under memory pressure.",
	}, func() float64 { return float64(lim.stats().Limit) })
	return m
}
