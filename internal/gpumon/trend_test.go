package gpumon

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const gib80 = 80 << 30

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// series builds one point per second from fractions of an 80 GiB device.
func fracSeries(fs []float64) []point {
	out := make([]point, len(fs))
	for i, f := range fs {
		out[i] = point{at: t0.Add(time.Duration(i) * time.Second), used: uint64(f * gib80), total: gib80}
	}
	return out
}

// replay feeds the series one sample at a time, as the monitor does, and
// returns every result.
func replay(pts []point) []trendResult {
	tr := trendTracker{cfg: trendConfig{window: trendWindow(time.Second, 10*time.Minute), warn: 0.90, critical: 0.97}}
	out := make([]trendResult, len(pts))
	for i := range pts {
		out[i] = tr.update(pts[:i+1])
	}
	return out
}

func count(rs []trendResult, trend string) int {
	n := 0
	for _, r := range rs {
		if r.trend == trend {
			n++
		}
	}
	return n
}

func TestTrendSteadyWithNoise(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fs := make([]float64, 600)
	for i := range fs {
		fs[i] = 0.60 + (rng.Float64()-0.5)*0.02 // ±1 point
		if i%97 == 0 {
			fs[i] += 0.05 // a lone glitch now and then
		}
	}
	rs := replay(fracSeries(fs))
	if n := count(rs, TrendClimbing); n != 0 {
		t.Fatalf("flat series with noise read as climbing %d times of %d", n, len(rs))
	}
	if n := count(rs, TrendSpike); n != 0 {
		t.Fatalf("flat series at 60%% read as spike %d times", n)
	}
	if last := rs[len(rs)-1]; last.stc >= 0 {
		t.Fatalf("steady series has seconds_to_critical %v, want < 0", last.stc)
	}
}

func TestTrendLinearLeak(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const start, rate = 0.40, 0.0005 // 0.05 %/s: critical in ~19 min from 40%
	fs := make([]float64, 300)
	for i := range fs {
		fs[i] = start + rate*float64(i) + (rng.Float64()-0.5)*0.006
	}
	rs := replay(fracSeries(fs))
	for i := 30; i < len(rs); i++ {
		if rs[i].trend != TrendClimbing {
			t.Fatalf("sample %d: trend %q, want climbing", i, rs[i].trend)
		}
	}
	for _, i := range []int{60, 150, 299} {
		truth := (0.97 - (start + rate*float64(i))) / rate
		got := rs[i].stc
		if math.Abs(got-truth) > 0.2*truth {
			t.Errorf("sample %d: seconds_to_critical %.0f, truth %.0f (more than 20%% off)", i, got, truth)
		}
		if slope := rs[i].slope / gib80; math.Abs(slope-rate) > 0.2*rate {
			t.Errorf("sample %d: slope %.5f/s, truth %.5f/s", i, slope, rate)
		}
	}
}

func TestTrendStepSpike(t *testing.T) {
	fs := make([]float64, 0, 200)
	for range 60 {
		fs = append(fs, 0.50)
	}
	for range 140 {
		fs = append(fs, 0.95)
	}
	rs := replay(fracSeries(fs))
	for i := 60; i < 63; i++ {
		if rs[i].trend != TrendSpike {
			t.Fatalf("sample %d (jump 50%%→95%%): trend %q, want spike", i, rs[i].trend)
		}
	}
	for i := 63; i < len(rs); i++ {
		if rs[i].trend != TrendSteady {
			t.Fatalf("sample %d (flat at 95%% after the jump): trend %q, want steady (a step is not a leak)", i, rs[i].trend)
		}
	}
	for i := range 60 {
		if rs[i].trend != TrendSteady {
			t.Fatalf("sample %d (flat at 50%%): trend %q", i, rs[i].trend)
		}
	}
}

func TestTrendSpikeNeedsWarnLevel(t *testing.T) {
	fs := []float64{0.20, 0.20, 0.20, 0.45, 0.45} // +25 points but far below warn
	if rs := replay(fracSeries(fs)); count(rs, TrendSpike) != 0 {
		t.Fatalf("jump to 45%% read as spike: %+v", rs)
	}
}

func TestTrendSawtooth(t *testing.T) {
	// vLLM-like allocate/free cycles: 20 s period, 10 points deep, flat mean.
	fs := make([]float64, 600)
	for i := range fs {
		fs[i] = 0.70 + 0.10*float64(i%20)/20
	}
	rs := replay(fracSeries(fs))
	if n := count(rs, TrendClimbing); n != 0 {
		t.Fatalf("sawtooth with a flat mean read as climbing %d times", n)
	}
}

func TestTrendSawtoothOnLeak(t *testing.T) {
	// The same sawtooth riding on a leak is still a leak.
	fs := make([]float64, 300)
	for i := range fs {
		fs[i] = 0.40 + 0.001*float64(i) + 0.03*float64(i%10)/10
	}
	rs := replay(fracSeries(fs))
	if rs[len(rs)-1].trend != TrendClimbing {
		t.Fatalf("sawtooth on a 0.1%%/s leak: trend %q, want climbing", rs[len(rs)-1].trend)
	}
}

func TestTrendClimbThenFlat(t *testing.T) {
	fs := make([]float64, 0, 200)
	for i := range 80 {
		fs = append(fs, 0.40+0.004*float64(i))
	}
	for range 120 {
		fs = append(fs, fs[len(fs)-1])
	}
	rs := replay(fracSeries(fs))
	if rs[79].trend != TrendClimbing {
		t.Fatalf("during the climb: %q", rs[79].trend)
	}
	if got := rs[len(rs)-1].trend; got != TrendSteady {
		t.Fatalf("two minutes flat after a climb: %q, want steady", got)
	}
}

func TestTrendRestart(t *testing.T) {
	// A model load climbs fast; after restart() the fit ignores it.
	fs := make([]float64, 0, 100)
	for i := range 40 {
		fs = append(fs, 0.02*float64(i))
	}
	for range 30 {
		fs = append(fs, 0.80)
	}
	pts := fracSeries(fs)
	tr := trendTracker{cfg: trendConfig{window: time.Minute, warn: 0.9, critical: 0.97}}
	tr.restart(pts[40].at)
	if r := tr.update(pts); r.trend != TrendSteady {
		t.Fatalf("after restart at the plateau: %q, want steady", r.trend)
	}
	tr.restart(time.Time{})
	if r := tr.update(pts[:40]); r.trend != TrendClimbing {
		t.Fatalf("the load itself: %q, want climbing", r.trend)
	}
}

func TestMedian3(t *testing.T) {
	got := median3([]float64{1, 9, 1, 2, 3})
	want := []float64{1, 1, 2, 2, 3}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("median3 = %v, want %v", got, want)
		}
	}
}

func TestFitLine(t *testing.T) {
	slope, sigma := fitLine([]float64{0, 1, 2, 3}, []float64{1, 3, 5, 7})
	if slope != 2 || sigma > 1e-9 {
		t.Fatalf("fitLine = %v, %v; want 2, 0", slope, sigma)
	}
}

func TestTrendWindowFollowsTheHorizon(t *testing.T) {
	for _, c := range []struct{ interval, horizon, want time.Duration }{
		{time.Second, 10 * time.Minute, time.Minute},               // the defaults
		{50 * time.Millisecond, 30 * time.Second, 3 * time.Second}, // a time-scaled setup
		{time.Second, 20 * time.Second, 10 * time.Second},          // never under ten samples
		{10 * time.Second, 10 * time.Minute, 100 * time.Second},    // slow sampling: ten samples
	} {
		if got := trendWindow(c.interval, c.horizon); got != c.want {
			t.Errorf("trendWindow(%s, %s) = %s, want %s", c.interval, c.horizon, got, c.want)
		}
	}
}
