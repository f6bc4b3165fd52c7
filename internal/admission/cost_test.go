package admission

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

const gib = 1 << 30

// series records what a guard would see serving on an 80 GiB GPU at
// utilization util: memory above the budget is base + cost × running, plus
// noise, with running ramping from lo to hi and a few wild samples.
func series(rng *rand.Rand, n int, lo, hi, base, cost, noise, util float64) []CostSample {
	total := 80.0 * gib
	out := make([]CostSample, 0, n)
	for i := 0; i < n; i++ {
		r := math.Round(lo + (hi-lo)*float64(i)/float64(n-1))
		used := util*total + base + cost*r + noise*(rng.Float64()*2-1)
		if i%17 == 5 {
			used += 3 * gib // a reading taken mid-spike: an outlier
		}
		out = append(out, CostSample{Running: r, Above: used - util*total, Total: total})
	}
	return out
}

func TestFitCostOnANoisySeries(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const cost = 52 << 20
	m := FitCost(series(rng, 120, 0, 220, 0.75*gib, cost, 256<<20, 0.85))
	if !m.Confident {
		t.Fatalf("not confident: %s", m.Why)
	}
	if rel := math.Abs(m.PerSeq-cost) / cost; rel > 0.05 {
		t.Fatalf("per-sequence cost %.1f MiB, truth %.1f MiB (%.0f%% off)", m.PerSeq/(1<<20), float64(cost)/(1<<20), rel*100)
	}
	if math.Abs(m.Base-0.75*gib) > 0.25*gib {
		t.Fatalf("base %.2f GiB, truth 0.75 GiB", m.Base/gib)
	}
	// Truth at 2 % headroom: (0.98·80 − 0.85·80 − 0.75) GiB / 52 MiB = 190.
	if safe := m.SafeMaxNumSeqs(0.85, 0.02); safe < 171 || safe > 190 {
		t.Fatalf("safe max_num_seqs %d, want within 90–100%% of the truth 190", safe)
	}
	if d := m.Describe(0.85, 0.02); !strings.Contains(d, "MiB per running sequence above") {
		t.Fatalf("description %q", d)
	}
}

func TestFitCostTooLittleSpread(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	m := FitCost(series(rng, 60, 100, 104, 0.75*gib, 52<<20, 64<<20, 0.85))
	if m.Confident || !strings.Contains(m.Why, "too little spread") {
		t.Fatalf("confident %v, why %q: want not confident for too little spread", m.Confident, m.Why)
	}
	if m.SafeMaxNumSeqs(0.85, 0.15) != 0 {
		t.Fatal("an unconfident model must not compute a profile")
	}
	if FitCost(nil).Confident {
		t.Fatal("no samples, yet confident")
	}
}

func TestFitCostNoGrowthIsNotConfident(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m := FitCost(series(rng, 60, 0, 200, 0.75*gib, 0, 64<<20, 0.85))
	if m.Confident {
		t.Fatalf("flat memory yet confident: %+v", m)
	}
}
