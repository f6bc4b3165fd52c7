package main

import (
	"slices"

	"github.com/vllm-guard/vllm-guard/gpumon"
	"github.com/vllm-guard/vllm-guard/proxy"
	"github.com/vllm-guard/vllm-guard/supervisor"
)

// The proxy sees vLLM through the guard.
var _ proxy.Upstream = (*guard)(nil)

// Target is vLLM's base URL and whether it is ready now.
func (g *guard) Target() (string, bool) {
	st := g.sup.Status()
	_, ep := supervisor.BuildArgv(g.cfg.VLLM.Command, g.extra, st.Rung, g.cfg.VLLM.Host, g.cfg.VLLM.Port)
	return ep.URL(), st.State == supervisor.StateReady
}

// MaxNumSeqs is the rung in force: the proxy's limit follows it.
func (g *guard) MaxNumSeqs() int { return g.sup.Status().Rung.MaxNumSeqs }

// Pressure is true while memory is critical or an OOM is predicted:
// admission halves until the alert clears.
func (g *guard) Pressure() bool {
	return slices.ContainsFunc(g.gpu.Snapshot().Active, func(a gpumon.Alert) bool {
		return a.Name == gpumon.AlertCritical || a.Name == gpumon.AlertPredicted
	})
}
