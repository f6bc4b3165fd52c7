package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/vllm-guard/vllm-guard/internal/admission"
)

// metrics are the proxy_* series of section 10.
type metrics struct {
	requests *prometheus.CounterVec
	rejected *prometheus.CounterVec
	duration prometheus.Histogram
	bound    *prometheus.GaugeVec
	// resumed{how}: replayed (sent again from its body) or continued (a
	// stream carried on from the tokens delivered). resumeFailed{reason}:
	// requests a death or drain ended that were not resumed. holdTime: how
	// long requests were held for vLLM.
	resumed      *prometheus.CounterVec
	resumeFailed *prometheus.CounterVec
	holdTime     prometheus.Histogram
}

// How a request was resumed (the how label of
// vllm_guard_proxy_resumed_total).
const (
	ResumedReplayed  = "replayed"
	ResumedContinued = "continued"
)

// Why a request a death or drain ended was not resumed (the reason label
// of vllm_guard_proxy_resume_failed_total). The stream helper adds its own.
const (
	FailedSuspect       = "resume_limit"    // in flight at resume_limit deaths: not sent again
	FailedBodyNotKept   = "body_not_kept"   // its body was not kept to send again
	FailedHoldTimeout   = "hold_timeout"    // vLLM did not come back within the hold limit
	FailedNotComingBack = "not_coming_back" // the guard failed, gave up or is stopping
	FailedResumeOff     = "resume_off"      // [proxy] resume = false
)

var resumeFailReasons = append([]string{FailedSuspect, FailedBodyNotKept, FailedHoldTimeout, FailedNotComingBack, FailedResumeOff}, resumeReasons...)

var bounds = []string{admission.BoundRung, admission.BoundMemory, admission.BoundTrend, admission.BoundReopening, admission.BoundPressure}

func (m *metrics) setBound(b string) {
	for _, x := range bounds {
		v := 0.0
		if x == b {
			v = 1
		}
		m.bound.WithLabelValues(x).Set(v)
	}
}

func newMetrics(reg prometheus.Registerer, lim *limiter, budget *bodyBudget) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm_guard_proxy_requests_total",
			Help: "Requests answered by the proxy, by HTTP status code (499: the client left before any answer).",
		}, []string{"code"}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm_guard_proxy_rejected_total",
			Help: "Requests the proxy refused, by reason: queue_full, queue_timeout (429), not_ready, buffer_full (503), body_too_large, too_large_for_memory (413), operator_route (403: vLLM's sleep, pause, weight and profiler routes).",
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
	m.resumed = f.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm_guard_proxy_resumed_total",
		Help: "Requests a death of vLLM or a drain interrupted that the proxy resumed once vLLM was back, by how: replayed (sent again from the body it holds: nothing had reached the client) or continued (a stream carried on from the tokens already delivered).",
	}, []string{"how"})
	m.resumed.WithLabelValues(ResumedReplayed)
	m.resumed.WithLabelValues(ResumedContinued)
	m.resumeFailed = f.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm_guard_proxy_resume_failed_total",
		Help: "Requests a death of vLLM or a drain interrupted that the proxy ended instead of resuming, by reason: resume_limit (in flight at [proxy] resume_limit deaths), body_not_kept, hold_timeout, not_coming_back, resume_off, and the reasons a stream is not continued.",
	}, []string{"reason"})
	for _, r := range resumeFailReasons {
		m.resumeFailed.WithLabelValues(r)
	}
	m.holdTime = f.NewHistogram(prometheus.HistogramOpts{
		Name: "vllm_guard_proxy_hold_seconds",
		Help: "How long a request was held while vLLM was away (restarting, loading, draining) before it was sent again or refused.",
		// A refused connection retried at once, to a restart of a large model.
		Buckets: []float64{.01, .1, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200},
	})
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
		Help: "Requests allowed in flight now: the smaller of max_num_seqs of the rung × inflight_factor and what the cost model predicts memory holds (vllm_guard_proxy_limit_bound says which).",
	}, func() float64 { return float64(lim.stats().Limit) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm_guard_proxy_memory_room_bytes",
		Help: "GPU memory the requests in flight may take, predicted by the cost model; 0 while the memory bound is not in force.",
	}, func() float64 { return lim.stats().MemoryRoomBytes })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm_guard_proxy_memory_inflight_bytes",
		Help: "Predicted GPU memory of the requests in flight.",
	}, func() float64 { return lim.stats().MemoryInflightBytes })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm_guard_proxy_buffered_body_bytes",
		Help: "Memory held for request bodies now, all requests together (at most [proxy] max_buffered_bytes).",
	}, func() float64 { return float64(budget.inUse()) })
	m.bound = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm_guard_proxy_limit_bound",
		Help: "1 for the bound that sets vllm_guard_proxy_limit now: rung (max_num_seqs × inflight_factor), memory (the cost model), trend (memory predicted critical before the model was confident), reopening (after an OOM), pressure (halved under a memory alert).",
	}, []string{"bound"})
	for _, b := range bounds {
		m.bound.WithLabelValues(b)
	}
	return m
}
