package admission

import (
	"testing"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// The gate answers the proxy from the last status and alerts it was given;
// with the memory-aware limit on, a change of rung or pressure is a new
// bound on the event stream.
func TestGateFollowsStatusAndPressure(t *testing.T) {
	cfg := config.Default()
	cfg.VLLM.Command = []string{"vllm", "serve", "m"}
	cfg.VLLM.Host, cfg.VLLM.Port = "127.0.0.1", 8123
	var said []events.Event
	g := New(cfg, nil, Sources{Publish: func(e events.Event) { said = append(said, e) }, Log: zap.NewNop()})

	rung := policy.Rung{Index: 1, MaxNumSeqs: 16, GPUMemoryUtilization: 0.8}
	g.Refresh(status.Status{State: status.StateStarting, Rung: rung})
	if url, ready := g.Target(); url != "http://127.0.0.1:8123" || ready {
		t.Errorf("Target() = %q, %v; want http://127.0.0.1:8123, not ready", url, ready)
	}
	if n := g.MaxNumSeqs(); n != 16 {
		t.Errorf("MaxNumSeqs() = %d, want the rung's 16", n)
	}
	g.Refresh(status.Status{State: status.StateReady, Rung: rung})
	if _, ready := g.Target(); !ready {
		t.Error("Target() not ready after a ready status")
	}

	g.SetPressure([]alerts.Event{{Alert: alerts.GPUMemoryWarn, Active: true}})
	if g.Pressure() {
		t.Error("a warning is pressure; only critical memory or a predicted OOM is")
	}
	g.SetPressure([]alerts.Event{{Alert: alerts.OOMPredicted, Active: true}})
	if !g.Pressure() {
		t.Error("a predicted OOM is not pressure")
	}
	g.OnOOM() // the memory-aware limit is off: nothing to step
	if len(said) != 0 {
		t.Fatalf("without the memory-aware limit the gate said %v", said)
	}

	store, _, err := state.Open(t.TempDir(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	g.EnableMemory(store, nil)
	if len(said) != 1 || said[0].Kind != events.KindAdmission || said[0].Admission.Bound != g.Admission().Bound {
		t.Fatalf("enabling the memory-aware limit said %+v; want one admission event with the bound in force %+v", said, g.Admission())
	}
}
