package notify

import (
	"fmt"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// While vLLM loads, STATUS= says how far the load phase is, where vLLM
// reports it, and when vLLM is expected to be ready:
//
//	starting (weights 2/3 shards, 67%) · ready in ~41 s · rung 0 (max_num_seqs 256, util 0.90) · GPU 83%

// progressPart is the load phase's progress, " 2/3 shards, 67%" ("" when
// vLLM reports none).
func progressPart(st status.Status) string {
	p, ok := st.LoadingProgress()
	if !ok || p.Phase != st.Phase {
		return ""
	}
	return fmt.Sprintf(" %d/%d %s, %d%%", p.Done, p.Total, p.Unit, p.Percent)
}

// StatusLineAt is StatusLine with, once vLLM was launched and while it
// starts, the time to ready expected at now ("ready in ~41 s"; "ready in:
// unknown" before any start of the model on the rung was seen) after the
// state.
func StatusLineAt(st status.Status, gpu gpumon.Snapshot, now time.Time) string {
	line := StatusLine(st, gpu)
	if st.State != status.StateStarting || st.Expected == nil {
		return line // not starting, or not launched yet
	}
	eta := "ready in: unknown"
	if left, ok := st.ReadyIn(now); ok && left > 0 {
		eta = "ready in ~" + status.Approx(left)
	} else if ok {
		eta = "overdue (usually ~" + status.Approx(st.Expected.TimeToReady) + ")"
	}
	head, tail, _ := strings.Cut(line, " · ")
	return oneLine(head + " · " + eta + " · " + tail)
}

// ProgressStatus sends STATUS=line() for a step of the load: at most one
// every ExtendEvery (vLLM can print hundreds of progress lines a second
// while capturing graphs, and each datagram costs the guard's loop a
// send), so a change of state (Status) is never held behind them. line is
// made only when sent.
func (n *Notifier) ProgressStatus(line func() string) {
	if !n.enabled {
		return
	}
	n.mu.Lock()
	now := n.now()
	if !n.lastProgress.IsZero() && now.Sub(n.lastProgress) < ExtendEvery {
		n.mu.Unlock()
		return
	}
	n.lastProgress = now
	n.mu.Unlock()
	n.Status(line())
}
