package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/policy"
	"github.com/vllm-guard/vllm-guard/state"
	"github.com/vllm-guard/vllm-guard/supervisor"
)

// Memory-aware admission (the proxy's limit). Each GPU sample pairs the
// proxy's requests in flight and their prompt tokens with the memory of the
// fullest device; policy.FitAdmission fits them and policy.Admission turns
// the fit, the rung, the trend and the alerts into the bound the proxy
// applies. The samples are saved next to state.json (admission.json) so a
// restarted guard admits by memory from its first request; without that
// file the rung's cost samples from state.json seed it.

const admissionFile = "admission.json"

// admissionSaveEvery: samples between two saves of admission.json.
const admissionSaveEvery = 20

type admission struct {
	mu         sync.Mutex
	dec        policy.Admission
	samples    []policy.CostSample // newest last, at most maxAdmissionSamples
	model      policy.CostModel
	meanTokens float64 // prompt tokens of a typical recent request (moving average)
	bound      policy.AdmissionBound
	path       string // "" when the state folder is not persistent
	unsaved    int
}

const maxAdmissionSamples = 600

func newAdmission(store *state.Store, seed []policy.CostSample, log *zap.Logger) *admission {
	a := &admission{}
	if store.Persistent() {
		a.path = filepath.Join(store.Dir(), admissionFile)
		data, err := os.ReadFile(a.path)
		switch {
		case err == nil:
			if err := json.Unmarshal(data, &a.samples); err != nil {
				log.Warn("admission samples unreadable; learning anew", zap.String("path", a.path), zap.Error(err))
				a.samples = nil
			}
		case !errors.Is(err, os.ErrNotExist):
			log.Warn("admission samples unreadable; learning anew", zap.String("path", a.path), zap.Error(err))
		}
	}
	if a.samples == nil {
		a.samples = slices.Clone(seed)
	}
	a.model = policy.FitAdmission(a.samples)
	return a
}

// facts are the admission inputs that do not come from a sample.
func (g *guard) admissionFacts(tick bool) policy.AdmissionFacts {
	v := g.up.view.Load()
	f := policy.AdmissionFacts{Rung: v.rung, InflightFactor: g.cfg.Proxy.InflightFactor, Headroom: g.cfg.Profile.Headroom,
		CriticalFraction: g.cfg.GPU.CriticalFraction, Pressure: g.up.pressure.Load(), SecondsToCritical: -1,
		Horizon: admissionHorizon(g.cfg.GPU.SampleInterval.Duration).Seconds()}
	if g.proxy != nil {
		f.Inflight = g.proxy.Stats().Inflight
	}
	f.Tick = tick
	return f
}

// admissionHorizon: the trend steps admission down when it predicts
// critical within ten samples.
func admissionHorizon(sample time.Duration) time.Duration { return 10 * sample }

// stepAdmission recomputes the bound (a change of rung or alerts); it
// does not take a sample.
func (g *guard) stepAdmission() {
	a := g.adm
	f := g.admissionFacts(false)
	a.mu.Lock()
	f.Model, f.MeanTokens = a.model, a.meanTokens
	a.bound = a.dec.Step(f)
	a.mu.Unlock()
}

// Admission is the bound the proxy applies now.
func (g *guard) Admission() policy.AdmissionBound {
	g.adm.mu.Lock()
	defer g.adm.mu.Unlock()
	return g.adm.bound
}

// admissionOOM: vLLM ran out of memory.
func (g *guard) admissionOOM() {
	a := g.adm
	f := g.admissionFacts(false)
	a.mu.Lock()
	f.Model, f.MeanTokens = a.model, a.meanTokens
	a.dec.OnOOM(f)
	a.bound = a.dec.Step(f)
	a.mu.Unlock()
}

// sampleAdmission runs one sample each sample_interval while the proxy is on.
func (g *guard) sampleAdmission(ctx context.Context) {
	t := time.NewTicker(g.cfg.GPU.SampleInterval.Duration)
	defer t.Stop()
	defer g.saveAdmission()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.admissionTick()
			g.proxy.Notify()
		}
	}
}

func (g *guard) admissionTick() {
	st := g.sup.Status()
	win := g.proxy.Window()
	snap := g.gpu.Snapshot()
	f := g.admissionFacts(true)
	var used, total uint64
	best := -1.0
	for _, d := range snap.Devices {
		if d.Total > 0 && d.Fraction > best {
			best, used, total = d.Fraction, d.Used, d.Total
		}
		if d.SecondsToCritical >= 0 && (f.SecondsToCritical < 0 || d.SecondsToCritical < f.SecondsToCritical) {
			f.SecondsToCritical = d.SecondsToCritical
		}
	}
	a := g.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	if win.MeanTokens > 0 {
		if a.meanTokens == 0 {
			a.meanTokens = win.MeanTokens
		} else {
			a.meanTokens += (win.MeanTokens - a.meanTokens) / 8
		}
	}
	// A sample only while vLLM serves, and only when what was in flight
	// held still (within a tenth) over the interval, and vLLM's own count
	// (its last scrape) agrees with it: requests the proxy has let through
	// take a moment to reach vLLM's batch, and memory follows the batch.
	// Then the memory reading, taken at some moment in the interval, for the memory reading (taken at
	// some moment in it) to belong to it; the fewest in flight are paired
	// with it, which errs on the side of a higher cost.
	v := g.stats.Latest()
	still := win.MaxInflight-win.MinInflight <= max(2, win.MaxInflight/10)
	caughtUp := v.Up && math.Abs(v.Running-float64(win.MinInflight)) <= float64(max(2, win.MaxInflight/10))
	if st.State == supervisor.StateReady && snap.Up && best >= 0 && still && caughtUp {
		util := st.Rung.GPUMemoryUtilization
		a.samples = append(a.samples, policy.CostSample{Running: float64(win.MinInflight), Tokens: win.MinTokens,
			Above: float64(used) - util*float64(total), Total: float64(total)})
		if n := len(a.samples); n > maxAdmissionSamples {
			a.samples = append(a.samples[:0], a.samples[n-maxAdmissionSamples:]...)
		}
		was := a.model.Confident
		a.model = policy.FitAdmission(a.samples)
		if a.model.Confident && !was {
			g.log.Info("admission cost model confident: the proxy admits by predicted memory",
				zap.Float64("per_seq_mib", a.model.PerSeq/(1<<20)), zap.Float64("per_prompt_token_kib", a.model.PerToken/(1<<10)),
				zap.Int("samples", a.model.Samples))
		}
		if a.unsaved++; a.unsaved >= admissionSaveEvery {
			a.saveLocked(g.log)
		}
	}
	f.Model, f.MeanTokens = a.model, a.meanTokens
	a.bound = a.dec.Step(f)
}

func (g *guard) saveAdmission() {
	g.adm.mu.Lock()
	defer g.adm.mu.Unlock()
	g.adm.saveLocked(g.log)
}

func (a *admission) saveLocked(log *zap.Logger) {
	a.unsaved = 0
	if a.path == "" {
		return
	}
	data, err := json.Marshal(a.samples)
	if err == nil {
		err = state.WriteFileAtomic(a.path, data, 0o640)
	}
	if err != nil {
		log.Warn("could not save the admission samples: a restarted guard relearns them", zap.String("path", a.path), zap.Error(err))
	}
}
