package admission

import (
	"fmt"
	"math"
	"time"
)

// Facts are what one admission step looks at.
type Facts struct {
	// The rung in force: its max_num_seqs and gpu_memory_utilization.
	MaxNumSeqs       int
	Utilization      float64
	InflightFactor   float64
	Headroom         float64 // [profile] headroom
	CriticalFraction float64 // [gpu] critical_fraction
	Pressure         bool    // gpu_memory_critical or oom_predicted in force
	Model            CostModel
	Inflight         int     // requests in flight now
	MeanTokens       float64 // prompt tokens of a typical recent request
	// SecondsToCritical is the GPU trend's (< 0 when not climbing);
	// Horizon the short horizon within which it steps admission down.
	SecondsToCritical, Horizon float64
	// Tick: this step follows a GPU sample, or stands in for one while the
	// GPU cannot be read (Gate.Run); the trend and the reopening move only
	// then. Other steps follow a change of rung or alerts.
	Tick bool
	// Observed > 0: a settled sample was taken at this step with this many
	// requests in flight (SettledSample), so that concurrency was seen
	// without trouble. Learning: such samples can be taken (the GPU is
	// readable); the limit then grows only as they come.
	Observed int
	Learning bool
}

// Policy decides the proxy's limit one step at a time (each GPU sample
// and each change of rung or alerts). It is not safe for concurrent use.
//
// With a confident cost model the limit is the smaller of the rung's and the
// largest concurrency whose predicted peak stays under the memory ceiling.
// Before that, the rung's, with three guards: when the trend predicts
// critical within the horizon, or when pressure (gpu_memory_critical or
// oom_predicted) begins, the limit steps down to 7/8 of what is in flight;
// after an OOM the model did not foresee, the limit starts at 1/16 of the
// rung's. From any of them it reopens by an eighth (at least 2) per step
// while the requests use it, so that concurrency never rises faster than the
// samples can follow and the model learns on the way. Pressure with nothing
// in flight to step down from halves the rung's.
//
// Stepping down from what is in flight, not halving the rung, is what holds
// a ramp: with 1 s GPU samples the requests in flight never hold still
// while clients keep arriving, the model learns nothing on the way up, and
// the critical alert comes when vLLM is already near its point of failure.
// Halving a rung of 256 left 128 admitted above a failure at 118.
//
// The memory bound never reaches past what was seen: at most the highest
// concurrency a settled sample was taken at, plus one growth step (an
// eighth, at least 2). A young model fitted on low concurrency therefore
// never extrapolates far; each settled sample at the cap moves it up a step.
type Policy struct {
	reopen   int // > 0: the reopening limit in force
	kind     string
	seen     int  // the highest concurrency observed without trouble
	pressure bool // pressure was in force at the last step
	// The settled samples at the latest level (within StillTolerance of
	// level): the reopening grows once the level has as many as the cost
	// model needs of each (SamplesPerLevel).
	level, atLevel int
}

// growth is one step of the limit's growth from n.
func growth(n int) int { return max(n/8, 2) }

// observe counts a settled sample at n (0: none) and returns how many the
// latest level has.
func (a *Policy) observe(n int) int {
	if n <= 0 {
		return 0
	}
	if a.atLevel == 0 || abs(n-a.level) > StillTolerance(a.level) {
		a.level, a.atLevel = n, 0
	}
	a.atLevel++
	return a.atLevel
}

func abs(n int) int { return max(n, -n) }

// Seed sets the highest concurrency observed without trouble, from the
// samples a restarted guard finds (their highest running).
func (a *Policy) Seed(samples []CostSample) {
	for _, s := range samples {
		a.seen = max(a.seen, int(s.Running))
	}
}

// Seen is the highest concurrency observed without trouble.
func (a *Policy) Seen() int { return a.seen }

// OnOOM records that vLLM ran out of memory: what was seen is trusted a
// step less, and before the model is confident the limit reopens from a
// sixteenth of the rung's.
func (a *Policy) OnOOM(f Facts) {
	a.seen = a.seen * 7 / 8
	if f.Model.Confident {
		return // the next samples correct the model; the memory bound stays
	}
	a.reopen, a.kind = max(rungLimit(f)/16, 2), BoundReopening
}

func rungLimit(f Facts) int {
	return max(int(float64(f.MaxNumSeqs)*max(f.InflightFactor, 0)), 1)
}

// Ceiling is the memory fraction admission keeps the predicted peak under:
// 1 − headroom, or halfway between the utilization and critical_fraction
// when the headroom leaves no room above vLLM's own budget.
func (f Facts) Ceiling() float64 {
	c := 1 - f.Headroom
	if c <= f.Utilization {
		c = (f.Utilization + max(f.CriticalFraction, f.Utilization)) / 2
	}
	return c
}

// Step returns the bound in force now.
func (a *Policy) Step(f Facts) Bound {
	rl := rungLimit(f)
	b := Bound{Limit: rl, Bound: BoundRung, Model: f.Model,
		Why: fmt.Sprintf("max_num_seqs %d × inflight_factor %g", f.MaxNumSeqs, f.InflightFactor)}
	m := f.Model
	a.seen = max(a.seen, f.Observed)
	pressureBegins := f.Pressure && !a.pressure
	a.pressure = f.Pressure
	if m.Confident {
		a.reopen = 0
		ceil := f.Ceiling()
		room := m.RoomBytes(f.Utilization, 1-ceil)
		per := m.RequestBytes(f.MeanTokens)
		b.RoomBytes = max(room, 1) // a model that leaves no room admits nothing but is still a bound
		n, capAt := math.MaxInt, a.seen+growth(a.seen)
		if per > 0 {
			n = int(min(room/per, float64(math.MaxInt/2)))
		}
		switch {
		case capAt < n && capAt < rl:
			b.Limit, b.Bound = capAt, BoundMemory
			b.Why = fmt.Sprintf("learning: at most one step past the %d requests in flight seen without trouble (the model predicts %d fit under %.1f %% of the device)",
				a.seen, n, ceil*100)
		case n < rl:
			b.Limit, b.Bound = max(n, 1), BoundMemory
			b.Why = fmt.Sprintf("predicted peak under %.1f %% of the device: %d requests of %.0f prompt tokens (≈ %.0f MiB each over %.1f GiB of room)",
				ceil*100, n, f.MeanTokens, per/(1<<20), room/(1<<30))
		}
	} else {
		climbing := f.Tick && f.SecondsToCritical >= 0 && f.SecondsToCritical <= f.Horizon
		stepDown := climbing || (pressureBegins && f.Inflight > 1)
		switch {
		case stepDown && (a.reopen == 0 || f.Inflight*7/8 < a.reopen):
			a.reopen, a.kind = max(f.Inflight*7/8, 1), BoundTrend
			if !climbing {
				a.kind = BoundPressure
			}
		case stepDown:
			// Already stepped down below what is in flight: hold.
		case a.reopen > 0 && f.Learning:
			// One step past each concurrency seen settled as often as the
			// model needs a level seen, so that the samples (and the model)
			// keep up with the limit: growing at every sample left each
			// level one sample, which the model cannot use, and with 1 s
			// samples it never became confident.
			if a.observe(f.Observed) >= SamplesPerLevel {
				a.reopen = max(a.reopen, f.Observed+growth(f.Observed))
			}
		case f.Tick && a.reopen > 0 && f.Inflight >= a.reopen-1:
			a.reopen += growth(a.reopen)
		}
		if a.reopen >= rl {
			a.reopen = 0
		}
		if a.reopen > 0 {
			b.Limit, b.Bound = a.reopen, a.kind
			switch a.kind {
			case BoundTrend:
				b.Why = fmt.Sprintf("memory predicted to reach critical within %.0f s before the cost model is confident (%s): stepped down, reopening step by step", f.Horizon, m.Why)
			case BoundPressure:
				b.Why = fmt.Sprintf("gpu_memory_critical or oom_predicted before the cost model is confident (%s): stepped down to 7/8 of the requests in flight, reopening step by step", m.Why)
			default:
				b.Why = fmt.Sprintf("vLLM ran out of memory before the cost model was confident (%s): reopening step by step", m.Why)
			}
		}
	}
	if f.Pressure && b.Limit > 1 && b.RoomBytes == 0 && a.reopen == 0 {
		b.Limit, b.Bound = max(b.Limit/2, 1), BoundPressure
		b.Why = "halved while gpu_memory_critical or oom_predicted is active (" + b.Why + ")"
	}
	return b
}

// InflightSpan is the proxy's requests in flight over a stretch of time:
// since Since, between Min and Max, with MinTokens prompt tokens in flight
// when there were Min. Last is the latest window's fewest (and their
// prompt tokens): a long span keeps an early dip in Min, and the memory
// read now belongs to what is in flight now.
type InflightSpan struct {
	Since      time.Time
	Min, Max   int
	MinTokens  float64
	Last       int
	LastTokens float64
}

// Still: the requests in flight held still over the span.
func (s InflightSpan) Still() bool {
	return !s.Since.IsZero() && s.Max-s.Min <= StillTolerance(s.Max)
}

// Extend adds the next window w (its Since is where it began) to the span
// while the requests in flight hold still; otherwise the span starts anew
// at w (or not at all, when w itself did not hold still).
func (s InflightSpan) Extend(w InflightSpan) InflightSpan {
	if s.Still() {
		m := InflightSpan{Since: s.Since, Min: min(s.Min, w.Min), Max: max(s.Max, w.Max), MinTokens: s.MinTokens,
			Last: w.Min, LastTokens: w.MinTokens}
		if w.Min < s.Min {
			m.MinTokens = w.MinTokens
		}
		if m.Still() {
			return m
		}
	}
	if !w.Still() {
		return InflightSpan{}
	}
	w.Last, w.LastTokens = w.Min, w.MinTokens
	return w
}

// RunningCount is vLLM's own count of running requests from one scrape,
// asked at AskedAt (the count is no older) and answered at At.
type RunningCount struct {
	AskedAt, At time.Time
	Running     float64
}

// Reading is what one admission sample is made of: the requests in
// flight, vLLM's recent counts, and a GPU reading of the fullest device.
type Reading struct {
	Span        InflightSpan
	Counts      []RunningCount
	MemReadAt   time.Time // the memory is no older than this
	Used, Total float64
	Utilization float64
}

// SettledSample pairs a GPU reading with the requests in flight when the
// pairing is sure: the requests in flight held still over the span, vLLM
// counted about as many running within the span, and the memory was read
// after that count. Requests the proxy admitted reach vLLM's batch a moment
// later, and memory follows the batch: a reading taken before they arrive
// would charge them nothing and teach the model a low cost. The sample
// pairs the memory with the fewest requests of the latest window, which
// errs on the side of a higher cost. seen is the most the span held: that
// many ran without trouble (Facts.Observed).
func SettledSample(r Reading) (sample CostSample, seen int, ok bool) {
	if !r.Span.Still() || r.Total <= 0 || r.MemReadAt.IsZero() {
		return CostSample{}, 0, false
	}
	tol := float64(StillTolerance(r.Span.Max))
	for _, c := range r.Counts {
		if c.AskedAt.Before(r.Span.Since) || c.At.After(r.MemReadAt) {
			continue
		}
		if c.Running >= float64(r.Span.Min)-tol && c.Running <= float64(r.Span.Max)+tol {
			return CostSample{Running: float64(r.Span.Last), Tokens: r.Span.LastTokens,
				Above: r.Used - r.Utilization*r.Total, Total: r.Total}, r.Span.Max, true
		}
	}
	return CostSample{}, 0, false
}

// samplesPerLevel bounds the samples kept at one concurrency level, so that
// a long stretch at one level does not push the others out of the fit.
const samplesPerLevel = 8

// KeepSample appends s to samples (newest last), dropping the oldest at
// its level beyond samplesPerLevel and the oldest of all beyond max.
func KeepSample(samples []CostSample, s CostSample, maxSamples int) []CostSample {
	n := 0
	for _, x := range samples {
		if math.Round(x.Running) == math.Round(s.Running) {
			n++
		}
	}
	if n >= samplesPerLevel {
		for i, x := range samples {
			if math.Round(x.Running) == math.Round(s.Running) {
				samples = append(samples[:i], samples[i+1:]...)
				break
			}
		}
	}
	samples = append(samples, s)
	if k := len(samples); k > maxSamples {
		samples = append(samples[:0], samples[k-maxSamples:]...)
	}
	return samples
}
