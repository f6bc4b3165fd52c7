package guard

// standby.go: what the guard's parts show of the warm standby (pair.go):
// its metrics, its alerts, and the proxy's view at a failover.

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/metrics"
)

// standbyMetrics are the standby's series; nil without a standby.
type standbyMetrics struct {
	ready     prometheus.Gauge
	serving   *prometheus.GaugeVec
	failovers prometheus.Counter
	swaps     prometheus.Counter
	seconds   prometheus.Histogram
	firstTok  prometheus.Histogram
	exits     *prometheus.CounterVec
}

// standbyMetrics registers the standby's series (with a standby only).
func (g *Guard) standbyMetrics() {
	if !g.pair.standby {
		return
	}
	ns := metrics.Namespace
	m := &standbyMetrics{
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "standby_ready",
			Help: "1 while the standby vLLM is ready to take over at once, else 0."}),
		serving: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "serving_vllm",
			Help: "1 for the vLLM the proxy routes to (a: [vllm] port, b: [standby] port), 0 for the other."}, []string{"vllm"}),
		failovers: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "failovers_total",
			Help: "Failovers: the serving vLLM left ready and the standby served at once."}),
		swaps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "standby_swaps_total",
			Help: "Planned swaps to a standby on the ladder's rung (after an OOM stepped it down, or a restore)."}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "failover_seconds",
			Help:    "From the serving vLLM leaving ready to the proxy's switch to the standby.",
			Buckets: []float64{0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300}}),
		firstTok: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "failover_first_token_seconds",
			Help:    "From the serving vLLM leaving ready to the first new token of a stream its death cut, written to the client by the standby (failovers with a stream cut).",
			Buckets: []float64{0.01, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300}}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "pair_exits_total",
			Help: "Deaths of each vLLM of the pair (a, b) by the role it had (serving, standby) and cause."}, []string{"vllm", "role", "cause"}),
	}
	g.met.Registry().MustRegister(m.ready, m.serving, m.failovers, m.swaps, m.seconds, m.firstTok, m.exits)
	g.sbMet = m
	g.standbyReady()
}

// standbyReady sets the standby's gauges from the pair now.
func (g *Guard) standbyReady() {
	m := g.sbMet
	if m == nil {
		return
	}
	d := g.pair.standbyDoc()
	m.ready.Set(b2f(d.StandbyReady))
	for _, v := range d.VLLMs {
		m.serving.WithLabelValues(v.Name).Set(b2f(v.Name == d.Serving))
	}
}

// onFailover: the proxy's vLLM changed. A failover shows the proxy the
// serving vLLM's loss of readiness before the standby's readiness, so that
// streams it cut are held and continued (the proxy tells a death from a
// stream vLLM ended on purpose by that loss), then routes to the standby.
func (g *Guard) onFailover(f events.Failover) {
	if !f.Swap && g.proxy != nil {
		g.gate.RefreshOn(g.pair.lostView(f.From))
		g.proxy.Notify()
	}
	g.gate.RefreshOn(g.pair.gateView())
	if g.proxy != nil {
		g.proxy.Notify()
	}
	g.standbyReady()
	if m := g.sbMet; m != nil {
		if f.Swap {
			m.swaps.Inc()
		} else {
			m.failovers.Inc()
			m.seconds.Observe(f.Seconds)
		}
	}
	if !f.Swap {
		g.log.Info("the standby serves: the dead vLLM restarts as the new standby", zap.String("serving", f.To), zap.String("died", f.From))
	}
}

// continued hears each continued stream's first new token after a cut
// (proxy.SetOnContinued): the first one after a failover ends it as a
// client sees it.
func (g *Guard) continued(at time.Time) {
	sec, ok := g.pair.firstToken(at)
	if !ok {
		return
	}
	if m := g.sbMet; m != nil {
		m.firstTok.Observe(sec)
	}
	g.log.Info("the standby gave the first continued token", zap.Float64("seconds_since_the_death", sec))
}

// pairExited counts a death of vLLM name in role.
func (g *Guard) pairExited(name, role string, c string) {
	if m := g.sbMet; m != nil {
		m.exits.WithLabelValues(name, role, c).Inc()
	}
}

// proxyDied tells the proxy of a death of the vLLM it routes to, for the
// account of the requests it touched; a standby's death touched none of
// them and is no death of the proxy's vLLM (0: none).
func (g *Guard) proxyDied() uint64 {
	if g.standbyDied.Load() {
		return 0
	}
	return g.proxy.Died()
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
