package gate

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"github.com/vllm-guard/vllm-guard/internal/cause"
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

// The gate tells the proxy what vLLM's absence means: a restart is held
// for up to 1.5 × the longest start seen (at least 2 min), with the rest
// of the backoff and the start as the expected wait; giving up or the
// guard's own stop is not coming back.
func TestGateOutlook(t *testing.T) {
	cfg := config.Default()
	cfg.VLLM.Command = []string{"vllm", "serve", "m"}
	g := New(cfg, nil, Sources{Log: zap.NewNop()})
	rung := policy.Rung{Index: 1, MaxNumSeqs: 16, GPUMemoryUtilization: 0.8}
	ready := time.Now().Add(-time.Hour)
	oom := &status.Failure{Time: time.Now(), Verdict: cause.Verdict{Cause: cause.CauseOOM}}
	next := time.Now().Add(30 * time.Second)
	for _, tc := range []struct {
		name                 string
		st                   status.Status
		comingBack           bool
		minReadyIn, maxReady time.Duration
		hold                 time.Duration
		why                  string
	}{
		{"backoff after an OOM", status.Status{State: status.StateBackoff, Rung: rung, NextStartAt: next, ReadySince: ready,
			LastFailure: oom, LongestTimeToReady: 4 * time.Minute}, true, 4 * time.Minute, 4*time.Minute + 30*time.Second, 6 * time.Minute, "after oom, rung 1"},
		{"first load, nothing learned", status.Status{State: status.StateStarting, Rung: rung, StartedAt: time.Now()},
			true, 0, 0, 2 * time.Minute, "loading"},
		{"a planned restart", status.Status{State: status.StateStopping, Reason: "restart requested", Rung: rung, TimeToReady: time.Minute},
			true, time.Minute, time.Minute, 2 * time.Minute, "restart requested"},
		{"gave up", status.Status{State: status.StateFailed, Reason: "gave up: 5 failures"}, false, 0, 0, 2 * time.Minute, "gave up"},
		{"the guard stops", status.Status{State: status.StateStopping, Reason: "stop requested: waiting for 3 requests"}, false, 0, 0, 2 * time.Minute, "stopping"},
	} {
		g.Refresh(tc.st)
		back, readyIn, hold, why := g.Outlook()
		if back != tc.comingBack || readyIn < tc.minReadyIn || readyIn > tc.maxReady || hold != tc.hold || !strings.Contains(why, tc.why) {
			t.Errorf("%s: Outlook() = %v, %s, %s, %q; want %v, %s..%s, %s, %q", tc.name, back, readyIn, hold, why,
				tc.comingBack, tc.minReadyIn, tc.maxReady, tc.hold, tc.why)
		}
	}
	cfg.Proxy.HoldTimeout = config.Duration{Duration: time.Hour}
	if _, _, hold, _ := g.Outlook(); hold != time.Hour {
		t.Errorf("hold limit %s with [proxy] hold_timeout = 1h", hold)
	}
}
