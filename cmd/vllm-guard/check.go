package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/exitcode"
	"github.com/vllm-guard/vllm-guard/policy"
	"github.com/vllm-guard/vllm-guard/supervisor"
)

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("check", "check [--config FILE]", stderr)
	cfgPath := fs.String("config", "", "config file (default $VLLM_GUARD_CONFIG, ./vllm-guard.toml, /etc/vllm-guard/vllm-guard.toml)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	path := config.Resolve(*cfgPath)
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return exitcode.Config
	}
	fmt.Fprintf(stdout, "# %s: OK\n# effective settings (defaults included)\n\n", path)
	if err := cfg.WriteEffective(stdout); err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return exitcode.Failed
	}
	fmt.Fprintf(stdout, "\n# degrade ladder: each OOM steps one rung down\n")
	fmt.Fprintf(stdout, "%-5s %-13s %s\n", "rung", "max_num_seqs", "gpu_memory_utilization")
	for _, r := range policy.Ladder(cfg.Profile) {
		fmt.Fprintf(stdout, "%-5d %-13d %.2f\n", r.Index, r.MaxNumSeqs, r.GPUMemoryUtilization)
	}
	writeStop(stdout, cfg)
	writeLearned(stdout, cfg)
	return exitcode.OK
}

// The stop bounds of the shipped examples (examples/vllm-guard.service,
// examples/kubernetes/deployment.yaml): check warns when vLLM's stop would
// take longer than they allow.
const (
	exampleTimeoutStopSec   = 90 * time.Second
	exampleGracePeriodInK8s = 60 * time.Second
)

// writeStop prints how vLLM is stopped and how long it may take.
func writeStop(w io.Writer, cfg *config.Config) {
	drain := supervisor.ShutdownTimeout(cfg.VLLM.Command)
	eff := supervisor.EffectiveStopTimeout(cfg.VLLM.StopTimeout.Duration, drain)
	fmt.Fprintf(w, "\n# stopping: SIGTERM to vLLM's API server (it drains, then stops its engine), SIGKILL of its whole tree after %s\n", eff)
	if drain > 0 {
		fmt.Fprintf(w, "# (vLLM's --shutdown-timeout %s + 10s, stop_timeout %s)\n", drain, cfg.VLLM.StopTimeout.Duration)
	}
	if eff+5*time.Second > exampleTimeoutStopSec {
		fmt.Fprintf(w, "warning: the example systemd unit's TimeoutStopSec=%s is not above %s: raise it, or systemd kills vLLM mid-drain\n",
			exampleTimeoutStopSec, eff)
	}
	if eff+5*time.Second > exampleGracePeriodInK8s {
		fmt.Fprintf(w, "warning: the example Kubernetes terminationGracePeriodSeconds (%d) is not above %s: raise it, or the kubelet kills vLLM mid-drain\n",
			int(exampleGracePeriodInK8s.Seconds()), eff)
	}
}

// writeLearned prints what a guard that ran with this config saved: the
// rung in force and the cost model. check only reads; it writes nothing.
func writeLearned(w io.Writer, cfg *config.Config) {
	path := filepath.Join(cfg.Control.StateDir, "state.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(w, "\n# no saved state in %s: a guard starts on rung 0\n", path)
		return
	}
	var st policy.State
	if err := json.Unmarshal(raw, &st); err != nil {
		fmt.Fprintf(w, "\n# %s does not decode (%v): a guard moves it aside and starts on rung 0\n", path, err)
		return
	}
	p := policy.New(cfg, st, nil)
	r := p.Current()
	fmt.Fprintf(w, "\n# saved state (%s)\nrung in force: %d (max_num_seqs %d, gpu_memory_utilization %.2f)\ncost model: %s\n",
		path, r.Index, r.MaxNumSeqs, r.GPUMemoryUtilization, p.Cost().Describe(r.GPUMemoryUtilization, cfg.Profile.Headroom))
}
