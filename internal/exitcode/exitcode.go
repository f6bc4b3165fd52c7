// Package exitcode names the exit codes of vllm-guard, in one place: the
// CLI returns them, the policy decides between GaveUp and Config, systemd's
// RestartPreventExitStatus=78 69 and the Kubernetes examples rely on them. The
// README's exit-code table lists the same values.
package exitcode

const (
	// OK: the command did what was asked; `run` stopped on request.
	OK = 0
	// Failed: `run` gave up (a crash loop) or hit a fatal internal error;
	// other commands failed to do what was asked.
	Failed = 1
	// Usage: the command line is wrong (an unknown command or flag, a
	// missing or extra argument). `--help` is not a usage error: it exits OK.
	Usage = 2
	// NoGuard: a command that asks a running guard (status, incidents
	// through the socket, restart, profile reset) found none answering: no
	// socket, nobody listening, or a process this user does not trust. Its
	// own code so scripts can tell "the guard is down" from "I typed it
	// wrong" (2) and from "the guard answers, vLLM is not ready" (1).
	NoGuard = 3
	// GPUFault: vLLM's GPU failed in a way a restart cannot mend (an XID
	// that needs a GPU reset, a GPU fallen off the bus, a failed row remap,
	// a second hardware fault within give_up_window), and [gpu]
	// on_gpu_fault is "exit": reset the GPU (nvidia-smi -r -i N) or drain
	// the node and reboot it, then start the guard again. Its own code so
	// that systemd (RestartPreventExitStatus=) does not restart onto the
	// broken GPU and an orchestrator can reschedule elsewhere.
	GPUFault = 69
	// Config: the configuration is wrong (the guard's own file, a socket or
	// port it cannot take), or vLLM failed for a cause classified
	// config_error. Retrying cannot help: fix the configuration first.
	Config = 78
)
