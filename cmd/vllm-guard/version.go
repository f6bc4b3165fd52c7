package main

import (
	"fmt"
	"github.com/vllm-guard/vllm-guard/exitcode"
	"io"
	"runtime"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/gpumon"
)

// version is set at build time: -ldflags "-X main.version=…".
var version = "dev"

func cmdVersion(stdout io.Writer) int {
	commit := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				commit = s.Value
			}
		}
	}
	fmt.Fprintf(stdout, "vllm-guard %s\ncommit %s\n%s\n", version, commit, runtime.Version())
	if snap := gpumon.Open(gpumon.Options{}, zap.NewNop()).Once(); snap.Up {
		fmt.Fprintf(stdout, "NVIDIA driver %s\n", snap.Driver)
	} else {
		fmt.Fprintf(stdout, "NVIDIA driver: not found (%s)\n", snap.Reason)
	}
	return exitcode.OK
}
