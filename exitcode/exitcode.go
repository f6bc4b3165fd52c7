// Package exitcode names the exit codes of vllm-guard, in one place: the
// CLI returns them, the policy decides between GaveUp and Config, systemd's
// RestartPreventExitStatus=78 and the Kubernetes examples rely on them.
package exitcode

const (
	// OK: the command did what was asked; `run` stopped on request.
	OK = 0
	// Failed: `run` gave up (a crash loop) or hit a fatal internal error;
	// other commands failed to do what was asked.
	Failed = 1
	// Usage: the command line is wrong.
	Usage = 2
	// Config: the configuration is wrong (the guard's own file, a socket or
	// port it cannot take), or vLLM failed for a cause classified
	// config_error. Retrying cannot help: fix the configuration first.
	Config = 78
)
