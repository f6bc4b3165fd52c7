package gpumon

import (
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The tests build the stand-in NVML library into a temporary folder.
func TestMain(m *testing.M) { testkit.MainWithCleanup(m, testbin.Cleanup) }
