package gpumon

import (
	"os"
	"strconv"
	"strings"
)

// procRoot is where process information is read from (a variable so a test
// can point it at a fixture tree).
var procRoot = "/proc"

// pidVisible reports whether pid exists in this process's PID namespace.
func pidVisible(pid int) bool {
	_, err := os.Stat(procRoot + "/" + strconv.Itoa(pid))
	return err == nil
}

// commandOf is the process's command line with NULs as spaces, cut to a
// length a table can show; "" when the process is not visible.
func commandOf(pid int) string {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return ""
	}
	s := strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
	const maxLen = 200
	if len(s) > maxLen {
		s = strings.ToValidUTF8(s[:maxLen], "") + "…"
	}
	return s
}
