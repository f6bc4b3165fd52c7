package alerts

import (
	"fmt"
	"slices"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// FromGPU turns a GPU monitor alert (raised or cleared) into an Event.
func FromGPU(a gpumon.Alert, rung policy.Rung) Event {
	return Event{Alert: a.Name, Active: a.Active, Severity: SeverityOf(a.Name), Time: a.At, Message: a.Message,
		GPU: a.Device, Fraction: a.Fraction, SecondsToCritical: a.SecondsToCritical, Rung: rung}
}

// FromFailure returns the events of one death of vLLM: oom when it was
// classified so, gave_up when the policy gave up (both for an OOM that ends
// the crash loop), none for other failures (they are logged and counted,
// not alerted).
func FromFailure(f status.Failure) []Event {
	base := func() Event {
		details := map[string]any{
			"exit":     f.Exit,
			"phase":    string(f.Phase),
			"summary":  f.Verdict.Summary,
			"action":   string(f.Decision.Action),
			"reason":   f.Decision.Reason,
			"pid":      f.PID,
			"uptime_s": f.Uptime.Seconds(),
		}
		if len(f.Verdict.Evidence) > 0 {
			details["evidence_line"] = f.Verdict.Evidence[0].N
			details["evidence"] = f.Verdict.Evidence[0].Text
		}
		if len(f.Verdict.Advice) > 0 {
			details["advice"] = f.Verdict.Advice
		}
		e := Event{Active: true, Time: f.Time, GPU: -1, SecondsToCritical: -1, Cause: string(f.Verdict.Cause),
			Rung: f.RungBefore, Details: details}
		if len(f.MemFractions) > 0 {
			e.Fraction = slices.Max(f.MemFractions)
		}
		return e
	}
	var out []Event
	if f.Verdict.Cause == cause.CauseOOM {
		e := base()
		e.Alert, e.Severity = OOM, SeverityOf(OOM)
		e.Message = fmt.Sprintf("vLLM died of GPU out of memory on rung %d (max_num_seqs %d, gpu_memory_utilization %.2f)",
			f.RungBefore.Index, f.RungBefore.MaxNumSeqs, f.RungBefore.GPUMemoryUtilization)
		if f.Decision.Action == policy.ActionRestart {
			e.Message += fmt.Sprintf("; restarting on rung %d (max_num_seqs %d, gpu_memory_utilization %.2f)",
				f.Decision.Rung.Index, f.Decision.Rung.MaxNumSeqs, f.Decision.Rung.GPUMemoryUtilization)
			e.Details["next_rung"] = f.Decision.Rung
		}
		out = append(out, e)
	}
	if g := f.Verdict.GPU; f.Verdict.Cause == cause.CauseGPUFault && g != nil {
		e := base()
		e.Alert, e.Severity, e.GPU = GPUFault, SeverityOf(GPUFault), g.Device
		e.Message = "GPU fault: " + g.What()
		if f.Decision.Action == policy.ActionRestart {
			e.Message += "; restarting vLLM on the same rung (a second fault within give_up_window is treated as needing a reset)"
		} else {
			e.Message += "; vLLM is not restarted onto it"
		}
		e.Details["gpu_uuid"] = g.UUID
		e.Details["xid"] = g.XID
		e.Details["xid_meaning"] = g.Meaning
		e.Details["needs_reset"] = g.Reset
		e.Details["ecc_uncorrected_before"] = g.ECCBefore
		e.Details["ecc_uncorrected_after"] = g.ECCAfter
		out = append(out, e)
	}
	if f.Decision.Action == policy.ActionGiveUp {
		e := base()
		e.Alert, e.Severity = GaveUp, SeverityOf(GaveUp)
		e.Message = fmt.Sprintf("gave up on vLLM after %s (guard exit code %d): %s", f.Verdict.Cause, f.Decision.ExitCode, f.Decision.Reason)
		e.Details["exit_code"] = f.Decision.ExitCode
		out = append(out, e)
	}
	return out
}
