package supervisor

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The machine: a launch that fails for the guard's own reasons (here a
// pipe without file descriptors) is a crash of the start, retried after a
// backoff with the reason said, never a configuration error (exit 78).
func TestMachineGuardsOwnStartFailureIsRetried(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.l.fail = fmt.Errorf("start vLLM: report pipe: %w", &os.SyscallError{Syscall: "pipe2", Err: syscall.EMFILE})
		s.start()
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseCrash || f.Decision.Action != policy.ActionRestart {
			t.Fatalf("verdict %+v decision %+v: want a crash, restarted", f.Verdict, f.Decision)
		}
		for _, want := range []string{"the guard could not start vLLM: start vLLM: report pipe: pipe2: too many open files",
			"(its own error, not vLLM's configuration)", "retrying"} {
			if !strings.Contains(f.Decision.Reason, want) {
				t.Fatalf("reason %q does not say %q", f.Decision.Reason, want)
			}
		}
		if !strings.Contains(f.Exit, "the guard could not start vLLM") {
			t.Fatalf("exit %q", f.Exit)
		}
		s.wantState(StateBackoff)
		s.advance(f.Decision.Delay)
		if f2 := s.failure(2); f2.Verdict.Cause != cause.CauseCrash {
			t.Fatalf("second attempt: %+v", f2.Verdict)
		}
		s.wantStopped(0, "the stop")
	})
}
