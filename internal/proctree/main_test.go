package proctree

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// The test binary doubles as the keeper, as the guard binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == KeeperArg {
		os.Exit(RunKeeper(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}
