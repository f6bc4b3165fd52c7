package adapters

import (
	"os"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/proctree"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The test binary doubles as the keeper, as the guard binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == proctree.KeeperArg {
		os.Exit(proctree.RunKeeper(os.Args[2:]))
	}
	testkit.Main(m)
}
