//go:build cgo

package gpumon

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"
)

// Open returns a Monitor on the system's NVML (libnvidia-ml.so.1, found the
// way the dynamic loader finds it, LD_LIBRARY_PATH included).
func Open(opts Options, log *zap.Logger) *Monitor {
	return New(nvml.New(), opts, log)
}

// New returns a Monitor on lib; a nil lib gives an unavailable monitor.
func New(lib nvml.Interface, opts Options, log *zap.Logger) *Monitor {
	if lib == nil {
		return Disabled("no NVML library", opts, log)
	}
	return newMonitor(&nvmlSource{lib: lib}, opts, log)
}

// nvmlSource reads go-nvml. Every call is gated on a successful Init: go-nvml
// calls into a library that failed to load end the process.
type nvmlSource struct {
	lib     nvml.Interface
	handles []nvml.Device // by NVML index
	v2      bool          // nvmlDeviceGetMemoryInfo_v2 exists and works
	// throttleFn: 0 not looked up yet, 1 ClocksEventReasons, 2 the older
	// ClocksThrottleReasons (nvml_health_cgo.go).
	throttleFn int
}

func (s *nvmlSource) open() (string, []deviceInfo, error) {
	if ret := s.lib.Init(); ret != nvml.SUCCESS {
		return "", nil, initError(ret)
	}
	devs, driver, err := s.enumerate()
	if err != nil {
		s.lib.Shutdown()
		return "", nil, err
	}
	return driver, devs, nil
}

func (s *nvmlSource) enumerate() ([]deviceInfo, string, error) {
	// Check the versioned symbol before calling it: calling a missing one
	// is a dynamic-linker error that kills the process.
	s.v2 = false
	if ext := s.lib.Extensions(); ext != nil {
		s.v2 = ext.LookupSymbol("nvmlDeviceGetMemoryInfo_v2") == nil
	}
	driver, ret := s.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = ""
	}
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("NVML could not count GPUs: %w", ret)
	}
	if n == 0 {
		return nil, "", errors.New("NVML sees no GPU: check `nvidia-smi` and the GPUs given to this host or container")
	}
	s.handles = make([]nvml.Device, n)
	devs := make([]deviceInfo, n)
	for i := range n {
		h, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_GPU_IS_LOST {
			return nil, "", &lostError{index: i, err: fmt.Errorf("NVML could not open GPU %d: %w", i, ret)}
		}
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("NVML could not open GPU %d: %w", i, ret)
		}
		uuid, ret := h.GetUUID()
		if ret == nvml.ERROR_GPU_IS_LOST {
			return nil, "", &lostError{index: i, err: fmt.Errorf("NVML could not read GPU %d's UUID: %w", i, ret)}
		}
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("NVML could not read GPU %d's UUID: %w", i, ret)
		}
		name, ret := h.GetName()
		if ret != nvml.SUCCESS {
			name = ""
		}
		s.handles[i] = h
		devs[i] = deviceInfo{Index: i, UUID: uuid, Name: name}
	}
	return devs, driver, nil
}

func initError(ret nvml.Return) error {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("libnvidia-ml.so.1 not found: install the NVIDIA driver, or add the folder holding it to LD_LIBRARY_PATH (%w)", ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("the NVIDIA driver is not loaded: check `nvidia-smi` and the nvidia kernel module (%w)", ret)
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("no permission to open the GPU devices: give this user or container access to /dev/nvidia* (%w)", ret)
	default:
		return fmt.Errorf("nvmlInit failed: %w", ret)
	}
}

func (s *nvmlSource) read(indices []int) ([]reading, error) {
	out := make([]reading, len(indices))
	for k, i := range indices {
		if i < 0 || i >= len(s.handles) {
			return nil, fmt.Errorf("GPU %d is no longer listed by NVML", i)
		}
		r, err := s.readOne(i, s.handles[i])
		if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
			return nil, &lostError{index: i, err: err}
		}
		if err != nil {
			return nil, err
		}
		out[k] = r
	}
	return out, nil
}

func (s *nvmlSource) readOne(i int, h nvml.Device) (reading, error) {
	var r reading
	if s.v2 {
		mem, ret := h.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			// v2's used leaves out the driver's reserve; count it, it is
			// no more available to vLLM than allocated memory.
			r.used, r.total, r.free = mem.Used+mem.Reserved, mem.Total, mem.Free
		case nvml.ERROR_ARGUMENT_VERSION_MISMATCH, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
			s.v2 = false // an older driver behind a newer header: use v1 from now on
		default:
			return r, fmt.Errorf("NVML memory query on GPU %d: %w", i, ret)
		}
	}
	if !s.v2 {
		mem, ret := h.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return r, fmt.Errorf("NVML memory query on GPU %d: %w", i, ret)
		}
		r.used, r.total, r.free = mem.Used, mem.Total, mem.Free
	}
	ps, ret := h.GetComputeRunningProcesses()
	switch ret {
	case nvml.SUCCESS:
		r.procs = make([]procUse, 0, len(ps))
		for _, p := range ps {
			used := p.UsedGpuMemory
			if used == ^uint64(0) { // NVML_VALUE_NOT_AVAILABLE
				used = 0
			}
			r.procs = append(r.procs, procUse{pid: int(p.Pid), used: used})
		}
	case nvml.ERROR_NOT_SUPPORTED:
		r.noProcs = true
	default:
		return r, fmt.Errorf("NVML process query on GPU %d: %w", i, ret)
	}
	return r, nil
}

func (s *nvmlSource) close() {
	s.lib.Shutdown()
	s.handles = nil
}
