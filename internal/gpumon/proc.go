package gpumon

import (
	"os"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// procRoot is where process information is read from (a variable so a test
// can point it at a fixture tree).
var procRoot = "/proc"

// pidVisible reports whether pid exists in this process's PID namespace.
func pidVisible(pid int) bool {
	_, err := os.Stat(procRoot + "/" + strconv.Itoa(pid))
	return err == nil
}

// commandOf is the process's command line with NULs as spaces, secret
// flags' values (vLLM's --api-key) masked, cut to a length a table can
// show; "" when the process is not visible.
func commandOf(pid int) string {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return ""
	}
	argv := vllmargs.MaskArgv(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil)
	s := strings.TrimRight(strings.Join(argv, " "), " ")
	const maxLen = 200
	if len(s) > maxLen {
		s = strings.ToValidUTF8(s[:maxLen], "") + "…"
	}
	return s
}
