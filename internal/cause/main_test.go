package cause

import (
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The policy starts no goroutines; goleak keeps it that way (synctest
// bubbles in the tests must end cleanly too).
func TestMain(m *testing.M) { testkit.Main(m) }
