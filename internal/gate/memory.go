package gate

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/admission"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Memory-aware admission (the proxy's limit). Each GPU sample pairs the
// proxy's requests in flight and their prompt tokens with the memory of the
// fullest device; admission.FitAdmission fits them and Policy turns
// the fit, the rung, the trend and the alerts into the bound the proxy
// applies. The samples are saved next to state.json (admission.json) so a
// restarted guard admits by memory from its first request; without that
// file the rung's cost samples from state.json seed it.

const admissionFile = "admission.json"

// admissionSaveEvery: samples between two saves of admission.json.
const admissionSaveEvery = 20

// memory is the memory-aware limit's state.
type memory struct {
	mu         sync.Mutex
	dec        admission.Policy
	samples    []admission.CostSample // newest last, at most maxAdmissionSamples
	model      admission.CostModel
	meanTokens float64 // prompt tokens of a typical recent request (moving average)
	bound      admission.Bound
	path       string // "" when the state folder is not persistent
	unsaved    int
	// What pairs a GPU reading with the requests in flight: the span over
	// which they held still, where the last window began, vLLM's last two
	// counts, and the reading the last sample used (each is used once).
	span     admission.InflightSpan
	winStart time.Time
	counts   [2]admission.RunningCount
	lastRead time.Time
	// What the event stream last said (a KindAdmission on each change).
	saidBound     string
	saidConfident bool
}

// noteLocked is the event to publish, after unlocking, when the bound or
// the model's confidence changed; nil otherwise.
func (a *memory) noteLocked() *events.Event {
	b := a.bound
	if b.Bound == a.saidBound && a.model.Confident == a.saidConfident {
		return nil
	}
	a.saidBound, a.saidConfident = b.Bound, a.model.Confident
	return &events.Event{Kind: events.KindAdmission,
		Admission: &events.Admission{Bound: b.Bound, Limit: b.Limit, Why: b.Why, Confident: a.model.Confident}}
}

// say publishes e when not nil (never with a.mu held: handlers step
// admission in turn).
func (g *Gate) say(e *events.Event) {
	if e != nil {
		g.src.Publish(*e)
	}
}

const maxAdmissionSamples = 600

// EnableMemory turns the memory-aware limit on (the proxy is on): its
// samples from the state folder, else seed (the rung's cost samples).
func (g *Gate) EnableMemory(store *state.Store, seed []admission.CostSample) {
	g.adm = loadMemory(store, seed, g.src.Log.Named("admission"))
	g.stepAdmission()
}

func loadMemory(store *state.Store, seed []admission.CostSample, log *zap.Logger) *memory {
	a := &memory{}
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
	a.model = admission.FitAdmission(a.samples)
	a.dec.Seed(a.samples)
	return a
}

// facts are the admission inputs that do not come from a sample.
func (g *Gate) admissionFacts(tick bool) admission.Facts {
	v := g.view.Load()
	f := admission.Facts{MaxNumSeqs: v.rung.MaxNumSeqs, Utilization: v.rung.GPUMemoryUtilization, InflightFactor: g.cfg.Proxy.InflightFactor, Headroom: g.cfg.Profile.Headroom,
		CriticalFraction: g.cfg.GPU.CriticalFraction, Pressure: g.pressure.Load(), SecondsToCritical: -1,
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
func (g *Gate) stepAdmission() {
	a := g.adm
	f := g.admissionFacts(false)
	a.mu.Lock()
	f.Model, f.MeanTokens = a.model, a.meanTokens
	a.bound = a.dec.Step(f)
	e := a.noteLocked()
	a.mu.Unlock()
	g.say(e)
}

// Admission is the bound the proxy applies now.
func (g *Gate) Admission() admission.Bound {
	g.adm.mu.Lock()
	defer g.adm.mu.Unlock()
	return g.adm.bound
}

// OnOOM: vLLM ran out of memory (nothing without the memory-aware limit).
func (g *Gate) OnOOM() {
	a := g.adm
	if a == nil {
		return
	}
	f := g.admissionFacts(false)
	a.mu.Lock()
	f.Model, f.MeanTokens = a.model, a.meanTokens
	a.dec.OnOOM(f)
	a.bound = a.dec.Step(f)
	e := a.noteLocked()
	a.mu.Unlock()
	g.say(e)
}

// Run steps the memory-aware limit on each GPU reading until ctx ends,
// with the memory-aware limit on and the proxy attached. The GPU monitor
// is the one sampler of GPU memory: admission steps when a reading is in
// its snapshot (Sources.Sampled), not on a clock of its own, so that each
// reading is one step, none seen twice or missed.
//
// While the monitor has no readings to give (no NVML, or its queries
// failing: its snapshot is down), the gate steps every sample_interval on
// its own clock instead. No sample is taken then, but the limit still
// reopens step by step after an OOM while the requests use it
// (Policy.Step). That clock is a timer that fires only when no reading
// came for two sample intervals, and it steps only while the snapshot is
// down: a reading that is merely late is waited for.
func (g *Gate) Run(ctx context.Context) {
	// The bound at start, on the stream (EnableMemory's came before the
	// stream's consumers were all attached).
	g.adm.mu.Lock()
	g.adm.saidBound = ""
	e := g.adm.noteLocked()
	g.adm.mu.Unlock()
	g.say(e)
	defer g.saveAdmission()
	interval := g.cfg.GPU.SampleInterval.Duration
	sampled := g.nextReading()
	quiet := time.NewTimer(2 * interval)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sampled:
			// Asked again before the snapshot is read: a reading stored
			// during this step wakes the next one.
			sampled = g.nextReading()
			quiet.Reset(2 * interval)
		case <-quiet.C:
			quiet.Reset(interval)
			if g.src.GPU().Up {
				continue // a reading is late, not missing: step on it when it comes
			}
		}
		g.admissionTick()
		g.proxy.Notify()
	}
}

// nextReading is closed when the GPU monitor's next reading is in its
// snapshot; nil (never ready) without a monitor.
func (g *Gate) nextReading() <-chan struct{} {
	if g.src.Sampled == nil {
		return nil
	}
	return g.src.Sampled()
}

func (g *Gate) admissionTick() {
	now := time.Now()
	st := g.src.Status()
	win := g.proxy.Window()
	snap := g.src.GPU()
	v := g.src.VLLM()
	f := g.admissionFacts(true)
	var used, total uint64
	var readAt time.Time
	best := -1.0
	for _, d := range snap.Devices {
		if d.Total > 0 && d.Fraction > best {
			best, used, total, readAt = d.Fraction, d.Used, d.Total, d.ReadAt
		}
		if d.SecondsToCritical >= 0 && (f.SecondsToCritical < 0 || d.SecondsToCritical < f.SecondsToCritical) {
			f.SecondsToCritical = d.SecondsToCritical
		}
	}
	a := g.adm
	a.mu.Lock()
	var e *events.Event
	defer func() { g.say(e) }()
	defer a.mu.Unlock()
	if win.MeanTokens > 0 {
		if a.meanTokens == 0 {
			a.meanTokens = win.MeanTokens
		} else {
			a.meanTokens += (win.MeanTokens - a.meanTokens) / 8
		}
	}
	serving := st.State == status.StateReady
	if !a.winStart.IsZero() && serving {
		a.span = a.span.Extend(admission.InflightSpan{Since: a.winStart, Min: win.MinInflight, Max: win.MaxInflight, MinTokens: win.MinTokens})
	} else {
		a.span = admission.InflightSpan{}
	}
	a.winStart = now
	if v.Up && !v.AskedAt.Equal(a.counts[1].AskedAt) {
		a.counts = [2]admission.RunningCount{a.counts[1], {AskedAt: v.AskedAt, At: v.ScrapedAt, Running: v.Running}}
	}
	f.Learning = snap.Up && best >= 0
	if serving && f.Learning && readAt.After(a.lastRead) {
		sample, seen, ok := admission.SettledSample(admission.Reading{Span: a.span, Counts: a.counts[:], MemReadAt: readAt,
			Used: float64(used), Total: float64(total), Utilization: st.Rung.GPUMemoryUtilization})
		if ok {
			a.lastRead = readAt
			f.Observed = seen
			a.addSampleLocked(sample, g.src.Log)
		}
	}
	f.Model, f.MeanTokens = a.model, a.meanTokens
	a.bound = a.dec.Step(f)
	e = a.noteLocked()
	g.src.Log.Debug("admission step", zap.Int("limit", a.bound.Limit), zap.String("bound", a.bound.Bound), zap.Int("observed", f.Observed),
		zap.Int("seen", a.dec.Seen()), zap.Int("span_min", a.span.Min), zap.Int("span_max", a.span.Max), zap.Bool("span_still", a.span.Still()),
		zap.Int("win_min", win.MinInflight), zap.Int("win_max", win.MaxInflight), zap.Float64("vllm_running", v.Running),
		zap.Int("samples", len(a.samples)), zap.Bool("confident", a.model.Confident))
}

func (a *memory) addSampleLocked(s admission.CostSample, log *zap.Logger) {
	a.samples = admission.KeepSample(a.samples, s, maxAdmissionSamples)
	was := a.model.Confident
	a.model = admission.FitAdmission(a.samples)
	if a.model.Confident && !was {
		log.Info("admission cost model confident: the proxy admits by predicted memory",
			zap.Float64("per_seq_mib", a.model.PerSeq/(1<<20)), zap.Float64("per_prompt_token_kib", a.model.PerToken/(1<<10)),
			zap.Int("samples", a.model.Samples))
	}
	if a.unsaved++; a.unsaved >= admissionSaveEvery {
		a.saveLocked(log)
	}
}

func (g *Gate) saveAdmission() {
	g.adm.mu.Lock()
	defer g.adm.mu.Unlock()
	g.adm.saveLocked(g.src.Log)
}

func (a *memory) saveLocked(log *zap.Logger) {
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
