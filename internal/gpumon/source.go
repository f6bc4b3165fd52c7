// The seam to NVML (go-nvml under cgo, nvml_cgo.go) and the stand-in
// that reports why GPU metrics are unavailable.

package gpumon

import (
	"go.uber.org/zap"
)

// source is the seam to NVML: go-nvml under cgo, or an unavailable stand-in.
// Calls are serialised by the Monitor.
type source interface {
	open() (driver string, devices []deviceInfo, err error)
	read(indices []int) ([]reading, error)
	close()
}

// reading is one device's memory at one instant.
type reading struct {
	used, total, free uint64
	procs             []procUse
	noProcs           bool // the driver does not list processes on this device
}

type procUse struct {
	pid  int
	used uint64
}

// unavailableError means retrying cannot help (no cgo, no library given).
type unavailableError struct{ reason string }

func (e *unavailableError) Error() string { return e.reason }

type unavailableSource struct{ reason string }

func (u unavailableSource) open() (string, []deviceInfo, error) {
	return "", nil, &unavailableError{u.reason}
}

func (u unavailableSource) read([]int) ([]reading, error) { return nil, &unavailableError{u.reason} }

func (u unavailableSource) close() {}

// Disabled returns a Monitor that never reads NVML and reports reason, for
// builds and tests with no GPU library.
func Disabled(reason string, opts Options, log *zap.Logger) *Monitor {
	return newMonitor(unavailableSource{reason}, opts, log)
}
