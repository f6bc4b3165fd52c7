package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/bench/fronts"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

func guardConfig(e *runEnv, proxyAddr, sock string, resume bool) string {
	return e.GuardConfig(append([]string{"serve", model}, simArgs()...), sock, fmt.Sprintf(`[profile]
max_num_seqs = %d
gpu_memory_utilization = %g

[restart]
initial_delay = %q

[proxy]
listen = %q
queue_size = 1024
resume = %v
`, maxNumSeqs, util, restartDelay.String(), proxyAddr, resume))
}

// guardFront: the guard supervises vLLM and the clients talk to its proxy.
type guardFront struct {
	*fronts.Guard

	mu        sync.Mutex
	exitTimes []time.Time
	ready     int
}

func startGuard(ctx context.Context, e *runEnv, resume bool) (front, error) {
	g := &guardFront{}
	cfg := func(proxyAddr, sock string) string { return guardConfig(e, proxyAddr, sock, resume) }
	var err error
	if g.Guard, err = fronts.StartGuard(ctx, e, cfg, g.onEvent); err != nil {
		return nil, err
	}
	return g, nil
}

// onEvent follows the guard's event stream: vLLM's readies and exits.
func (g *guardFront) onEvent(ev events.Event) {
	at := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch ev.Kind {
	case events.KindReady:
		g.ready++
	case events.KindExited:
		if ev.Failure != nil && !ev.Failure.Time.IsZero() {
			at = ev.Failure.Time
		}
		g.exitTimes = append(g.exitTimes, at)
	}
}

func (g *guardFront) deaths() []time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]time.Time(nil), g.exitTimes...)
}

func (g *guardFront) readies() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ready
}
