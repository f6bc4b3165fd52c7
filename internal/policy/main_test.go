package policy

import (
	"testing"

	"go.uber.org/goleak"
)

// The policy starts no goroutines; goleak keeps it that way (synctest
// bubbles in the tests must end cleanly too).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
