package control

import (
	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"math"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

var fixtureNow = time.Date(2026, 3, 1, 12, 10, 0, 0, time.UTC)

// fixtureDoc is a guard ready on rung 1 after an OOM, with two GPUs: GPU 0
// steady, GPU 1 climbing with gpu_memory_warn and oom_predicted raised.
func fixtureDoc() Doc {
	const gib = 1 << 30
	oomAt := fixtureNow.Add(-6*time.Minute - 41*time.Second)
	rung0 := policy.Rung{Index: 0, MaxNumSeqs: 256, GPUMemoryUtilization: 0.85}
	rung1 := policy.Rung{Index: 1, MaxNumSeqs: 128, GPUMemoryUtilization: 0.80}
	evidence := []cause.Line{{N: 812, Stream: "stderr", Text: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.19 GiB of which 1.10 GiB is free. Including non-PyTorch memory, this process has 78.09 GiB memory in use."}}
	guard := status.Status{
		State:       status.StateReady,
		Since:       fixtureNow.Add(-5*time.Minute - 55*time.Second),
		Reason:      "vLLM answered a 1-token completion",
		PID:         4242,
		StartedAt:   fixtureNow.Add(-6*time.Minute - 36*time.Second),
		ReadySince:  fixtureNow.Add(-5*time.Minute - 55*time.Second),
		Rung:        rung1,
		Starts:      2,
		Restarts:    map[cause.Cause]int{cause.CauseOOM: 1},
		TimeToReady: 41230 * time.Millisecond,
		LastFailure: &status.Failure{
			Time: oomAt, PID: 4100, Exit: "exit code 1", ExitCode: 1, Phase: cause.PhaseReady,
			Verdict:    cause.Verdict{Cause: cause.CauseOOM, Confidence: "high", Evidence: evidence, Summary: "GPU out of memory while serving"},
			Decision:   policy.Decision{Action: policy.ActionRestart, Rung: rung1, Delay: 5 * time.Second, Reason: "OOM: one rung down"},
			RungBefore: rung0,
			Uptime:     2 * time.Hour,
		},
	}
	steady := make([]float64, 600)
	climbing := make([]float64, 600)
	for i := range steady {
		// GPU 0: flat at vLLM's budget with a little noise; GPU 1: a
		// steady leak from 80% to 93%.
		steady[i] = 0.775 + 0.004*math.Sin(float64(i)/7)
		climbing[i] = 0.80 + 0.13*float64(i)/599
	}
	gpu := gpumon.Snapshot{
		Up:          true,
		Attribution: "pid",
		Driver:      "550.54.15",
		Devices: []gpumon.Device{
			{Index: 0, UUID: "GPU-0aa1", Name: "NVIDIA H100 80GB HBM3", Used: 62 * gib, Total: 80 * gib,
				Fraction: 0.775, Trend: gpumon.TrendSteady, SecondsToCritical: -1, History: steady},
			{Index: 1, UUID: "GPU-1bb2", Name: "NVIDIA H100 80GB HBM3", Used: 74*gib + 400<<20, Total: 80 * gib,
				Fraction: 0.9299, Trend: gpumon.TrendClimbing, SlopeBytesPerSec: 21 << 20, SecondsToCritical: 150, History: climbing},
		},
		Active: []gpumon.Alert{
			{Name: gpumon.AlertWarn, Device: 1, Active: true, Fraction: 0.90, At: fixtureNow.Add(-80 * time.Second),
				Message: "GPU 1 memory at 90% (warn at 90%)"},
			{Name: gpumon.AlertPredicted, Device: 1, Active: true, Fraction: 0.92, SecondsToCritical: 170, At: fixtureNow.Add(-50 * time.Second),
				Message: "GPU 1 memory climbing at 21 MiB/s from 92%: critical (97%) in 2m50s"},
		},
	}
	return Doc{
		Version: "v0.4.0",
		Now:     fixtureNow,
		Guard:   guard,
		GPU:     gpu,
		VLLM: vllmstats.Stats{Up: true, Running: 12, Waiting: 3, KVUsage: 0.452, Preemptions: 8,
			PromptTokens: 1.2e6, GenerationTokens: 6.5e5, ScrapedAt: fixtureNow.Add(-time.Second), Scrapes: 355},
		Alerts: fixtureAlerts(gpu),
		LastIncident: &state.Incident{
			ID: "20260301T120319.000000Z-oom", Time: oomAt, Cause: cause.CauseOOM, Confidence: "high",
			Summary: "GPU out of memory while serving", Evidence: evidence, ExitCode: 1, Phase: cause.PhaseReady,
			RungBefore: rung0, RungAfter: rung1, Action: policy.ActionRestart, Delay: 5 * time.Second,
			MemoryTrend: "climbing",
		},
	}
}

// fixtureAlerts are the alerts in force in the fixture: its memory alerts,
// as the alert owner keeps them.
func fixtureAlerts(gpu gpumon.Snapshot) []ActiveAlert {
	var in []alerts.Event
	for _, a := range gpu.Active {
		in = append(in, alerts.FromGPU(a, policy.Rung{}))
	}
	return AlertsInForce(in)
}
