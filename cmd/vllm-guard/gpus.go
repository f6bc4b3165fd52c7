package main

import (
	"encoding/json"
	"fmt"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"io"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/state"
)

// cmdGPUs prints what NVML sees; it needs no running guard.
func cmdGPUs(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("gpus", "gpus [--json] [--config FILE | --instance NAME]", stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	cf := addConfigFlags(fs, ", for [gpu] devices (optional)")
	if code, ok := parse(fs, args, stdout); !ok {
		return code
	}
	instance, path, ok := cf.resolve(stderr)
	if !ok {
		return exitcode.Usage
	}
	opts := gpumon.Options{}
	if cfg, err := config.LoadFor(path, instance); err == nil {
		opts.Devices = cfg.GPU.Devices
	}
	mon := gpumon.Open(opts, zap.NewNop())
	snap := mon.Once()
	health := mon.Health() // read with the sample: ECC, remapped rows, retired pages, lost
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			gpumon.Snapshot
			Health []gpumon.DeviceHealth `json:"health"`
		}{snap, health.Devices})
	} else if snap.Up {
		writeClean(stdout, func(w io.Writer) error {
			gpumon.WriteTable(w, snap)
			gpumon.WriteHealth(w, health)
			return nil
		})
	}
	if !snap.Up {
		fmt.Fprintf(stderr, "vllm-guard gpus: %s\n", state.Clean(snap.Reason))
		return exitcode.Failed
	}
	return exitcode.OK
}
