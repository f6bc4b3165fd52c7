package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// While vLLM loads: the load phase's progress where vLLM reports one, and
// the time left until the start is expected to be ready, both read from
// the supervisor's status at scrape time (the time left changes every
// second without an event). Absent, not 0, when not known.
var (
	descLoadProgress = desc("load_progress_ratio", "While vLLM starts: the load phase's progress as vLLM reports it (its progress bars: done/total), 0..1; absent while no phase reports one (most phases print no bar).", "phase", "unit")
	descExpectedLeft = desc("expected_seconds_to_ready", "While vLLM starts: seconds until it is expected to be ready, learned from this host's earlier starts of the same model on the same rung (0 once that time has passed); absent when not starting, or before any such start was seen.")
	descExpectedTTR  = desc("expected_time_to_ready_seconds", "While vLLM starts: the time to ready expected of this start (from this host's earlier starts of the same model on the same rung); absent when not known.")
)

// LoadCollector reads the load's series from the supervisor's status at
// each scrape. Register it on Registry().
type LoadCollector struct {
	Status func() status.Status
	Now    func() time.Time // nil: time.Now
}

func (c LoadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLoadProgress
	ch <- descExpectedLeft
	ch <- descExpectedTTR
}

func (c LoadCollector) Collect(ch chan<- prometheus.Metric) {
	if c.Status == nil {
		return
	}
	st := c.Status()
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	if p, ok := st.LoadingProgress(); ok && p.Phase == st.Phase {
		ch <- prometheus.MustNewConstMetric(descLoadProgress, prometheus.GaugeValue, p.Ratio(), p.Phase, p.Unit)
	}
	if left, ok := st.ReadyIn(now()); ok {
		ch <- prometheus.MustNewConstMetric(descExpectedLeft, prometheus.GaugeValue, left.Seconds())
		ch <- prometheus.MustNewConstMetric(descExpectedTTR, prometheus.GaugeValue, st.Expected.TimeToReady.Seconds())
	}
}
