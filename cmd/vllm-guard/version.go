package main

import (
	"fmt"
	"io"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/buildinfo"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
)

// cmdVersion is `vllm-guard version` and `vllm-guard --version`: the
// build's version and revision (stamped by the Makefile and the
// Dockerfile, see package buildinfo), Go's version, and the NVIDIA driver
// when NVML answers.
func cmdVersion(stdout io.Writer) int {
	bi := buildinfo.Get()
	fmt.Fprintf(stdout, "vllm-guard %s\nrevision %s\n%s\n", bi.Version, bi.Revision, bi.GoVersion)
	if snap := gpumon.Open(gpumon.Options{}, zap.NewNop()).Once(); snap.Up {
		fmt.Fprintf(stdout, "NVIDIA driver %s\n", snap.Driver)
	} else {
		fmt.Fprintf(stdout, "NVIDIA driver: not found (%s)\n", snap.Reason)
	}
	return exitcode.OK
}
