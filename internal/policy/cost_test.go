package policy

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/admission"
	"github.com/vllm-guard/vllm-guard/internal/cause"
)

const gib = 1 << 30

// series records what a guard would see serving on an 80 GiB GPU at
// utilization util: memory above the budget is base + cost × running, plus
// noise, with running ramping from lo to hi and a few wild samples.
func series(rng *rand.Rand, n int, lo, hi, base, cost, noise, util float64) []admission.CostSample {
	total := 80.0 * gib
	out := make([]admission.CostSample, 0, n)
	for i := 0; i < n; i++ {
		r := math.Round(lo + (hi-lo)*float64(i)/float64(n-1))
		used := util*total + base + cost*r + noise*(rng.Float64()*2-1)
		if i%17 == 5 {
			used += 3 * gib // a reading taken mid-spike: an outlier
		}
		out = append(out, admission.CostSample{Running: r, Above: used - util*total, Total: total})
	}
	return out
}

func costConfig(headroom float64) *Policy {
	cfg := testConfig()
	cfg.Profile.MaxNumSeqs = 256
	cfg.Profile.GPUMemoryUtilization = 0.85
	cfg.Profile.MinGPUMemoryUtilization = 0.85 // utilization stays: only max_num_seqs moves
	cfg.Profile.Headroom = headroom
	return New(cfg, State{}, nil)
}

// After an OOM with a confident model, the next rung is the computed safe
// value (75 % of rung 0 here), where halving alone would give 50 %.
func TestOOMStepsToTheComputedRung(t *testing.T) {
	p := costConfig(0.02)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, s := range series(rng, 80, 0, 220, 0.75*gib, 52<<20, 128<<20, 0.85) {
		p.ObserveCost(s.Running, uint64(s.Above+0.85*s.Total), uint64(s.Total))
	}
	now := time.Unix(1e9, 0)
	p.OnStart(now)
	p.OnReady(now)
	d := p.OnFailure(now.Add(time.Minute), cause.Verdict{Cause: cause.CauseOOM})
	if got := d.Rung.MaxNumSeqs; got < 171 || got > 190 {
		t.Fatalf("next max_num_seqs %d, want 171–190 (90–100%% of the true 190); reason: %s", got, d.Reason)
	}
	if d.Rung.Index != 1 || !strings.Contains(d.Reason, "computed from the cost model") {
		t.Fatalf("rung %+v reason %q", d.Rung, d.Reason)
	}
	// It survives a restart of the guard.
	q := New(p.cfg, p.State(), nil)
	if q.Current() != p.Current() {
		t.Fatalf("resumed on %+v, want %+v", q.Current(), p.Current())
	}
}

func TestOOMWithoutConfidenceHalvesAndSaysWhy(t *testing.T) {
	p := costConfig(0.02)
	for i := 0; i < 30; i++ {
		p.ObserveCost(100, uint64(0.85*80*gib+6*gib), 80*gib)
	}
	now := time.Unix(1e9, 0)
	p.OnStart(now)
	d := p.OnFailure(now, cause.Verdict{Cause: cause.CauseOOM})
	if d.Rung.MaxNumSeqs != 128 || !strings.Contains(d.Reason, "halving ladder (too little spread") {
		t.Fatalf("rung %+v reason %q: want the halving ladder and the reason", d.Rung, d.Reason)
	}
}

// Restore steps up to the computed safe value, not to the rung above.
func TestRestoreGoesToTheComputedValue(t *testing.T) {
	cfg := testConfig()
	cfg.Profile.MinGPUMemoryUtilization = cfg.Profile.GPUMemoryUtilization
	cfg.Profile.Headroom = 0.02
	cfg.Profile.RestoreAfter = time.Minute
	p := New(cfg, State{Rung: 2}, nil) // 64 sequences
	rng := rand.New(rand.NewPCG(9, 10))
	for _, s := range series(rng, 80, 0, 64, 0.75*gib, 52<<20, 64<<20, cfg.Profile.GPUMemoryUtilization) {
		p.ObserveCost(s.Running, uint64(s.Above+cfg.Profile.GPUMemoryUtilization*s.Total), uint64(s.Total))
	}
	now := time.Unix(1e9, 0)
	p.OnStart(now)
	p.OnReady(now)
	r, ok := p.RestoreDue(now.Add(2*time.Minute), 0.5, true)
	if !ok {
		t.Fatal("restore not due")
	}
	// Rung 1 of the ladder is 128; the model says ~190 fit, so 128 stays
	// (never above the rung); from rung 2 the step is to rung 1's 128.
	if r.Index != 1 || r.MaxNumSeqs != 128 {
		t.Fatalf("restore to %+v, want rung 1 with 128", r)
	}
	p.OnRestore(now.Add(2 * time.Minute))
	p.OnReady(now.Add(2 * time.Minute))
	r, ok = p.RestoreDue(now.Add(5*time.Minute), 0.5, true)
	if !ok || r.Index != 0 || r.MaxNumSeqs < 171 || r.MaxNumSeqs > 190 {
		t.Fatalf("second restore to %+v (ok %v), want rung 0 capped at the computed ~190", r, ok)
	}
}

// With the default profile (utilization 0.85, headroom 15 %) there is no
// room left at the next rung's utilization: the computed rung gives up KV
// cache (utilization) before concurrency, and never does worse than the
// halving ladder while utilization can still go down.
func TestComputedRungLowersUtilizationBeforeConcurrency(t *testing.T) {
	cfg := testConfig() // 256, 0.85, step 0.05, floor 0.70, headroom 0.15
	p := New(cfg, State{}, nil)
	rng := rand.New(rand.NewPCG(11, 12))
	const cost = 47 << 20
	for _, s := range series(rng, 80, 0, 230, 0.75*gib, cost, 64<<20, 0.85) {
		p.ObserveCost(s.Running, uint64(s.Above+0.85*s.Total), uint64(s.Total))
	}
	now := time.Unix(1e9, 0)
	p.OnStart(now)
	d := p.OnFailure(now, cause.Verdict{Cause: cause.CauseOOM})
	r := d.Rung
	if r.MaxNumSeqs < 128 || r.MaxNumSeqs >= 256 {
		t.Fatalf("max_num_seqs %d: want at least the ladder's 128 and below 256 (%s)", r.MaxNumSeqs, d.Reason)
	}
	if r.GPUMemoryUtilization >= 0.80 || r.GPUMemoryUtilization < 0.70 {
		t.Fatalf("utilization %.2f: want lowered below the ladder's 0.80, not under the floor 0.70", r.GPUMemoryUtilization)
	}
	peak := r.GPUMemoryUtilization*80*gib + 0.75*gib + float64(r.MaxNumSeqs)*cost
	if peak > 0.85*80*gib {
		t.Fatalf("true peak %.2f GiB is over (1 − headroom) of total (68 GiB)", peak/gib)
	}
	if q := New(cfg, p.State(), nil); q.Current() != r {
		t.Fatalf("resumed on %+v, want %+v", q.Current(), r)
	}
}
