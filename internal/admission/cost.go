package admission

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
	// Tokens are the prompt tokens of the running sequences, when known
	// (the proxy's samples); 0 otherwise.
	Tokens float64 `json:"p,omitempty"`
}

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
	// PerToken is the cost of one prompt token of a running request, when
	// the samples told it apart from PerSeq (FitAdmission); 0 otherwise.
	PerToken float64 `json:"per_prompt_token_bytes,omitempty"`
	// TokensPerSeq, when > 0: every request seen had about this many prompt
	// tokens, so PerSeq is the cost of such a request (FitAdmission).
	TokensPerSeq float64 `json:"prompt_tokens_per_seq,omitempty"`
}

// FitCost fits the samples robustly: the median memory at each concurrency
// level, then a Theil–Sen line (the median of pairwise slopes) through the
// levels, so one bad sample or a lagging reading cannot tilt it.
func FitCost(samples []CostSample) CostModel { return fitCost(samples, 0.5) }

// fitCost is FitCost with the per-sequence cost taken at quantile q of the
// pairwise slopes (0.5: Theil–Sen).
func fitCost(samples []CostSample, q float64) CostModel {
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
	m.PerSeq = quantile(slopes, q)
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
	if m.PerSeq <= 0 {
		return 0
	}
	return int(m.RoomBytes(utilization, headroom) / m.PerSeq)
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

// quantile is the q-quantile of v (nearest rank, rounding up).
func quantile(v []float64, q float64) float64 {
	if q == 0.5 {
		return median(v)
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := min(int(math.Ceil(q*float64(len(s))))-1, len(s)-1)
	return s[max(i, 0)]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Admission: what the proxy needs of the cost model. The proxy learns from
// its own requests in flight (exact and instantaneous, where vLLM's scraped
// count lags a scrape) and their prompt tokens (only the proxy reads the
// bodies), so its samples carry Tokens; the fit then separates what a
// sequence costs from what a prompt token costs when the samples let it.

// collinearRatio: when the 90th percentile of prompt tokens per running
// sequence is less than this many times the 10th, every request looked
// alike and the two costs cannot be told apart.
const collinearRatio = 1.5

// FitAdmission fits memory against running sequences (FitCost) and, when the
// samples carry prompt tokens of varied sizes, against both: memory = base +
// PerSeq × running + PerToken × prompt tokens, by least squares with the
// samples off by more than 3 median errors dropped once. When the sizes
// did not vary, PerSeq is the cost of a typical request and TokensPerSeq its
// prompt tokens, and a longer prompt is charged in proportion (RequestBytes).
//
// The proxy acts on this model at once (its limit), so it is fitted more
// cautiously than the restart profile's: a concurrency level counts only
// once seen in at least SamplesPerLevel samples, near it (one reading may
// have caught requests still on their way to vLLM's batch), and the cost
// per sequence is the admissionSlopeQuantile of the pairwise slopes, not
// their median, so a model that errs, errs on the high side.
func FitAdmission(samples []CostSample) CostModel {
	samples = repeatedLevels(samples, SamplesPerLevel)
	m := fitCost(samples, admissionSlopeQuantile)
	if !m.Confident {
		return m
	}
	var ratios []float64
	for _, s := range samples {
		if s.Running >= 1 && s.Tokens > 0 {
			ratios = append(ratios, s.Tokens/s.Running)
		}
	}
	if len(ratios) < minDistinctRunning {
		return m // no prompt sizes known: count only
	}
	slices.Sort(ratios)
	lo, hi := ratios[len(ratios)/10], ratios[len(ratios)*9/10]
	if hi < collinearRatio*lo {
		m.TokensPerSeq = median(ratios)
		return m
	}
	keep := samples
	var fit ols2
	for pass := 0; pass < 2; pass++ {
		var ok bool
		if fit, ok = fitOLS2(keep); !ok {
			m.TokensPerSeq = median(ratios)
			return m
		}
		res := make([]float64, len(keep))
		for i, s := range keep {
			res[i] = math.Abs(s.Above - fit.predict(s))
		}
		mad := median(res)
		var next []CostSample
		for i, s := range keep {
			if res[i] <= 3*mad+1 {
				next = append(next, s)
			}
		}
		fit.resid = mad
		keep = next
	}
	if fit.perSeq < 0 || fit.perToken <= 0 {
		// Memory does not grow with prompt length (or the fit is off):
		// keep the count model, prorated by length to stay on the safe side.
		m.TokensPerSeq = median(ratios)
		return m
	}
	m.Base, m.PerSeq, m.PerToken, m.Residual, m.TokensPerSeq = fit.base, fit.perSeq, fit.perToken, fit.resid, 0
	if m.Total > 0 && m.Residual > maxResidualOfTotal*m.Total {
		m.Confident = false
		m.Why = fmt.Sprintf("the fit is too noisy: median error %s (over %.0f%% of total)", gibs(m.Residual), maxResidualOfTotal*100)
	}
	return m
}

// SamplesPerLevel is how many settled samples a concurrency level
// needs before FitAdmission counts it (Policy's reopening grows at the same
// pace).
const SamplesPerLevel = 2

const admissionSlopeQuantile = 0.75

// repeatedLevels keeps the samples whose concurrency was seen at least n
// times, counting the samples within StillTolerance of it (a ramp moves a
// little between samples).
func repeatedLevels(samples []CostSample, n int) []CostSample {
	rs := make([]float64, len(samples))
	for i, s := range samples {
		rs[i] = math.Round(s.Running)
	}
	sorted := slices.Clone(rs)
	slices.Sort(sorted)
	out := make([]CostSample, 0, len(samples))
	for i, s := range samples {
		tol := float64(StillTolerance(int(rs[i])))
		lo, _ := slices.BinarySearch(sorted, rs[i]-tol)
		hi, _ := slices.BinarySearch(sorted, rs[i]+tol+0.5)
		if hi-lo >= n {
			out = append(out, s)
		}
	}
	return out
}

type ols2 struct{ base, perSeq, perToken, resid float64 }

func (f ols2) predict(s CostSample) float64 { return f.base + f.perSeq*s.Running + f.perToken*s.Tokens }

// fitOLS2 solves the normal equations of above = b + a·running + c·tokens;
// ok is false when they are singular (running and tokens in lockstep).
func fitOLS2(ss []CostSample) (ols2, bool) {
	n := float64(len(ss))
	if n < 3 {
		return ols2{}, false
	}
	var mr, mt, my float64
	for _, s := range ss {
		mr += s.Running
		mt += s.Tokens
		my += s.Above
	}
	mr, mt, my = mr/n, mt/n, my/n
	var srr, stt, srt, sry, sty float64
	for _, s := range ss {
		r, t, y := s.Running-mr, s.Tokens-mt, s.Above-my
		srr += r * r
		stt += t * t
		srt += r * t
		sry += r * y
		sty += t * y
	}
	det := srr*stt - srt*srt
	if srr == 0 || stt == 0 || det <= 1e-9*srr*stt {
		return ols2{}, false
	}
	f := ols2{perSeq: (sry*stt - sty*srt) / det, perToken: (sty*srr - sry*srt) / det}
	f.base = my - f.perSeq*mr - f.perToken*mt
	return f, true
}

// RoomBytes is the memory that sequences may take before the predicted
// peak passes (1 − headroom) of total at utilization, less the margin for
// the fit's error; 0 when the model is not confident or nothing fits.
func (m CostModel) RoomBytes(utilization, headroom float64) float64 {
	if !m.Confident || m.PerSeq <= 0 && m.PerToken <= 0 || m.Total <= 0 {
		return 0
	}
	margin := max(2*m.Residual, fitMarginOfTotal*m.Total)
	return max((1-headroom)*m.Total-utilization*m.Total-m.Base-margin, 0)
}

// RequestBytes predicts what one request with this many prompt tokens
// costs while it runs. When the fit could not separate the costs
// (TokensPerSeq > 0), a prompt longer than the typical one is charged in
// proportion to its length, as if all its cost grew with length.
func (m CostModel) RequestBytes(tokens float64) float64 {
	c := m.PerSeq + m.PerToken*max(tokens, 0)
	if m.TokensPerSeq > 0 && tokens > m.TokensPerSeq {
		c = m.PerSeq * tokens / m.TokensPerSeq
	}
	return c
}
