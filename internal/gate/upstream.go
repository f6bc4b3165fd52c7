// Package gate is where the proxy meets the supervisor and the GPU. It
// keeps the answers the proxy asks on every request ready (vLLM's address,
// whether it is ready, the rung in force, memory pressure, how long vLLM is
// away) and, with the proxy on, wires the memory-aware limit: GPU samples
// paired with the requests in flight, kept in admission.json, fed to the
// pure decisions of internal/admission (the fit, and the bound its Policy
// steps to from the fit, the rung, the trend and the alerts).
// The guard (cmd/vllm-guard) wires it; the proxy reads it through
// proxy.Upstream and proxy.Admitter.
package gate

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/proxy"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

// The proxy sees vLLM through the gate. It asks on every request, so the
// answers are kept ready in atomics, refreshed on each state change and
// each memory alert, not computed per request.
var (
	_ proxy.Upstream = (*Gate)(nil)
	_ proxy.Admitter = (*Gate)(nil)
	_ proxy.Outlook  = (*Gate)(nil)
)

// Sources are what the gate reads: the supervisor's status, the GPU
// monitor's and vLLM's last samples, and where it says a change of bound.
type Sources struct {
	Status func() status.Status
	GPU    func() gpumon.Snapshot
	// Sampled is the GPU monitor's (gpumon.Monitor.Sampled): a channel
	// closed when its next reading is in GPU's snapshot. The memory-aware
	// limit steps on each reading (Gate.Run); nil: there are none.
	Sampled func() <-chan struct{}
	VLLM    func() vllmstats.Stats
	Publish func(events.Event)
	Log     *zap.Logger
}

// Proxy is what the memory-aware limit asks of the proxy.
type Proxy interface {
	Stats() proxy.Stats
	Window() proxy.Window
	Notify()
}

type upstreamView struct {
	url        string
	ready      bool
	maxNumSeqs int
	rung       policy.Rung
	away       awayView
}

// awayView is what the proxy's Outlook is computed from: the status's
// state and timings when it was refreshed.
type awayView struct {
	state       status.State
	reason      string
	startedAt   time.Time // the launch in progress (starting)
	nextStartAt time.Time // the launch to come (backoff)
	lastTTR     time.Duration
	longestTTR  time.Duration
	cause       cause.Cause // of the last failure, when it came after the last ready
	rung        int
}

// Gate is vLLM as the proxy sees it.
type Gate struct {
	cfg      *config.Config
	extra    []string
	src      Sources
	proxy    Proxy   // nil until Attach
	adm      *memory // the proxy's memory-aware limit; nil until EnableMemory
	view     atomic.Pointer[upstreamView]
	pressure atomic.Bool
}

// New is a gate for vLLM run with cfg and the extra arguments; Refresh
// must be called once before the proxy asks.
func New(cfg *config.Config, extra []string, src Sources) *Gate {
	return &Gate{cfg: cfg, extra: extra, src: src}
}

// Attach is the proxy the memory-aware limit reads and wakes.
func (g *Gate) Attach(p Proxy) { g.proxy = p }

// Refresh records vLLM's address, readiness and rung from st.
func (g *Gate) Refresh(st status.Status) { g.RefreshOn(st, g.cfg.VLLM.Port) }

// RefreshOn is Refresh for the vLLM that listens on port: with a warm
// standby the proxy's vLLM is whichever of the two serves.
func (g *Gate) RefreshOn(st status.Status, port int) {
	_, ep := launch.BuildArgv(g.cfg.VLLM.Command, g.extra, st.Rung, g.cfg.VLLM.Host, port)
	away := awayView{state: st.State, reason: st.Reason, startedAt: st.StartedAt, nextStartAt: st.NextStartAt,
		lastTTR: st.TimeToReady, longestTTR: st.LongestTimeToReady, rung: st.Rung.Index}
	if f := st.LastFailure; f != nil && f.Time.After(st.ReadySince) {
		away.cause = f.Verdict.Cause
	}
	g.view.Store(&upstreamView{url: ep.URL(), ready: st.State == status.StateReady, maxNumSeqs: st.Rung.MaxNumSeqs, rung: st.Rung, away: away})
	if g.adm != nil {
		g.stepAdmission()
	}
}

// SetPressure: memory critical or an OOM predicted halves admission.
func (g *Gate) SetPressure(inForce []alerts.Event) {
	g.pressure.Store(slices.ContainsFunc(inForce, func(a alerts.Event) bool {
		return a.Alert == alerts.GPUMemoryCritical || a.Alert == alerts.OOMPredicted
	}))
	if g.adm != nil {
		g.stepAdmission()
	}
}

// URL is vLLM's base URL on the rung in force.
func (g *Gate) URL() string { return g.view.Load().url }

// Target is vLLM's base URL and whether it is ready now.
func (g *Gate) Target() (string, bool) {
	v := g.view.Load()
	return v.url, v.ready
}

// MaxNumSeqs is the rung in force: the proxy's limit follows it.
func (g *Gate) MaxNumSeqs() int { return g.view.Load().maxNumSeqs }

// Pressure is true while memory is critical or an OOM is predicted.
func (g *Gate) Pressure() bool { return g.pressure.Load() }

// holdFactor: a request is held for the longest time to ready seen, with
// this margin (issue 30), and at least proxy.DefaultHoldLimit.
const holdFactor = 1.5

// Outlook says what vLLM's absence means to a request the proxy holds:
// loading, restarting or backing off is coming back; failed (gave up),
// stopped, or stopping for good (the guard's own stop) is not. readyIn is
// the expected time until ready: the rest of the backoff, then the longest
// start seen (the last one when that is all there is), less the part of
// the start already done.
func (g *Gate) Outlook() (comingBack bool, readyIn, holdLimit time.Duration, why string) {
	a := g.view.Load().away
	expect := max(a.longestTTR, a.lastTTR)
	holdLimit = max(time.Duration(float64(expect)*holdFactor), proxy.DefaultHoldLimit)
	if d := g.cfg.Proxy.HoldTimeout.Duration; d > 0 {
		holdLimit = d
	}
	now := time.Now()
	switch a.state {
	case status.StateReady:
		return true, 0, holdLimit, "vLLM is ready"
	case status.StateFailed:
		return false, 0, holdLimit, "vLLM failed and the guard gave up: " + a.reason
	case status.StateStopped:
		return false, 0, holdLimit, "vLLM is stopped"
	case status.StateStopping:
		if status.FinalStop(a.reason) {
			return false, 0, holdLimit, "vllm-guard is stopping"
		}
		readyIn = expect
	case status.StateBackoff:
		readyIn = max(a.nextStartAt.Sub(now), 0) + expect
	case status.StateStarting:
		readyIn = expect
		if !a.startedAt.IsZero() {
			readyIn = max(expect-now.Sub(a.startedAt), 0)
		}
	default: // waiting_gpu
		readyIn = expect
	}
	switch {
	case a.state == status.StateStopping:
		why = "vLLM restarting (" + a.reason + ")"
	case a.cause != "":
		why = fmt.Sprintf("vLLM restarting after %s, rung %d", a.cause, a.rung)
	default:
		why = fmt.Sprintf("vLLM loading, rung %d", a.rung)
	}
	return true, readyIn, holdLimit, why
}
