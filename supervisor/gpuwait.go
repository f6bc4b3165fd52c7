package supervisor

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/policy"
)

// waitReleased waits, after vLLM's tree has exited, until NVML shows none of
// its memory. Survivors of the old tree found holding memory are killed.
func (s *Supervisor) waitReleased(ctx context.Context, res outcome) bool {
	s.transition(StateWaitingGPU, "waiting for the old vLLM's GPU memory to be released")
	held := s.gpu.WaitReleased(ctx, res.tree, res.baseline, s.cfg.GPU.ReleaseTimeout.Duration)
	if ctx.Err() != nil {
		return false
	}
	// A survivor of the old tree still holding memory is killed: it would
	// make the next start fail vLLM's free-memory check.
	old := map[int]bool{}
	for _, pid := range res.tree {
		old[pid] = true
	}
	killed := false
	for _, h := range held {
		if old[h.PID] && alive(h.PID) {
			s.log.Warn("killing a survivor of the old vLLM that still holds GPU memory",
				zap.Int("pid", h.PID), zap.String("command", h.Command), zap.Uint64("bytes", h.Bytes))
			_ = syscall.Kill(h.PID, syscall.SIGKILL)
			killed = true
		}
	}
	if killed {
		held = s.gpu.WaitReleased(ctx, res.tree, res.baseline, s.cfg.GPU.ReleaseTimeout.Duration)
	}
	if len(held) > 0 {
		s.log.Warn("GPU memory still held after release_timeout", zap.String("holders", holdersText(held)),
			zap.Duration("release_timeout", s.cfg.GPU.ReleaseTimeout.Duration))
	}
	return true
}

// waitFreeGPU checks, before a start, that free memory on every device is at
// least the utilization vLLM will ask for — the check vLLM itself makes and
// fails on. While not, the state is waiting_gpu, naming the holders.
func (s *Supervisor) waitFreeGPU(ctx context.Context, rung policy.Rung) bool {
	interval := s.cfg.GPU.SampleInterval.Duration
	var lastWhy string
	for {
		ok, why, holders := s.gpu.CheckFree(rung.GPUMemoryUtilization)
		if ok {
			return true
		}
		reason := "not enough free GPU memory to start: " + why
		if why != lastWhy {
			s.log.Warn("waiting for GPU memory before starting vLLM", zap.String("why", why), zap.String("holders", holdersText(holders)))
			lastWhy = why
		}
		s.update(func(st *Status) { st.State, st.Reason = StateWaitingGPU, reason })
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case r := <-s.reqs:
			t.Stop()
			s.handleRequest(r)
		case <-t.C:
			s.beat()
		}
	}
}

func holdersText(hs []Holder) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		c := h.Command
		if c == "" {
			c = "?"
		}
		parts = append(parts, fmt.Sprintf("pid %d (%s) %.1f GiB", h.PID, c, float64(h.Bytes)/(1<<30)))
	}
	return strings.Join(parts, ", ")
}
