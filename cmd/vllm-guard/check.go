package main

import (
	"encoding/json"
	"fmt"
	"github.com/vllm-guard/vllm-guard/exitcode"
	"io"
	"os"
	"path/filepath"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/policy"
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
	writeLearned(stdout, cfg)
	return exitcode.OK
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
