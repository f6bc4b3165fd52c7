package supervisor

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/vllm-guard/vllm-guard/internal/proctree"
)

// The test binary doubles as the keeper, as the guard binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == proctree.KeeperArg {
		os.Exit(proctree.RunKeeper(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}
