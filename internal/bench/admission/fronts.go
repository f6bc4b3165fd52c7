package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/bench/fronts"
	"github.com/vllm-guard/vllm-guard/internal/benchnginx"
)

// front is what the clients talk to: vLLM itself, nginx in front of it,
// or the guard's proxy. Each run has its own, over its own simulator.
type front interface {
	// URL is where the clients send their requests.
	URL() string
	// vllmExits are vLLM's exits so far, and how many were out of memory.
	vllmExits() (exits, ooms int)
	// admitted is the guard's proxy now (ok false for other fronts).
	admitted() (a proxyStatus, ok bool)
	// confident: the guard's cost model bounds the proxy by memory
	// (always false for other fronts).
	confident() bool
	Stop()
}

// runEnv is one (front, shape): the shared run (its scratch folder, GPU
// state, ports and tag) and the GPU sampling interval.
type runEnv struct {
	*fronts.Env
	sample time.Duration
}

// The scene: the integration tests' admission scene (integration/admission_test.go).
const (
	model      = "test-model"
	maxNumSeqs = 256
	util       = 0.8
)

func newRunEnv(b fronts.Bins, scratch, name string, sample time.Duration) (*runEnv, error) {
	e, err := fronts.NewEnv(b, scratch, name, fmt.Sprintf("benchadm-%d-%s", os.Getpid(), name))
	if err != nil {
		return nil, err
	}
	e.SimEnv = map[string]string{
		"FAKEVLLM_TEST_ID":        e.Tag,
		"FAKEVLLM_ERA":            "v1-ansi",
		"FAKEVLLM_SEQ_COST_MIB":   strconv.Itoa(seqMiB),
		"FAKEVLLM_TOKEN_COST_KIB": strconv.Itoa(tokenKiB),
		"FAKEVLLM_TOKEN_INTERVAL": tokenInterval.String(),
		"FAKEVLLM_TICK":           "20ms",
		"FAKEVLLM_ORPHAN_TTL":     "30s",
	}
	// systemd's Restart=always with its default RestartSec.
	e.RestartDelay = 100 * time.Millisecond
	return &runEnv{Env: e, sample: sample}, nil
}

// setVLLM sets vLLM direct's command line: serve, then args.
func (e *runEnv) setVLLM(args ...string) {
	e.Args = append(append([]string{"serve"}, args...), "--host", "127.0.0.1", "--port", strconv.Itoa(e.Port))
}

// vllmExits counts a restarter's exits and those out of memory (the run
// printed torch's "CUDA out of memory" before it).
func vllmExits(r *fronts.Restarter) (exits, ooms int) {
	for _, x := range r.Exits() {
		exits++
		if x.OOM {
			ooms++
		}
	}
	return exits, ooms
}

// direct: the clients talk to vLLM itself.
type direct struct{ *fronts.Restarter }

func (d direct) vllmExits() (int, int)         { return vllmExits(d.Restarter) }
func (d direct) admitted() (proxyStatus, bool) { return proxyStatus{}, false }
func (d direct) confident() bool               { return false }
func startDirect(ctx context.Context, e *runEnv) (front, error) {
	r, err := fronts.StartRestarter(ctx, e.Env)
	if err != nil {
		return nil, err
	}
	return direct{r}, nil
}

// nginxFront: nginx with limit_conn at max_num_seqs in front of vLLM
// (one zone for the whole server: at most max_num_seqs requests proxied
// at once, the rest get nginx's default limit_conn_status, 503).
type nginxFront struct{ *fronts.Nginx }

func startNginx(ctx context.Context, e *runEnv) (front, error) {
	n, err := fronts.StartNginx(ctx, e.Env, func(nginx, dir, upstream, listen string) (*exec.Cmd, error) {
		return benchnginx.Write(nginx, dir, upstream, listen, maxNumSeqs)
	})
	if err != nil {
		return nil, err
	}
	return nginxFront{n}, nil
}

func (n nginxFront) vllmExits() (int, int)         { return vllmExits(n.Restarter) }
func (n nginxFront) admitted() (proxyStatus, bool) { return proxyStatus{}, false }
func (n nginxFront) confident() bool               { return false }
