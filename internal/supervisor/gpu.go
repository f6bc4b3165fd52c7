package supervisor

import (
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/adapters"
)

// MonitorGPU is the GPU view over the NVML monitor (package adapters).
func MonitorGPU(m *gpumon.Monitor) GPU { return adapters.MonitorGPU(m) }

// MonitorGPUHealth is the GPUs' hardware health over the NVML monitor.
func MonitorGPUHealth(m *gpumon.Monitor) GPUHealth { return adapters.MonitorGPUHealth(m) }
