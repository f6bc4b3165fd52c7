package main

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// The weights' progress as vLLM 0.32.0 prints it (docs/standby-facts.md,
// "Load progress"): tqdm on stderr, no process prefix, with vLLM's
// bar_format (model_executor/model_loader/weight_utils.py _BAR_FORMAT),
// which ends in a newline:
//
//	"{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"
//
// tqdm writes each state as "\r" + that, so every state is a line of its
// own, preceded by a carriage return; the first state (0/N) at once, a
// new one after each shard when 0.1 s (mininterval) passed since the
// last; close() writes the final state again and one more "\n" (an empty
// line). The percentage is rounded (2/3 is " 67%"), the rate is "X.XXit/s",
// or "X.XXs/it" below one per second; times are [H:]MM:SS.

// shardProgress prints one safetensors loading bar.
type shardProgress struct {
	w        io.Writer
	prefix   string // older eras: the process prefix vLLM's old stream decoration added
	v1       bool   // vLLM 0.32.0's bytes
	total    int
	start    time.Time
	lastShow time.Time
}

func newShardProgress(w io.Writer, prefix string, v1 bool, total int) *shardProgress {
	p := &shardProgress{w: w, prefix: prefix, v1: v1, total: total, start: time.Now()}
	p.show(0, false)
	return p
}

// idle re-prints the current state: the simulator's FAKEVLLM_PROGRESS_EVERY
// (the guard's stall detection is tested with long phases); real tqdm
// prints only when a shard completes.
func (p *shardProgress) idle(n int) { p.show(n, false) }

// step reports n shards loaded.
func (p *shardProgress) step(n int) {
	if p.v1 && time.Since(p.lastShow) < 100*time.Millisecond {
		return // tqdm's mininterval
	}
	p.show(n, false)
}

// close ends the bar at n shards (n < total: the load failed).
func (p *shardProgress) close(n int) { p.show(n, true) }

func (p *shardProgress) show(n int, final bool) {
	p.lastShow = time.Now()
	text := shardsBar(n, p.total, time.Since(p.start))
	if !p.v1 {
		end := "\r"
		if final {
			end = "\n"
		}
		io.WriteString(p.w, p.prefix+text+end)
		return
	}
	s := "\r" + text + "\n"
	if final {
		s += "\n"
	}
	io.WriteString(p.w, s)
}

// shardsBar renders vLLM's safetensors loading bar, which says "Completed".
func shardsBar(n, total int, elapsed time.Duration) string {
	pct := 0.0
	if total > 0 {
		pct = float64(n) * 100 / float64(total)
	}
	rate, remaining := "?it/s", "?"
	if n > 0 && elapsed > 0 {
		r := float64(n) / elapsed.Seconds()
		if r < 1 {
			rate = fmt.Sprintf("%5.2fs/it", 1/r)
		} else {
			rate = fmt.Sprintf("%5.2fit/s", r)
		}
		remaining = tqdmInterval(time.Duration(float64(total-n) / r * float64(time.Second)))
	}
	return fmt.Sprintf("Loading safetensors checkpoint shards: %3.0f%% Completed | %d/%d [%s<%s, %s]", math.RoundToEven(pct), n, total, tqdmInterval(elapsed), remaining, rate)
}

// tqdmInterval is tqdm's format_interval: [H:]MM:SS.
func tqdmInterval(d time.Duration) string {
	s := int(d.Seconds())
	h, m := s/3600, s/60%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, s%60)
	}
	return fmt.Sprintf("%02d:%02d", m, s%60)
}

// Write lets a streamWriter take a progress bar.
func (w *streamWriter) Write(b []byte) (int, error) {
	w.write(b)
	return len(b), nil
}

// shards starts the weights' bar on the logger's stderr.
func (l *logger) shards(total int) *shardProgress {
	return newShardProgress(l.err, l.prefix, l.era == vllmlog.EraV1Plain, total)
}
