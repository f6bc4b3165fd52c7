package control

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// While vLLM loads, the human view says the phase's progress (with a bar)
// and when vLLM is expected to be ready, or that it is not known yet.
func TestStatusViewWhileLoading(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 11, 0, time.UTC)
	d := Doc{Now: now, Guard: status.Status{State: status.StateStarting, Since: now.Add(-11 * time.Second), Phase: "weights",
		StartedAt: now.Add(-11 * time.Second), PID: 42, Expected: &status.Expected{Basis: "unknown: no earlier start of this model on rung 0 seen"},
		Progress: &status.LoadProgress{Phase: "weights", Unit: "shards", Done: 2, Total: 3, Percent: 67}}}
	view := func() string {
		var b bytes.Buffer
		WriteStatus(&b, d)
		return b.String()
	}
	v := view()
	for _, want := range []string{
		"  loading        phase weights: 2/3 shards (67%) ▕█████████████▍      ▏\n",
		"  expected       ready time unknown (no earlier start of this model on rung 0 seen)\n",
	} {
		if !strings.Contains(v, want) {
			t.Errorf("before any start: view lacks %q:\n%s", want, v)
		}
	}
	d.Guard.Expected = &status.Expected{TimeToReady: 52 * time.Second, From: 3, Basis: "3 earlier starts of this model on rung 0"}
	if v := view(); !strings.Contains(v, "  expected       ready in ~41 s (from 3 earlier starts of this model on rung 0)\n") {
		t.Errorf("3 earlier starts: view lacks the expected time:\n%s", v)
	}
	// A phase that reports no progress shows none (the weights' bar was the last).
	d.Guard.Phase = "compile"
	if v := view(); !strings.Contains(v, "  loading        phase compile\n") {
		t.Errorf("compile: view shows the weights' bar:\n%s", v)
	}
}

func TestLoadBar(t *testing.T) {
	for ratio, want := range map[float64]string{0: "▕    ▏", 1: "▕████▏", 0.5: "▕██  ▏", 1.0 / 16: "▕▎   ▏", 2: "▕████▏", -1: "▕    ▏"} {
		if got := loadBar(ratio, 4); got != want {
			t.Errorf("%v: %q, want %q", ratio, got, want)
		}
	}
}

// `status --watch` redraws the load's bar and the time left as they move.
func TestStatusWatchShowsTheLoadLive(t *testing.T) {
	b := newFakeBackend(status.StateStarting)
	setLoad := func(done int) {
		b.mu.Lock()
		defer b.mu.Unlock()
		g := &b.doc.Guard
		g.Phase, g.StartedAt = "weights", b.doc.Now.Add(-11*time.Second)
		g.Progress = &status.LoadProgress{Phase: "weights", Unit: "shards", Done: done, Total: 3, Percent: done * 100 / 3}
		g.Expected = &status.Expected{TimeToReady: 52 * time.Second, From: 3, Basis: "3 earlier starts of this model on rung 0"}
	}
	setLoad(1)
	_, path := startSocket(t, b, nil)
	out := &syncBuffer{frames: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- statusCommand(ctx, []string{"--socket", path, "--watch"}, out, out, 5*time.Millisecond)
	}()
	lastFrame := func() string { f := strings.Split(out.String(), clearScreen); return f[len(f)-1] }
	waitFrame := func(want string) {
		t.Helper()
		for !strings.Contains(lastFrame(), want) {
			select {
			case <-out.frames:
			case <-time.After(30 * time.Second):
				t.Fatalf("no frame shows %q; output so far:\n%s", want, out.String())
			}
		}
	}
	waitFrame("phase weights: 1/3 shards (33%) ▕██████▋             ▏")
	setLoad(2)
	waitFrame("phase weights: 2/3 shards (66%) ▕█████████████▍      ▏")
	if f := lastFrame(); !strings.Contains(f, "ready in ~41 s (from 3 earlier starts of this model on rung 0)") {
		t.Errorf("the frame lacks the time to ready:\n%s", f)
	}
	cancel()
	<-done
}
