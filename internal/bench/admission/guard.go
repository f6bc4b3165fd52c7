package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sync"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/bench/fronts"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

// guardFront: the guard supervises vLLM and clients talk to its proxy.
type guardFront struct {
	*fronts.Guard

	mu          sync.Mutex
	exits       int
	ooms        int
	isConfident bool
}

// guardConfig is the integration tests' admission scene, with the guard's
// default GPU sampling interval unless -sample-interval says otherwise.
func guardConfig(e *runEnv, proxyAddr, sock string) string {
	return e.GuardConfig([]string{"serve", model}, sock, fmt.Sprintf(`[profile]
max_num_seqs = %d
max_num_seqs_factor = 0.9
gpu_memory_utilization = %g
min_gpu_memory_utilization = %g
headroom = 0.005

[restart]
initial_delay = "200ms"

[gpu]
sample_interval = %q

[proxy]
listen = %q
queue_size = 1024
queue_timeout = "30s"
`, maxNumSeqs, util, util, e.sample.String(), proxyAddr))
}

func startGuard(ctx context.Context, e *runEnv) (front, error) {
	g := &guardFront{}
	cfg := func(proxyAddr, sock string) string { return guardConfig(e, proxyAddr, sock) }
	var err error
	if g.Guard, err = fronts.StartGuard(ctx, e.Env, cfg, g.onEvent); err != nil {
		return nil, err
	}
	return g, nil
}

// onEvent follows the guard's event stream: vLLM's exits, their causes,
// the cost model's confidence.
func (g *guardFront) onEvent(ev events.Event) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch ev.Kind {
	case events.KindExited:
		g.exits++
		if ev.Failure != nil && ev.Failure.Verdict.Cause == "oom" {
			g.ooms++
		}
	case events.KindAdmission:
		g.isConfident = ev.Admission.Confident && ev.Admission.Bound == "memory"
	}
}

func (g *guardFront) vllmExits() (int, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.exits, g.ooms
}

func (g *guardFront) confident() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.isConfident
}

// proxyStatus is the proxy part of `vllm-guard status --json`.
type proxyStatus struct {
	Limit    int    `json:"limit"`
	Inflight int    `json:"inflight"`
	Queued   int    `json:"queued"`
	Bound    string `json:"bound"`
	Why      string `json:"bound_reason"`
}

func (g *guardFront) admitted() (proxyStatus, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, g.E.Bins.Guard, "status", "--json", "--socket", g.Sock).Output()
	if len(out) == 0 {
		return proxyStatus{}, false
	}
	var st struct {
		Proxy *proxyStatus `json:"proxy"`
	}
	if json.Unmarshal(out, &st) != nil || st.Proxy == nil {
		return proxyStatus{}, false
	}
	_ = err // status exits 1 while vLLM is not ready; the document is still there
	return *st.Proxy, true
}
