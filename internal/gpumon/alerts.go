package gpumon

import (
	"fmt"
	"time"
)

// Alert names.
const (
	AlertWarn      = "gpu_memory_warn"
	AlertCritical  = "gpu_memory_critical"
	AlertPredicted = "oom_predicted"
)

// Hysteresis: a level alert clears 2 points below its threshold, so a value
// hovering at the threshold raises it once. oom_predicted clears only after
// the trend has stopped climbing for predictClearSamples samples in a row,
// because one noisy sample can read as "not climbing" in a real leak.
const (
	clearBelow          = 0.02
	predictClearSamples = 3
)

type alertConfig struct {
	warn, critical float64
	horizon        time.Duration
}

// alertState is one device's alert state machine; each alert is raised once
// per episode and cleared once.
type alertState struct {
	warn, critical, predicted bool
	calm                      int              // consecutive samples not climbing while predicted
	raised                    map[string]Alert // the raising event of each active alert
}

// update feeds one sample; it returns the alerts raised or cleared by it.
// quiet suppresses raising oom_predicted (vLLM is loading: memory climbs by
// design up to its budget).
func (s *alertState) update(cfg alertConfig, dev int, f float64, tr trendResult, quiet bool, at time.Time) []Alert {
	var out []Alert
	ev := func(name string, active bool, msg string) {
		a := Alert{Name: name, Device: dev, Active: active, Fraction: f,
			SecondsToCritical: tr.stc, At: at, Message: msg}
		out = append(out, a)
		if s.raised == nil {
			s.raised = map[string]Alert{}
		}
		if active {
			s.raised[name] = a
		} else {
			delete(s.raised, name)
		}
	}

	switch {
	case !s.warn && f >= cfg.warn:
		s.warn = true
		ev(AlertWarn, true, fmt.Sprintf("GPU %d memory at %s (warn at %s)", dev, pct(f), pct(cfg.warn)))
	case s.warn && f < cfg.warn-clearBelow:
		s.warn = false
		ev(AlertWarn, false, fmt.Sprintf("GPU %d memory back to %s (below %s)", dev, pct(f), pct(cfg.warn-clearBelow)))
	}

	switch {
	case !s.critical && f >= cfg.critical:
		s.critical = true
		ev(AlertCritical, true, fmt.Sprintf("GPU %d memory at %s (critical at %s)", dev, pct(f), pct(cfg.critical)))
	case s.critical && f < cfg.critical-clearBelow:
		s.critical = false
		ev(AlertCritical, false, fmt.Sprintf("GPU %d memory back to %s (below %s)", dev, pct(f), pct(cfg.critical-clearBelow)))
	}

	climbing := tr.trend == TrendClimbing && tr.stc >= 0
	horizon := cfg.horizon.Seconds()
	switch {
	case !s.predicted && climbing && tr.stc < horizon && !quiet:
		s.predicted = true
		s.calm = 0
		ev(AlertPredicted, true, fmt.Sprintf("GPU %d memory climbing at %s/s from %s: critical (%s) in %s",
			dev, gib(tr.slope), pct(f), pct(cfg.critical), secs(tr.stc)))
	case s.predicted:
		if climbing {
			s.calm = 0
		} else {
			s.calm++
		}
		if s.calm >= predictClearSamples || (climbing && tr.stc > 2*horizon) {
			s.predicted = false
			s.calm = 0
			ev(AlertPredicted, false, fmt.Sprintf("GPU %d memory no longer heading for critical (%s, %s)", dev, pct(f), tr.trend))
		}
	}
	return out
}

// active lists the alerts currently raised, as they were raised.
func (s *alertState) active() []Alert {
	var out []Alert
	for _, name := range []string{AlertWarn, AlertCritical, AlertPredicted} {
		if a, ok := s.raised[name]; ok {
			out = append(out, a)
		}
	}
	return out
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", f*100) }

func gib(b float64) string { return fmt.Sprintf("%.2f GiB", b/(1<<30)) }

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}
