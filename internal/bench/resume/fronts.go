package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/bench/fronts"
	"github.com/vllm-guard/vllm-guard/internal/benchnginx"
)

// front is what the clients talk to: vLLM itself restarted as systemd
// would, nginx with its retry in front of that, or the guard's proxy.
type front interface {
	URL() string
	// deaths are the times vLLM's process was seen to exit, oldest first.
	deaths() []time.Time
	// readies counts vLLM's starts that reached ready.
	readies() int
	Stop()
}

// runEnv is one (scenario, front): its folder, GPU state, port and tag.
type runEnv = fronts.Env

// The simulator's model and vLLM's flags (the guard's first rung's).
const (
	model      = "test-model"
	maxNumSeqs = 256
	util       = 0.9
)

func newRunEnv(b bins, scratch, name string, sim map[string]string) (*runEnv, error) {
	e, err := fronts.NewEnv(b, scratch, name, fmt.Sprintf("benchresume-%d-%s", os.Getpid(), name))
	if err != nil {
		return nil, err
	}
	e.SimEnv = map[string]string{
		"FAKEVLLM_TEST_ID":        e.Tag,
		"FAKEVLLM_ERA":            "v1",
		"FAKEVLLM_TOKEN_INTERVAL": tokenInterval.String(),
		"FAKEVLLM_LOAD_WEIGHTS":   loadWeights.String(),
		"FAKEVLLM_TICK":           "20ms",
		"FAKEVLLM_ORPHAN_TTL":     "30s",
	}
	for k, v := range sim {
		e.SimEnv[k] = strings.ReplaceAll(v, "$DIR", e.Dir)
	}
	// vLLM direct's command line: the guard's first rung's.
	e.Args = append([]string{"serve", model, "--max-num-seqs", fmt.Sprint(maxNumSeqs), "--gpu-memory-utilization", fmt.Sprint(util),
		"--host", "127.0.0.1", "--port", strconv.Itoa(e.Port)}, simArgs()...)
	e.RestartDelay = restartDelay
	return e, nil
}

// deaths are a restarter's exits but those of the bench's own stop.
func deaths(r *fronts.Restarter) []time.Time {
	var at []time.Time
	for _, x := range r.Exits() {
		if !x.Stopped {
			at = append(at, x.At)
		}
	}
	return at
}

// direct: the clients talk to vLLM itself.
type direct struct{ *fronts.Restarter }

func (d direct) deaths() []time.Time { return deaths(d.Restarter) }
func (d direct) readies() int        { return d.Readies() }

func startDirect(ctx context.Context, e *runEnv) (front, error) {
	r, err := fronts.StartRestarter(ctx, e)
	if err != nil {
		return nil, err
	}
	return direct{r}, nil
}

// nginxFront: nginx in front of vLLM direct, with its retry: a request
// whose connection to vLLM fails, times out or gets 502/503 before any
// of the answer went to the client is tried again (proxy_next_upstream);
// max_fails=0 keeps the one upstream eligible after a failure.
type nginxFront struct{ *fronts.Nginx }

func startNginx(ctx context.Context, e *runEnv) (front, error) {
	n, err := fronts.StartNginx(ctx, e, func(nginx, dir, upstream, listen string) (*exec.Cmd, error) {
		return benchnginx.WriteWith(nginx, dir, upstream, listen, 0,
			"max_fails=0", "proxy_next_upstream error timeout http_502 http_503;")
	})
	if err != nil {
		return nil, err
	}
	return nginxFront{n}, nil
}

func (n nginxFront) deaths() []time.Time { return deaths(n.Restarter) }
func (n nginxFront) readies() int        { return n.Readies() }
