//go:build !cgo

package gpumon

import "go.uber.org/zap"

// Open returns an unavailable Monitor: go-nvml needs cgo.
func Open(opts Options, log *zap.Logger) *Monitor {
	return Disabled("built without cgo", opts, log)
}
