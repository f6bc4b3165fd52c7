package adapters

import (
	"os"
	"strings"
)

// BootID is the host's boot id (a new one at each boot: the page cache
// is empty again), "" when it cannot be read.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(b) > 64 {
		return ""
	}
	return strings.TrimSpace(string(b))
}
