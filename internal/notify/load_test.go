package notify

import (
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/notify/notifytest"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

func TestStatusLineWhileLoading(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	gpu := gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{Fraction: 0.834}}}
	st := status.Status{State: status.StateStarting, Phase: "weights", StartedAt: t0, Rung: policy.Rung{MaxNumSeqs: 256, GPUMemoryUtilization: 0.9},
		Progress: &status.LoadProgress{Phase: "weights", Unit: "shards", Done: 2, Total: 3, Percent: 67}}
	if got, want := StatusLineAt(st, gpu, t0), StatusLine(st, gpu); got != want {
		t.Errorf("before the launch: %q, want the plain line %q", got, want)
	}
	st.Expected = &status.Expected{Basis: "unknown: no earlier start of this model on rung 0 seen"}
	if got, want := StatusLineAt(st, gpu, t0.Add(time.Second)),
		"starting (weights 2/3 shards, 67%) · ready in: unknown · rung 0 (max_num_seqs 256, util 0.90) · GPU 83%"; got != want {
		t.Errorf("before any start:\n got %q\nwant %q", got, want)
	}
	st.Expected = &status.Expected{TimeToReady: 52 * time.Second, From: 3, Basis: "3 earlier starts of this model on rung 0"}
	if got, want := StatusLineAt(st, gpu, t0.Add(11*time.Second)),
		"starting (weights 2/3 shards, 67%) · ready in ~41 s · rung 0 (max_num_seqs 256, util 0.90) · GPU 83%"; got != want {
		t.Errorf("after 11 s:\n got %q\nwant %q", got, want)
	}
	if got := StatusLineAt(st, gpu, t0.Add(time.Minute)); !strings.Contains(got, " · overdue (usually ~52 s) · ") {
		t.Errorf("past the expected time: %q", got)
	}
	// A bar of another phase (the weights' last, once compiling) is not this phase's progress.
	st.Phase = "compile"
	if got := StatusLineAt(st, gpu, t0.Add(11*time.Second)); !strings.HasPrefix(got, "starting (compile) · ready in ~41 s · ") {
		t.Errorf("compiling: %q", got)
	}
	st.State = status.StateReady
	if got, want := StatusLineAt(st, gpu, t0), StatusLine(st, gpu); got != want {
		t.Errorf("ready: %q, want the plain line %q", got, want)
	}
}

// A load's steps go to STATUS= at most once a second; a change of state
// is never held behind them.
func TestProgressStatusRateLimited(t *testing.T) {
	s := notifytest.Listen(t)
	n := New(nil)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n.now = func() time.Time { return now }
	n.ProgressStatus(func() string { return "starting (weights 1/64 shards, 2%)" })
	n.ProgressStatus(func() string { return "starting (weights 2/64 shards, 3%)" }) // same instant: dropped
	n.Status("backoff")                                                             // a state: always sent
	now = now.Add(ExtendEvery)
	n.ProgressStatus(func() string { return "starting (weights 3/64 shards, 5%)" })
	expect(t, s, "STATUS=starting (weights 1/64 shards, 2%)")
	expect(t, s, "STATUS=backoff")
	expect(t, s, "STATUS=starting (weights 3/64 shards, 5%)")
}
