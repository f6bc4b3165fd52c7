package gpumon

import (
	"os"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
