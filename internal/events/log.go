package events

import (
	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// Log returns a consumer that writes each event as one log line, at the
// level an operator would want it. Alerts are logged by their owner
// (package alerts), not here.
func Log(log *zap.Logger) func(Event) {
	return func(e Event) {
		log := log
		if e.VLLM != "" {
			log = log.With(zap.String("vllm", e.VLLM), zap.String("role", e.Role))
		}
		switch e.Kind {
		case KindState:
			fields := []zap.Field{zap.String("from", e.From), zap.String("reason", e.Reason)}
			fields = append(fields, rungFields(e.Rung)...)
			log.Info("state "+e.State, fields...)
		case KindStarting:
			log.Info("launching vLLM", append([]zap.Field{zap.Strings("argv", e.Argv)}, rungFields(e.Rung)...)...)
		case KindReady:
			log.Info("vLLM ready", append([]zap.Field{zap.Duration("load", e.TimeToReady), zap.Int("pid", e.PID),
				zap.Bool("first", e.First)}, rungFields(e.Rung)...)...)
		case KindExited:
			f := e.Failure
			d := f.Decision
			fields := []zap.Field{zap.String("cause", string(f.Verdict.Cause)), zap.String("confidence", f.Verdict.Confidence),
				zap.String("summary", f.Verdict.Summary), zap.String("exit", f.Exit), zap.String("phase", string(f.Phase)),
				zap.String("action", string(d.Action)), zap.Int("next_rung", d.Rung.Index), zap.Int("next_max_num_seqs", d.Rung.MaxNumSeqs),
				zap.Float64("next_gpu_memory_utilization", d.Rung.GPUMemoryUtilization), zap.Duration("delay", d.Delay),
				zap.String("reason", d.Reason)}
			if len(f.Verdict.Evidence) > 0 {
				fields = append(fields, zap.Int("evidence_line", f.Verdict.Evidence[0].N), zap.String("evidence", f.Verdict.Evidence[0].Text))
			}
			log.Warn("vLLM failed", fields...)
		case KindDecision:
			log.Info("decision: "+e.Decision, append([]zap.Field{zap.String("reason", e.Reason)}, rungFields(e.Rung)...)...)
		case KindProgress:
			log.Debug("load progress", zap.String("phase", e.Phase))
		case KindProbeFailed:
			log.Debug("probe failed", zap.String("step", e.Probe.Step), zap.Int("status", e.Probe.Status), zap.String("error", e.Probe.Error))
		case KindFailover:
			f := e.Failover
			what := "failover: the standby serves"
			if f.Swap {
				what = "swap: the standby on the ladder's rung serves"
			}
			log.Warn(what, zap.String("from", f.From), zap.String("to", f.To), zap.String("why", f.Why),
				zap.Float64("seconds", f.Seconds))
		case KindAdmission:
			a := e.Admission
			log.Info("proxy limit bound", zap.String("bound", a.Bound), zap.Int("limit", a.Limit),
				zap.Bool("cost_model_confident", a.Confident), zap.String("why", a.Why))
		case KindStopped:
			code := 0
			if e.ExitCode != nil {
				code = *e.ExitCode
			}
			log.Info("supervisor stopped", zap.String("state", e.State), zap.String("reason", e.Reason), zap.Int("exit_code", code))
		}
	}
}

func rungFields(r *policy.Rung) []zap.Field {
	if r == nil {
		return nil
	}
	return []zap.Field{zap.Int("rung", r.Index), zap.Int("max_num_seqs", r.MaxNumSeqs),
		zap.Float64("gpu_memory_utilization", r.GPUMemoryUtilization)}
}
