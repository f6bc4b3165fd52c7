package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

// Issue 15 item 1: the guard's own failure to start vLLM (a pipe or a fork
// refused for want of file descriptors, process slots or memory) is not a
// configuration error: a crash of the start, retried, and said so. Before,
// every start failure was config_error and the guard exited 78.
func TestGuardsOwnStartFailureIsARetriedCrash(t *testing.T) {
	for _, why := range []string{
		"start vLLM: report pipe: pipe2: too many open files",
		"fork/exec /usr/bin/vllm: resource temporarily unavailable",
		"start vLLM keeper /usr/bin/vllm-guard: fork/exec /usr/bin/vllm-guard: cannot allocate memory",
	} {
		v := cause.Classify(cause.Exit{GuardFailure: why, ExitCode: -1, Phase: cause.PhaseStarting})
		if v.Cause != cause.CauseCrash || !strings.Contains(v.Summary, "the guard could not start vLLM: "+why) ||
			!strings.Contains(v.Summary, "(its own error, not vLLM's configuration)") {
			t.Fatalf("%s: verdict %+v", why, v)
		}
		p := New(testConfig(), State{}, nil)
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		p.OnStart(now)
		d := p.OnFailure(now.Add(time.Second), v)
		if d.Action != ActionRestart || d.ExitCode == exitcode.Config || d.Delay <= 0 {
			t.Fatalf("%s: decision %+v, want a restart after a backoff", why, d)
		}
		if want := "the guard could not start vLLM: " + why + " (its own error, not vLLM's configuration): retrying"; !strings.HasPrefix(d.Reason, want) {
			t.Fatalf("reason %q, want it to start with %q", d.Reason, want)
		}
	}
	// The command's own failure stays a configuration error.
	if v := cause.Classify(cause.Exit{StartFailure: `"vllm": executable file not found in $PATH`, ExitCode: -1}); v.Cause != cause.CauseConfigError {
		t.Fatalf("a missing command: %+v, want config_error", v)
	}
}
