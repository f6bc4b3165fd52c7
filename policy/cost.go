package policy

import (
	"fmt"
	"math"
	"slices"
)

// The cost model learns what one running sequence costs in GPU memory, so
// that after an OOM the next profile can be the largest max_num_seqs whose
// predicted peak fits, instead of a blind halving.
//
// Each sample pairs vLLM's num_requests_running with the GPU memory in use at
// that moment. vLLM preallocates utilization × total for weights and KV cache,
// so a sample is kept as memory *above that budget*: samples taken under
// different utilizations then fit one line,
//
//	used − utilization × total = base + perSeq × running.

// CostSample is one observation; Above is used − utilization × total (bytes,
// may be negative), Total the device total.
type CostSample struct {
	Running float64 `json:"r"`
	Above   float64 `json:"a"`
	Total   float64 `json:"t"`
}

// maxCostSamples bounds the samples kept (and persisted in state.json).
const maxCostSamples = 600

// Thresholds for a confident fit.
const (
	minDistinctRunning = 5     // distinct concurrency levels seen
	minRunningSpread   = 8.0   // sequences between the lowest and the highest level
	maxResidualOfTotal = 0.02  // median absolute residual, as a fraction of total
	fitMarginOfTotal   = 0.005 // the least margin kept for the fit's error
)

// CostModel is a fit of memory against running sequences.
type CostModel struct {
	Confident  bool    `json:"confident"`
	Why        string  `json:"why,omitempty"`  // why not confident
	PerSeq     float64 `json:"per_seq_bytes"`  // bytes per running sequence
	Base       float64 `json:"base_bytes"`     // bytes above the utilization budget at zero running
	Residual   float64 `json:"residual_bytes"` // median absolute residual
	Total      float64 `json:"total_bytes"`
	Samples    int     `json:"samples"`
	Levels     int     `json:"levels"` // distinct running values
	MinRunning float64 `json:"min_running"`
	MaxRunning float64 `json:"max_running"`
}

// FitCost fits the samples robustly: the median memory at each concurrency
// level, then a Theil–Sen line (the median of pairwise slopes) through the
// levels, so one bad sample or a lagging reading cannot tilt it.
func FitCost(samples []CostSample) CostModel {
	m := CostModel{Samples: len(samples)}
	if len(samples) == 0 {
		m.Why = "no samples yet: the cost is learned while vLLM serves"
		return m
	}
	byLevel := map[float64][]float64{}
	for _, s := range samples {
		r := math.Round(s.Running)
		byLevel[r] = append(byLevel[r], s.Above)
		m.Total = max(m.Total, s.Total)
	}
	levels := make([]float64, 0, len(byLevel))
	for r := range byLevel {
		levels = append(levels, r)
	}
	slices.Sort(levels)
	m.Levels = len(levels)
	m.MinRunning, m.MaxRunning = levels[0], levels[len(levels)-1]
	ys := make([]float64, len(levels))
	for i, r := range levels {
		ys[i] = median(byLevel[r])
	}
	if m.Levels < minDistinctRunning || m.MaxRunning-m.MinRunning < minRunningSpread {
		m.Why = fmt.Sprintf("too little spread of concurrency: %d levels between %.0f and %.0f running sequences "+
			"(need %d levels over at least %.0f)", m.Levels, m.MinRunning, m.MaxRunning, minDistinctRunning, minRunningSpread)
		return m
	}
	var slopes []float64
	for i := range levels {
		for j := i + 1; j < len(levels); j++ {
			slopes = append(slopes, (ys[j]-ys[i])/(levels[j]-levels[i]))
		}
	}
	m.PerSeq = median(slopes)
	resid := make([]float64, len(levels))
	for i, r := range levels {
		resid[i] = ys[i] - m.PerSeq*r
	}
	m.Base = median(resid)
	for i, r := range levels {
		resid[i] = math.Abs(ys[i] - m.Base - m.PerSeq*r)
	}
	m.Residual = median(resid)
	switch {
	case m.PerSeq <= 0:
		m.Why = "memory does not grow with running sequences: the OOM is not explained by concurrency"
	case m.Total > 0 && m.Residual > maxResidualOfTotal*m.Total:
		m.Why = fmt.Sprintf("the fit is too noisy: median error %s (over %.0f%% of total)", gibs(m.Residual), maxResidualOfTotal*100)
	default:
		m.Confident = true
	}
	return m
}

// SafeMaxNumSeqs is the largest max_num_seqs whose predicted peak (every
// slot running, at utilization) stays under (1 − headroom) of total, less a
// margin for the fit's own error (twice its residual, at least 0.5 % of
// total); 0 when none fits or the model is not confident.
func (m CostModel) SafeMaxNumSeqs(utilization, headroom float64) int {
	if !m.Confident || m.PerSeq <= 0 || m.Total <= 0 {
		return 0
	}
	margin := max(2*m.Residual, fitMarginOfTotal*m.Total)
	room := (1-headroom)*m.Total - utilization*m.Total - m.Base - margin
	if room <= 0 {
		return 0
	}
	return int(room / m.PerSeq)
}

// Describe says the model in one line, as status and check show it.
func (m CostModel) Describe(utilization, headroom float64) string {
	if !m.Confident {
		return "cost per sequence not known: " + m.Why
	}
	return fmt.Sprintf("≈ %.0f MiB per running sequence above %s; safe max_num_seqs at %.0f %% headroom: %d",
		m.PerSeq/(1<<20), gibs(utilization*m.Total+m.Base), headroom*100, m.SafeMaxNumSeqs(utilization, headroom))
}

func gibs(b float64) string { return fmt.Sprintf("%.1f GiB", b/(1<<30)) }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
