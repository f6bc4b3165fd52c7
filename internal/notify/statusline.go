package notify

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// StatusLine is the one-line summary for STATUS=, for example
//
//	ready · rung 1 (max_num_seqs 128, util 0.80) · GPU 83% · last: oom
//
// The GPU part is the fullest watched device ("GPU n/a" without NVML); active
// memory alerts and the cause of the last failure follow when there are any.
func StatusLine(st status.Status, gpu gpumon.Snapshot) string {
	state := string(st.State)
	if state == "" {
		state = "unknown"
	}
	switch {
	case st.State == status.StateStarting && st.Phase != "":
		state += " (" + st.Phase + progressPart(st) + ")"
	case st.State == status.StateFailed:
		state += fmt.Sprintf(" (exit %d)", st.ExitCode)
	}
	parts := []string{state,
		fmt.Sprintf("rung %d (max_num_seqs %d, util %.2f)", st.Rung.Index, st.Rung.MaxNumSeqs, st.Rung.GPUMemoryUtilization),
		gpuPart(gpu)}
	var alerts []string
	for _, a := range gpu.Active {
		if a.Active && !slices.Contains(alerts, a.Name) {
			alerts = append(alerts, a.Name)
		}
	}
	if len(alerts) > 0 {
		parts = append(parts, "alert: "+strings.Join(alerts, ", "))
	}
	if st.LastFailure != nil && st.LastFailure.Verdict.Cause != "" {
		parts = append(parts, "last: "+string(st.LastFailure.Verdict.Cause))
	}
	return oneLine(strings.Join(parts, " · "))
}

func gpuPart(g gpumon.Snapshot) string {
	if !g.Up || len(g.Devices) == 0 {
		return "GPU n/a"
	}
	top := g.Devices[0]
	for _, d := range g.Devices[1:] {
		if d.Fraction > top.Fraction {
			top = d
		}
	}
	if len(g.Devices) == 1 {
		return fmt.Sprintf("GPU %.0f%%", top.Fraction*100)
	}
	return fmt.Sprintf("GPU %.0f%% (max of %d, GPU %d)", top.Fraction*100, len(g.Devices), top.Index)
}
