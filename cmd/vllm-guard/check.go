package main

import (
	"fmt"
	"io"

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
		return exitConfig
	}
	fmt.Fprintf(stdout, "# %s: OK\n# effective settings (defaults included)\n\n", path)
	if err := cfg.WriteEffective(stdout); err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "\n# degrade ladder: each OOM steps one rung down\n")
	fmt.Fprintf(stdout, "%-5s %-13s %s\n", "rung", "max_num_seqs", "gpu_memory_utilization")
	for _, r := range policy.Ladder(cfg.Profile) {
		fmt.Fprintf(stdout, "%-5d %-13d %.2f\n", r.Index, r.MaxNumSeqs, r.GPUMemoryUtilization)
	}
	return exitOK
}
