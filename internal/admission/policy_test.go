package admission

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The scene of the admission tests: an 80 GiB device at utilization 0.8,
// 768 MiB above vLLM's budget at rest, 131.25 MiB per running request of
// 2 000 prompt tokens (100 MiB + 16 KiB a token).
const (
	admTotal   = 80 << 30
	admBase    = 768 << 20
	admPerSeq  = 100 << 20
	admPerTok  = 16 << 10
	admTokens  = 2000
	admPerReq  = admPerSeq + admTokens*admPerTok
	admUtil    = 0.8
	admTrueMax = 118 // (80 GiB − 0.8 × 80 GiB − 768 MiB) / 131.25 MiB
)

func admSample(running, tokensEach float64) CostSample {
	return CostSample{Running: running, Tokens: running * tokensEach, Total: admTotal,
		Above: admBase + running*admPerSeq + running*tokensEach*admPerTok}
}

// levels returns two samples at each running level.
func levels(tokensEach float64, rs ...float64) []CostSample {
	var out []CostSample
	for _, r := range rs {
		out = append(out, admSample(r, tokensEach), admSample(r, tokensEach))
	}
	return out
}

func admFacts(m CostModel) Facts {
	return Facts{MaxNumSeqs: 256, Utilization: admUtil, InflightFactor: 1, Headroom: 0.005,
		CriticalFraction: 0.97, Model: m, MeanTokens: admTokens, SecondsToCritical: -1, Horizon: 1, Tick: true, Learning: true}
}

func TestAdmissionBeforeConfidenceIsTheRung(t *testing.T) {
	var a Policy
	f := admFacts(FitAdmission(nil))
	b := a.Step(f)
	if b.Bound != BoundRung || b.Limit != 256 || b.RoomBytes != 0 {
		t.Fatalf("bound %+v, want the rung's 256", b)
	}
	f.Pressure = true
	if b := a.Step(f); b.Bound != BoundPressure || b.Limit != 128 {
		t.Fatalf("under pressure: %+v, want 128 (pressure)", b)
	}
}

func TestAdmissionMemoryBoundHoldsBelowThePointOfFailure(t *testing.T) {
	var a Policy
	a.Seed(levels(admTokens, 100, 105, 110))
	m := FitAdmission(levels(admTokens, 10, 20, 30, 40, 50, 100, 105, 110))
	b := a.Step(admFacts(m))
	if b.Bound != BoundMemory || b.RoomBytes <= 0 {
		t.Fatalf("bound %+v, want memory", b)
	}
	if b.Limit >= admTrueMax || b.Limit*10 < admTrueMax*9 {
		t.Fatalf("limit %d, want below the failure point %d and at least 90 %% of it", b.Limit, admTrueMax)
	}
	if float64(b.Limit)*m.RequestBytes(admTokens) > b.RoomBytes {
		t.Fatalf("limit %d × %.1f MiB exceeds the room %.1f MiB", b.Limit, m.RequestBytes(admTokens)/(1<<20), b.RoomBytes/(1<<20))
	}
}

// A young model (seen up to 40) does not extrapolate: the limit is one step
// past what was seen, and each settled sample at the cap moves it a step.
func TestAdmissionMemoryBoundIsCappedAtWhatWasSeen(t *testing.T) {
	var a Policy
	ss := levels(admTokens, 10, 20, 30, 35, 40)
	a.Seed(ss)
	f := admFacts(FitAdmission(ss))
	b := a.Step(f)
	if b.Bound != BoundMemory || b.Limit != 45 || !strings.Contains(b.Why, "seen without trouble") {
		t.Fatalf("bound %+v, want memory at 45 (40 seen + 5)", b)
	}
	f.Observed = 45
	if b := a.Step(f); b.Limit != 50 {
		t.Fatalf("after a sample at 45: limit %d, want 50", b.Limit)
	}
	f.Observed = 0
	if b := a.Step(f); b.Limit != 50 {
		t.Fatalf("a step without a sample moved the cap: %d", b.Limit)
	}
	// Far past the model's own bound, the model bounds.
	f.Observed = 200
	if b := a.Step(f); b.Limit >= admTrueMax || !strings.Contains(b.Why, "predicted peak") {
		t.Fatalf("at 200 seen: %+v, want the model's bound below %d", b, admTrueMax)
	}
}

func TestAdmissionTrendStepsDownThenReopensWithTheSamples(t *testing.T) {
	var a Policy
	f := admFacts(FitAdmission(nil))
	f.Inflight, f.SecondsToCritical = 80, 0.5
	b := a.Step(f)
	if b.Bound != BoundTrend || b.Limit != 70 {
		t.Fatalf("climbing: %+v, want trend at 70", b)
	}
	f.SecondsToCritical = -1
	if b := a.Step(f); b.Limit != 70 {
		t.Fatalf("no sample: limit %d, want 70 held", b.Limit)
	}
	f.Observed = 69
	if b := a.Step(f); b.Limit != 70 {
		t.Fatalf("after one sample at 69: limit %d, want 70 held (the model needs two at a level)", b.Limit)
	}
	if b := a.Step(f); b.Bound != BoundTrend || b.Limit != 69+8 {
		t.Fatalf("after two samples at 69: %+v, want 77", b)
	}
}

// Pressure beginning before the model is confident steps the limit down to
// 7/8 of what is in flight, once: not a halving of the rung (128 of 256 is
// above the failure at 118), and not again at every step it lasts; the
// limit then reopens with the samples, and the next time pressure begins
// it steps down again.
func TestAdmissionPressureStepsDownFromWhatIsInFlight(t *testing.T) {
	var a Policy
	f := admFacts(FitAdmission(nil))
	f.Inflight = 100
	if b := a.Step(f); b.Bound != BoundRung || b.Limit != 256 {
		t.Fatalf("before pressure: %+v, want the rung's 256", b)
	}
	f.Pressure, f.Tick = true, false // the alert's own step, between samples
	b := a.Step(f)
	if b.Bound != BoundPressure || b.Limit != 87 || !strings.Contains(b.Why, "7/8 of the requests in flight") {
		t.Fatalf("pressure begins at 100 in flight: %+v, want pressure at 87", b)
	}
	f.Tick, f.Inflight = true, 87
	if b := a.Step(f); b.Limit != 87 {
		t.Fatalf("pressure lasting: limit %d, want 87 held (no step down at every step)", b.Limit)
	}
	f.Observed = 87
	a.Step(f)
	if b := a.Step(f); b.Bound != BoundPressure || b.Limit != 87+10 {
		t.Fatalf("after two samples at 87 under pressure: %+v, want 97", b)
	}
	f.Observed, f.Pressure = 0, false
	if b := a.Step(f); b.Limit != 97 {
		t.Fatalf("pressure ended: limit %d, want 97 held", b.Limit)
	}
	f.Pressure, f.Inflight = true, 96
	if b := a.Step(f); b.Limit != 84 {
		t.Fatalf("pressure begins again at 96: limit %d, want 84", b.Limit)
	}
	// A confident model's memory bound is not stepped down by pressure.
	ss := levels(admTokens, 10, 20, 30, 40, 50, 100, 105, 110)
	a2 := Policy{}
	a2.Seed(ss)
	g := admFacts(FitAdmission(ss))
	g.Inflight = 100
	a2.Step(g)
	g.Pressure = true
	if b := a2.Step(g); b.Bound != BoundMemory || b.Limit*10 < admTrueMax*9 {
		t.Fatalf("confident model under pressure: %+v, want the memory bound", b)
	}
}

func TestAdmissionReopensAfterAnOOM(t *testing.T) {
	var a Policy
	f := admFacts(FitAdmission(nil))
	a.OnOOM(f)
	b := a.Step(f)
	if b.Bound != BoundReopening || b.Limit != 16 {
		t.Fatalf("after an OOM: %+v, want reopening at 16", b)
	}
	f.Observed = 16
	if b := a.Step(f); b.Limit != 16 {
		t.Fatalf("after one sample at 16: %d, want 16 held", b.Limit)
	}
	f.Observed = 15 // within the level's tolerance: the level's second
	if b := a.Step(f); b.Limit != 17 {
		t.Fatalf("after two samples at 16 and 15: %d, want 17 (15 + 2)", b.Limit)
	}
	// Without GPU readings there are no samples: it grows while used.
	f.Learning, f.Observed, f.Inflight = false, 0, 17
	if b := a.Step(f); b.Limit != 19 {
		t.Fatalf("unlearning growth: %d, want 19", b.Limit)
	}
	// A confident model takes over from the reopening.
	m := FitAdmission(levels(admTokens, 10, 20, 30, 40, 50))
	f.Model, f.Learning = m, true
	if b := a.Step(f); b.Bound != BoundMemory {
		t.Fatalf("with a confident model: %+v", b)
	}
}

func TestAdmissionOOMWithAConfidentModelStepsTheCapBack(t *testing.T) {
	var a Policy
	ss := levels(admTokens, 10, 20, 30, 40, 80)
	a.Seed(ss)
	f := admFacts(FitAdmission(ss))
	if b := a.Step(f); b.Limit != 90 {
		t.Fatalf("limit %d, want 90", b.Limit)
	}
	a.OnOOM(f)
	if b := a.Step(f); b.Bound != BoundMemory || b.Limit != 70+8 {
		t.Fatalf("after an OOM: %+v, want memory at 78 (70 + 8)", b)
	}
}

func TestSettledSample(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	span := InflightSpan{Since: at(0), Min: 100, Max: 101, MinTokens: 200000, Last: 100, LastTokens: 200000}
	r := Reading{Span: span, Counts: []RunningCount{{AskedAt: at(50), At: at(60), Running: 100}},
		MemReadAt: at(80), Used: admTotal * 0.97, Total: admTotal, Utilization: admUtil}
	s, seen, ok := SettledSample(r)
	if !ok || seen != 101 || s.Running != 100 || s.Tokens != 200000 || math.Abs(s.Above-0.17*admTotal) > 1 {
		t.Fatalf("settled: %+v %v", s, ok)
	}
	for name, edit := range map[string]func(*Reading){
		"memory read before vLLM counted":   func(r *Reading) { r.MemReadAt = at(55) },
		"vLLM counted before the span":      func(r *Reading) { r.Counts[0].AskedAt = at(-10) },
		"vLLM has not caught up":            func(r *Reading) { r.Counts[0].Running = 80 },
		"in flight did not hold still":      func(r *Reading) { r.Span.Min = 90 },
		"no vLLM count":                     func(r *Reading) { r.Counts = nil },
		"no GPU reading":                    func(r *Reading) { r.MemReadAt = time.Time{} },
		"in flight never held still at all": func(r *Reading) { r.Span = InflightSpan{} },
	} {
		r2 := r
		r2.Counts = append([]RunningCount(nil), r.Counts...)
		edit(&r2)
		if _, _, ok := SettledSample(r2); ok {
			t.Errorf("%s: sampled", name)
		}
	}
}

func TestInflightSpanExtends(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := InflightSpan{}.Extend(InflightSpan{Since: t0, Min: 50, Max: 51, MinTokens: 100})
	s = s.Extend(InflightSpan{Since: t0.Add(time.Second), Min: 49, Max: 50, MinTokens: 98})
	if s.Since != t0 || s.Min != 49 || s.Max != 51 || s.MinTokens != 98 || s.Last != 49 {
		t.Fatalf("held still: %+v", s)
	}
	// A jump starts anew at the window.
	t2 := t0.Add(2 * time.Second)
	s = s.Extend(InflightSpan{Since: t2, Min: 60, Max: 61})
	if s.Since != t2 || s.Min != 60 {
		t.Fatalf("after a jump: %+v", s)
	}
	// A window that moved a lot is no span.
	if s = s.Extend(InflightSpan{Since: t2, Min: 60, Max: 90}); s.Still() {
		t.Fatalf("a window from 60 to 90 held still: %+v", s)
	}
}

func TestKeepSampleBoundsEachLevel(t *testing.T) {
	var ss []CostSample
	for i := range 3 * samplesPerLevel {
		ss = KeepSample(ss, CostSample{Running: 10, Above: float64(i)}, 100)
	}
	ss = KeepSample(ss, CostSample{Running: 20}, 100)
	if len(ss) != samplesPerLevel+1 || ss[0].Above != 2*samplesPerLevel {
		t.Fatalf("kept %d samples (oldest at 10: %v), want the newest %d at 10 and the one at 20", len(ss), ss[0].Above, samplesPerLevel)
	}
	for range 10 {
		ss = KeepSample(ss, CostSample{Running: float64(30 + len(ss))}, 10)
	}
	if len(ss) != 10 {
		t.Fatalf("kept %d, want 10", len(ss))
	}
}
