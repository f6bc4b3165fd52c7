package gate

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/proxy"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

// monitorStub publishes GPU snapshots as gpumon.Monitor does: Sampled's
// channel is closed when a snapshot is stored.
type monitorStub struct {
	mu   sync.Mutex
	snap gpumon.Snapshot
	ch   chan struct{}
	vllm vllmstats.Stats
}

func (m *monitorStub) GPU() gpumon.Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap
}

func (m *monitorStub) Sampled() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ch == nil {
		m.ch = make(chan struct{})
	}
	return m.ch
}

// publish stores s and wakes Sampled's readers.
func (m *monitorStub) publish(s gpumon.Snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap = s
	if m.ch != nil {
		close(m.ch)
		m.ch = nil
	}
}

// down: the monitor's queries fail; the snapshot says so and nothing is
// published.
func (m *monitorStub) down() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap.Up = false
}

func (m *monitorStub) VLLM() vllmstats.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vllm
}

func (m *monitorStub) setVLLM(v vllmstats.Stats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vllm = v
}

// proxyStub holds 10 requests of 100 prompt tokens in flight and counts
// the gate's steps (one Notify each).
type proxyStub struct {
	mu    sync.Mutex
	steps int
}

func (p *proxyStub) Stats() proxy.Stats { return proxy.Stats{Inflight: 10} }
func (p *proxyStub) Window() proxy.Window {
	return proxy.Window{MinInflight: 10, MaxInflight: 10, MinTokens: 1000, MeanTokens: 100}
}

func (p *proxyStub) Notify() {
	p.mu.Lock()
	p.steps++
	p.mu.Unlock()
}

func (p *proxyStub) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.steps
}

func reading(at time.Time, used uint64) gpumon.Snapshot {
	const total = 80 << 30
	return gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{Index: 0, Used: used, Total: total,
		Fraction: float64(used) / total, SecondsToCritical: -1, ReadAt: at}}}
}

// The memory-aware limit steps once on each GPU reading the monitor
// publishes and takes at most one sample from it; a late reading is waited
// for, not replaced by a clock of the gate's own. Only while the monitor's
// snapshot is down does the gate step every sample_interval by itself.
func TestGateStepsOnEachGPUReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := config.Default()
		cfg.VLLM.Command = []string{"vllm", "serve", "m"}
		interval := cfg.GPU.SampleInterval.Duration
		mon := &monitorStub{}
		g := New(cfg, nil, Sources{
			Status: func() status.Status {
				return status.Status{State: status.StateReady, Rung: policy.Rung{MaxNumSeqs: 64, GPUMemoryUtilization: 0.8}}
			},
			GPU:     mon.GPU,
			Sampled: mon.Sampled,
			VLLM:    mon.VLLM,
			Publish: func(events.Event) {},
			Log:     zap.NewNop(),
		})
		g.Refresh(g.src.Status())
		store, _, err := state.Open(t.TempDir(), zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		g.EnableMemory(store, nil)
		p := &proxyStub{}
		g.Attach(p)
		samples := func() int {
			g.adm.mu.Lock()
			defer g.adm.mu.Unlock()
			return len(g.adm.samples)
		}
		mon.publish(reading(time.Now(), 70<<30)) // a reading before Run: not a step of its own

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { g.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }() // Run saves admission.json as it ends
		synctest.Wait()
		if n := p.count(); n != 0 {
			t.Fatalf("%d steps before any reading", n)
		}

		// The first reading starts the proxy's window; vLLM counts 10
		// running within it, the second reading comes after that count
		// and makes a sample.
		time.Sleep(interval)
		mon.publish(reading(time.Now(), 70<<30))
		synctest.Wait()
		time.Sleep(interval / 2)
		asked := time.Now()
		mon.setVLLM(vllmstats.Stats{Up: true, Running: 10, AskedAt: asked, ScrapedAt: asked})
		time.Sleep(interval / 2)
		second := time.Now()
		mon.publish(reading(second, 71<<30))
		synctest.Wait()
		if n, s := p.count(), samples(); n != 2 || s != 1 {
			t.Fatalf("after two readings: %d steps, %d samples; want 2 and 1", n, s)
		}
		// The same reading published again is a step but not a second sample.
		time.Sleep(interval)
		mon.publish(reading(second, 71<<30))
		synctest.Wait()
		if n, s := p.count(), samples(); n != 3 || s != 1 {
			t.Fatalf("the same reading again: %d steps, %d samples; want 3 and still 1", n, s)
		}
		// A late reading is waited for: no step of the gate's own while
		// the monitor is up.
		time.Sleep(10 * interval)
		synctest.Wait()
		if n := p.count(); n != 3 {
			t.Fatalf("%d steps in ten intervals without a reading while the GPU is up; want still 3", n)
		}
		mon.publish(reading(time.Now(), 72<<30))
		synctest.Wait()
		if n, s := p.count(), samples(); n != 4 || s != 2 {
			t.Fatalf("a new reading: %d steps, %d samples; want 4 and 2", n, s)
		}

		// The monitor goes down: two intervals after its last reading the
		// gate steps on its own clock, once per interval, taking no sample.
		mon.down()
		time.Sleep(2*interval - interval/2)
		synctest.Wait()
		if n := p.count(); n != 4 {
			t.Fatalf("%d steps within two intervals of the last reading; want 4", n)
		}
		time.Sleep(interval)
		synctest.Wait()
		if n := p.count(); n != 5 {
			t.Fatalf("%d steps two intervals after the last reading with the GPU down; want 5", n)
		}
		time.Sleep(3 * interval)
		synctest.Wait()
		if n, s := p.count(), samples(); n != 8 || s != 2 {
			t.Fatalf("three more intervals down: %d steps, %d samples; want 8 and 2", n, s)
		}
		// Readings again: the gate's clock stops.
		time.Sleep(interval / 4)
		mon.publish(reading(time.Now(), 72<<30))
		synctest.Wait()
		time.Sleep(10 * interval)
		synctest.Wait()
		if n := p.count(); n != 9 {
			t.Fatalf("back up: %d steps; want 9 (the reading's only)", n)
		}
	})
}

// Without a GPU monitor at all the gate steps every sample_interval, after
// the first two: the reopening after an OOM still moves.
func TestGateWithoutAGPUMonitorStepsOnItsOwnClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := config.Default()
		cfg.VLLM.Command = []string{"vllm", "serve", "m"}
		interval := cfg.GPU.SampleInterval.Duration
		g := New(cfg, nil, Sources{
			Status: func() status.Status {
				return status.Status{State: status.StateReady, Rung: policy.Rung{MaxNumSeqs: 64, GPUMemoryUtilization: 0.8}}
			},
			GPU:     func() gpumon.Snapshot { return gpumon.Snapshot{Reason: "GPU metrics unavailable: built without cgo"} },
			VLLM:    func() vllmstats.Stats { return vllmstats.Stats{} },
			Publish: func(events.Event) {},
			Log:     zap.NewNop(),
		})
		g.Refresh(g.src.Status())
		store, _, err := state.Open(t.TempDir(), zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		g.EnableMemory(store, nil)
		p := &proxyStub{}
		g.Attach(p)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { g.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }() // Run saves admission.json as it ends
		time.Sleep(2*interval + interval/2)
		synctest.Wait()
		if n := p.count(); n != 1 {
			t.Fatalf("%d steps in 2.5 intervals with no GPU monitor; want 1", n)
		}
		time.Sleep(3 * interval)
		synctest.Wait()
		if n := p.count(); n != 4 {
			t.Fatalf("%d steps in 5.5 intervals with no GPU monitor; want 4", n)
		}
	})
}
