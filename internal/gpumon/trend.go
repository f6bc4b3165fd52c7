package gpumon

import (
	"math"
	"slices"
	"time"
)

// Trend names, as status and alerts show them.
const (
	TrendSteady   = "steady"
	TrendClimbing = "climbing"
	TrendSpike    = "spike"
)

// Trend detection constants. The reasoning:
//   - A fit over a sliding window (60 s, or 10 samples when sampling is
//     slower) sees a leak long before it matters, yet one window of noise
//     cannot move it much.
//   - A median-of-3 prefilter removes single-sample glitches (one odd
//     NVML reading) before the least-squares fit.
//   - "climbing" needs at least half a window of samples (one rising edge
//     of an allocate/free cycle is not a trend); a fitted rise over the
//     window of at least 1 point of total memory and at least 3 residual
//     standard deviations (so noise and sawtooth allocation patterns read
//     as steady); and the most recent half of the window must still rise at
//     ≥ half the overall slope (so a level that went up and then stopped is
//     not extrapolated). With a full 60 s
//     window the smallest climb is ~0.017 %/s of total: slow enough to catch
//     a leak that reaches critical within a 10 min horizon.
//   - A "spike" is a jump of ≥ 10 points to ≥ warn within ≤ 3 samples; the
//     fit then restarts at the jump, so a step up is not read as a climb.
const (
	trendMinWindow   = 60 * time.Second
	trendWindowSteps = 10
	trendMinPoints   = 5
	trendMinRise     = 0.01 // of total, over the fitted span
	trendNoiseSigmas = 3.0
	trendRecentRatio = 0.5
	spikeJump        = 0.10
	spikeSamples     = 3
)

// point is one memory reading of one device.
type point struct {
	at    time.Time
	used  uint64
	total uint64
}

func (p point) fraction() float64 {
	if p.total == 0 {
		return 0
	}
	return float64(p.used) / float64(p.total)
}

// trendResult is the reading of one device's recent history.
type trendResult struct {
	trend string
	slope float64 // bytes per second (fitted); 0 unless climbing
	stc   float64 // seconds until used reaches critical × total; < 0 when not climbing
}

type trendConfig struct {
	window   time.Duration
	warn     float64
	critical float64
}

// trendWindow is the fit window: a minute with the defaults, shorter when
// the predict horizon is short (a leak that must be called within a
// 30 s horizon cannot wait for a minute of samples), never under ten samples.
func trendWindow(interval, horizon time.Duration) time.Duration {
	w := trendMinWindow
	if horizon > 0 {
		w = min(w, horizon/10)
	}
	return max(w, trendWindowSteps*interval)
}

// trendTracker reads one device's trend. It remembers where the current
// level began (a spike, or the end of a model load), because a fit across a
// step would report the step as a steep climb.
type trendTracker struct {
	cfg     trendConfig
	since   time.Time // fit only points at or after this time
	spiking bool
}

// restart makes the fit ignore points before at.
func (tr *trendTracker) restart(at time.Time) { tr.since = at }

// update reads hist (oldest first, the last point is the current reading;
// it needs the last window plus spikeSamples points).
func (tr *trendTracker) update(hist []point) trendResult {
	none := trendResult{trend: TrendSteady, stc: -1}
	if len(hist) == 0 {
		return none
	}
	cur := hist[len(hist)-1]
	if tr.isSpike(hist) {
		if !tr.spiking {
			tr.since = cur.at
		}
		tr.spiking = true
		none.trend = TrendSpike
		return none
	}
	tr.spiking = false

	start := len(hist)
	for start > 0 {
		p := hist[start-1]
		if p.at.Before(tr.since) || cur.at.Sub(p.at) > tr.cfg.window {
			break
		}
		start--
	}
	win := hist[start:]
	slope, ok := climbSlope(win, tr.cfg.window)
	if !ok {
		return none
	}
	res := trendResult{trend: TrendClimbing, slope: slope, stc: 0}
	if limit := tr.cfg.critical * float64(cur.total); float64(cur.used) < limit {
		res.stc = (limit - float64(cur.used)) / slope
	}
	return res
}

func (tr *trendTracker) isSpike(hist []point) bool {
	cur := hist[len(hist)-1]
	f := cur.fraction()
	if f < tr.cfg.warn {
		return false
	}
	lo := f
	for i := len(hist) - 2; i >= 0 && i >= len(hist)-1-spikeSamples; i-- {
		lo = min(lo, hist[i].fraction())
	}
	return f-lo >= spikeJump
}

// climbSlope fits win and returns its slope in bytes/s when it shows a
// sustained climb (see the constants above).
func climbSlope(win []point, window time.Duration) (float64, bool) {
	if len(win) < trendMinPoints {
		return 0, false
	}
	span := win[len(win)-1].at.Sub(win[0].at)
	if span < window/2 {
		return 0, false
	}
	ts, ys := series(win)
	slope, sigma := fitLine(ts, ys)
	rise := slope * span.Seconds()
	total := float64(win[len(win)-1].total)
	if slope <= 0 || rise < trendMinRise*total || rise < trendNoiseSigmas*sigma {
		return 0, false
	}
	// The recent half must still be rising: a level that stepped up and
	// stopped is not a leak.
	mid := win[len(win)-1].at.Add(-span / 2)
	h := 0
	for h < len(win) && win[h].at.Before(mid) {
		h++
	}
	if len(win)-h >= 3 {
		rs, _ := fitLine(ts[h:], ys[h:])
		if rs < trendRecentRatio*slope {
			return 0, false
		}
	}
	return slope, true
}

// series turns points into (seconds since the first, median-of-3 used bytes).
func series(win []point) (ts, ys []float64) {
	ts = make([]float64, len(win))
	raw := make([]float64, len(win))
	for i, p := range win {
		ts[i] = p.at.Sub(win[0].at).Seconds()
		raw[i] = float64(p.used)
	}
	return ts, median3(raw)
}

// median3 replaces each interior value by the median of it and its two
// neighbours; one bad sample cannot then bend the fit.
func median3(v []float64) []float64 {
	out := slices.Clone(v)
	for i := 1; i+1 < len(v); i++ {
		a, b, c := v[i-1], v[i], v[i+1]
		out[i] = max(min(a, b), min(max(a, b), c))
	}
	return out
}

// fitLine is ordinary least squares: slope and the residual standard deviation.
func fitLine(ts, ys []float64) (slope, sigma float64) {
	n := float64(len(ts))
	if n < 2 {
		return 0, 0
	}
	var mt, my float64
	for i := range ts {
		mt += ts[i]
		my += ys[i]
	}
	mt /= n
	my /= n
	var stt, sty float64
	for i := range ts {
		dt := ts[i] - mt
		stt += dt * dt
		sty += dt * (ys[i] - my)
	}
	if stt == 0 {
		return 0, 0
	}
	slope = sty / stt
	var ss float64
	for i := range ts {
		r := ys[i] - (my + slope*(ts[i]-mt))
		ss += r * r
	}
	return slope, math.Sqrt(ss / n)
}
