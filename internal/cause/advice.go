// What a verdict says to the operator: the exit in words, the cause's
// title, the summary and the advice.

package cause

import (
	"fmt"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

func exitWords(e Exit, s *scan, ev []Line) string {
	var what string
	switch {
	case e.Signal != "" && e.SignalByGuard:
		what = "vLLM died by " + e.Signal + " sent by the guard"
	case e.Signal != "":
		what = "vLLM was killed by " + e.Signal + " (not sent by the guard)"
	case e.ExitCode == 0:
		what = "vLLM exited with code 0 without being asked to stop (vLLM exits 0 after its engine dies)"
	default:
		what = fmt.Sprintf("vLLM exited with code %d", e.ExitCode)
	}
	if len(ev) > 0 {
		what += "; last error: " + clip(vllmlog.Message(ev[len(ev)-1].Text), 160)
	} else if s.wrapper >= 0 {
		what += fmt.Sprintf("; engine death at line %d, no root-cause line in the log", e.Lines[s.wrapper].N)
	}
	return what
}

var causeTitle = map[Cause]string{
	CauseOOM:            "GPU out of memory",
	CauseKVInsufficient: "KV cache does not fit in the GPU memory budget",
	CauseGPUBusy:        "GPU memory held by another process at startup",
	CauseConfigError:    "vLLM rejected its configuration",
	CauseHang:           "vLLM hung",
	CauseCrash:          "vLLM crashed",
	CauseHostOOM:        "host memory ran out (kernel OOM killer)",
	CauseGPUFault:       "the GPU failed (hardware)",
	CauseUnknown:        "unknown: the log cannot decide",
}

func summaryFor(c Cause, ev []Line) string {
	t := causeTitle[c]
	if len(ev) == 0 {
		return t
	}
	n, msg := quote(ev)
	return fmt.Sprintf("%s: line %d: %s", t, n, clip(msg, 200))
}

// quote is the evidence line to quote and its message: the exception
// itself when the evidence holds one. A traceback's evidence may start at
// the frame's code ("raise ValueError(") when the message wraps to the
// next line, as vLLM 0.32.0's KV error does. Pydantic's exception line
// only counts ("1 validation error for ModelConfig"); what is wrong is on
// the line below it, which is quoted instead.
func quote(ev []Line) (int, string) {
	for i, l := range ev {
		msg := vllmlog.Message(l.Text)
		if _, ok := vllmlog.ExceptionType(msg); !ok {
			continue
		}
		if model, ok := pydanticHeader(msg); ok {
			for j := i + 1; j < len(ev); j++ {
				what, ok := pydanticDetail(vllmlog.Message(ev[j].Text))
				if !ok {
					continue
				}
				// A field's error has the field's name on the line above.
				if f := ev[j-1]; j-1 > i && f.N == ev[j].N-1 {
					model += "." + strings.TrimSpace(vllmlog.Message(f.Text))
				}
				return ev[j].N, model + ": " + what
			}
		}
		return l.N, msg
	}
	return ev[0].N, vllmlog.Message(ev[0].Text)
}

// pydanticHeader recognises pydantic's exception line, "…ValidationError:
// 1 validation error for ModelConfig" (2 validation errors …), and returns
// the class it names.
func pydanticHeader(msg string) (string, bool) {
	_, rest, ok := strings.Cut(msg, "ValidationError: ")
	if !ok {
		return "", false
	}
	_, model, ok := strings.Cut(rest, " validation error")
	if !ok {
		return "", false
	}
	_, model, ok = strings.Cut(model, " for ")
	return strings.TrimSpace(model), ok && model != ""
}

// pydanticDetail recognises one error under pydantic's exception line,
// "  Value error, User-specified max_model_len (4096) is greater than …
// [type=value_error, input_value=…]" or "  Input should be greater than 0
// [type=greater_than, …]", and returns what it says without pydantic's
// framing.
func pydanticDetail(msg string) (string, bool) {
	if !strings.HasPrefix(msg, "  ") || strings.HasPrefix(msg, "    ") {
		return "", false
	}
	m := strings.TrimLeft(msg, " ")
	body, _, typed := strings.Cut(m, " [type=")
	if !typed && !strings.HasPrefix(m, "Value error, ") {
		return "", false
	}
	body = strings.TrimPrefix(body, "Value error, ")
	return strings.TrimSpace(body), body != ""
}

// adviceFor gives the operator's next steps for a verdict, most specific first.
func adviceFor(v Verdict) []string {
	ev := ""
	for _, l := range v.Evidence {
		ev += l.Text + "\n"
	}
	has := func(s string) bool { return strings.Contains(ev, s) || strings.Contains(v.Summary, s) }
	switch v.Cause {
	case CauseGroup:
		return groupAdvice(v.Group)
	case CauseOOM:
		a := []string{
			"the guard steps one rung down (lower max_num_seqs and gpu_memory_utilization) and restarts",
			"lower --max-num-seqs or --max-num-batched-tokens to shrink activation peaks; lower gpu_memory_utilization to leave room outside the KV cache",
			"check for other processes on the GPU: vllm-guard gpus",
		}
		if has("warming up sampler") {
			a = append([]string{"the sampler warm-up runs max_num_seqs dummy requests: lower max_num_seqs first"}, a...)
		}
		if has("ncclUnhandledCudaError") || has("Cuda failure") {
			a = append(a, "NCCL ran out of GPU memory for its buffers: leave more room (lower gpu_memory_utilization)")
		}
		return a
	case CauseKVInsufficient:
		return []string{
			"raise gpu_memory_utilization (if the GPU has room) or lower --max-model-len so one full-length sequence fits in the KV cache",
			"a lower max_num_seqs shrinks the profiling run and leaves more memory for the KV cache",
		}
	case CauseGPUBusy:
		return []string{
			"another process holds GPU memory, often an orphaned EngineCore or worker of the previous run: find it with vllm-guard gpus (or nvidia-smi) and stop it",
			"or lower gpu_memory_utilization so this instance fits beside the other tenant",
		}
	case CauseConfigError:
		switch {
		case has("ddress already in use"):
			return []string{"another process listens on vLLM's port: stop it or change [vllm] port", "the guard does not retry a configuration error (exit 78)"}
		case has("unrecognized arguments") || has(": error: "):
			return []string{"fix or remove the flag vLLM rejected ([vllm] command or the extra args); `vllm serve --help` lists this version's flags", "the guard does not retry a configuration error (exit 78)"}
		case has("Repository") || has("model identifier") || has("path_or_model_id") || has("gated repo") || has("GatedRepo") ||
			has("FileNotFound") || has("LocalEntryNotFound") || has("file named") || has("HFValidation"):
			return []string{"check the model name or path in [vllm] command; for gated or private models set HF_TOKEN in [vllm] env; offline (HF_HUB_OFFLINE=1) needs the model in the cache", "the guard does not retry a configuration error (exit 78)"}
		case has(addressFamilyRefused) || has("PermissionError"):
			return []string{
				"a sandbox refused what vLLM needs, and a restart meets the same refusal: with systemd, RestrictAddressFamilies= must allow AF_UNIX and AF_NETLINK besides AF_INET and AF_INET6 (vLLM's processes talk over unix sockets; gloo and NCCL list the interfaces through netlink); check SystemCallFilter=, ProtectSystem=, ReadOnlyPaths= and the container's seccomp profile; `systemd-analyze security` shows what the unit forbids",
				"the guard does not retry a configuration error (exit 78)",
			}
		case has("could not be started"):
			return []string{"check [vllm] command: the executable must exist and be executable in the guard's PATH (or give an absolute path)", "the guard does not retry a configuration error (exit 78)"}
		}
		return []string{"fix the vLLM arguments or model configuration named in the evidence ([vllm] command)", "the guard does not retry a configuration error (exit 78)"}
	case CauseHang:
		return []string{
			"read the last lines before the kill: the last load phase reached shows where it stuck",
			"with tensor parallelism check NCCL (NCCL_DEBUG=INFO, /dev/shm size, P2P); raise [readiness] stall_timeout only if loading or compiling legitimately takes longer",
		}
	case CauseUnknown:
		return []string{
			"the log does not decide: pass more of it (the lines after the last one here, and the minutes before the first sign) or the guard's incident record",
			"for a suspected hang: check whether requests still finish (vllm:generation_tokens_total keeps rising) and whether a worker is busy compiling (CPU at 100 %) or stuck (py-spy dump --pid of the EngineCore and workers)",
		}
	case CauseGPUFault:
		return gpuAdvice(v)
	case CauseHostOOM:
		return []string{
			"host RAM ran out, not GPU memory: raise the memory limit of the unit or container (MemoryMax=, --memory, resources.limits.memory)",
			"reduce host memory use: CPU offload / CPU KV cache size, fewer API server processes, model loading with less host copying",
		}
	}
	a := []string{"read the first error above the engine-death messages; the guard restarts on the same rung with backoff"}
	if has("NCCL") || has("nccl") || has("Watchdog") {
		a = append(a, "NCCL failed: check NCCL_DEBUG=INFO output, /dev/shm size (docker --shm-size), P2P/IB settings and GPU health (nvidia-smi -q, dmesg Xid)")
	}
	if has("illegal memory access") || has("CUDA error") || has("device-side assert") {
		a = append(a, "a CUDA kernel failed: check dmesg for Xid errors; try --enforce-eager to rule out CUDA graphs")
	}
	return a
}

// groupAdvice points at the member whose end ended the group's epoch: the
// cause is on its host.
func groupAdvice(g *GroupEnd) []string {
	if g == nil {
		return nil
	}
	if g.Said == "" {
		return []string{fmt.Sprintf("member %d's guard was not heard, or started again: check that host, its guard and the network between the guards ([group] loss_timeout)", g.Rank),
			"the group's leader decides the next start once for the group"}
	}
	return []string{fmt.Sprintf("the cause is on member %d's host: `vllm-guard status` and `vllm-guard incidents` there name it", g.Rank),
		"the group's leader decides the next start once for the group"}
}
