package main

import (
	"slices"
	"sync/atomic"

	"github.com/vllm-guard/vllm-guard/alerts"
	"github.com/vllm-guard/vllm-guard/policy"
	"github.com/vllm-guard/vllm-guard/proxy"
	"github.com/vllm-guard/vllm-guard/supervisor"
)

// The proxy sees vLLM through the guard. It asks on every request, so the
// answers are kept ready in atomics, refreshed on each state change and
// each memory alert, not computed per request.
var _ proxy.Upstream = (*guard)(nil)

type upstreamView struct {
	url        string
	ready      bool
	maxNumSeqs int
	rung       policy.Rung
}

type upstream struct {
	view     atomic.Pointer[upstreamView]
	pressure atomic.Bool
}

// refreshUpstream records vLLM's address, readiness and rung from st.
func (g *guard) refreshUpstream(st supervisor.Status) {
	_, ep := supervisor.BuildArgv(g.cfg.VLLM.Command, g.extra, st.Rung, g.cfg.VLLM.Host, g.cfg.VLLM.Port)
	g.up.view.Store(&upstreamView{url: ep.URL(), ready: st.State == supervisor.StateReady, maxNumSeqs: st.Rung.MaxNumSeqs, rung: st.Rung})
	if g.adm != nil {
		g.stepAdmission()
	}
}

// refreshPressure: memory critical or an OOM predicted halves admission.
func (g *guard) refreshPressure() {
	g.up.pressure.Store(slices.ContainsFunc(g.alert.InForce(), func(a alerts.Event) bool {
		return a.Alert == alerts.GPUMemoryCritical || a.Alert == alerts.OOMPredicted
	}))
	if g.adm != nil {
		g.stepAdmission()
	}
}

// Target is vLLM's base URL and whether it is ready now.
func (g *guard) Target() (string, bool) {
	v := g.up.view.Load()
	return v.url, v.ready
}

// MaxNumSeqs is the rung in force: the proxy's limit follows it.
func (g *guard) MaxNumSeqs() int { return g.up.view.Load().maxNumSeqs }

// Pressure is true while memory is critical or an OOM is predicted.
func (g *guard) Pressure() bool { return g.up.pressure.Load() }
