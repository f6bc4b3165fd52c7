// The memory side of the alerts: vLLM's budget on each device (its
// utilization, or what it held once loaded), the warn and critical
// thresholds drawn from it, and the load peak that is not a climb.

package gpumon

import (
	"time"
)

// SetLoading tells the monitor whether vLLM is loading. While it loads,
// memory climbs by design up to its budget, so oom_predicted is not raised;
// each change restarts the trend fit, so neither the load nor the drop after
// a death reads as a trend.
func (m *Monitor) SetLoading(loading bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loading == loading {
		return
	}
	m.loading = loading
	now := time.Now()
	for i := range m.trackers {
		m.trackers[i].restart(now)
	}
	for i := range m.loadPeak {
		if loading {
			m.loadPeak[i], m.learned[i] = 0, 0
		} else {
			// Loaded: what vLLM holds now it holds for the whole run.
			m.learned[i] = m.loadPeak[i]
		}
	}
}

// SetThresholds replaces how warn and critical follow the budget (a config
// reload); the next sample uses them.
func (m *Monitor) SetThresholds(f func(budget float64) (warn, critical float64)) {
	m.mu.Lock()
	m.opts.Thresholds = f
	m.mu.Unlock()
}

// SetBudget tells the monitor vLLM's budget for the next run, as a
// fraction of each device's total: its gpu_memory_utilization, or 0 when
// vLLM sizes its KV cache in bytes (--kv-cache-memory-bytes) and the budget
// is learned. Either way, once vLLM is ready the budget is at least what it
// held then (its non-torch memory, CUDA graphs and context come on top of
// the utilization share). Alerts mean memory beyond the budget.
func (m *Monitor) SetBudget(fraction float64) {
	m.mu.Lock()
	m.budget = fraction
	m.mu.Unlock()
}

// budgetOf is device i's budget (mu held); 0 when not known yet.
func (m *Monitor) budgetOf(i int) float64 {
	b := m.budget
	if i >= 0 && i < len(m.learned) {
		b = max(b, m.learned[i])
	}
	return b
}

// thresholdsOf are device i's warn and critical fractions (mu held). An
// unknown budget (bytes-sized KV cache, still loading) alerts only near a
// full device.
func (m *Monitor) thresholdsOf(i int) (warn, critical float64) {
	if m.opts.Thresholds == nil {
		return m.opts.WarnFraction, m.opts.CriticalFraction
	}
	b := m.budgetOf(i)
	if b <= 0 {
		b = 1
	}
	return m.opts.Thresholds(b)
}

// CriticalFraction is the lowest critical threshold of the watched devices
// now (the classifier's "memory was critical before the death").
func (m *Monitor) CriticalFraction() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := 1.0
	for i := range m.devs {
		_, ci := m.thresholdsOf(i)
		c = min(c, ci)
	}
	if len(m.devs) == 0 {
		_, c = m.thresholdsOf(-1)
	}
	return c
}
