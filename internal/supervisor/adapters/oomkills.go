package adapters

import (
	"os"
	"strconv"
	"strings"
)

// hostOOMKills reads the kernel OOM killer's count for the guard's memory
// cgroup, which vLLM's tree shares; -1 when unknown.
func HostOOMKills() int64 {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return -1
	}
	return OomKills(string(b), os.ReadFile)
}

// oomKills finds the memory cgroup in a /proc/PID/cgroup text and reads its
// oom_kill count: cgroup v2's memory.events ("0::/path"), or, on hosts whose
// memory controller is still on cgroup v1 (older container hosts: the line
// "N:memory:/path"), memory.oom_control (kernel 4.13+). -1 when neither
// is readable.
func OomKills(procCgroup string, read func(string) ([]byte, error)) int64 {
	var v1, v2 string
	hasV2 := false
	for _, l := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2, hasV2 = parts[2], true
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1 = parts[2]
			}
		}
	}
	count := func(path string) int64 {
		b, err := read(path)
		if err != nil {
			return -1
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n
				}
			}
		}
		return -1
	}
	if v1 != "" {
		if n := count("/sys/fs/cgroup/memory" + v1 + "/memory.oom_control"); n >= 0 {
			return n
		}
	}
	if hasV2 {
		return count("/sys/fs/cgroup" + v2 + "/memory.events")
	}
	return -1
}
