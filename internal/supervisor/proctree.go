package supervisor

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// procInfo is what /proc/PID/stat says about one process.
type procInfo struct {
	pid, ppid, pgid int
	state           byte
	start           uint64 // start time in clock ticks since boot: tells a reused PID apart
}

// readStat parses /proc/PID/stat. The command name may hold spaces and
// parentheses, so fields are read after the last ')'.
func readStat(pid int) (procInfo, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procInfo{}, false
	}
	f := bytes.Fields(b[i+2:])
	// state(0) ppid(1) pgrp(2) ... starttime is field 22 of stat, index 19 here.
	if len(f) < 20 {
		return procInfo{}, false
	}
	p := procInfo{pid: pid, state: f[0][0]}
	p.ppid, _ = strconv.Atoi(string(f[1]))
	p.pgid, _ = strconv.Atoi(string(f[2]))
	p.start, _ = strconv.ParseUint(string(f[19]), 10, 64)
	return p, true
}

// allProcs lists every process visible in /proc.
func allProcs() []procInfo {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]procInfo, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if p, ok := readStat(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// Descendants returns the live processes below root (not root itself).
// It follows /proc/PID/task/TID/children from root down — a few small reads
// for vLLM's handful of processes — and walks all of /proc only where the
// kernel lacks those files.
func Descendants(root int) []int {
	if out, ok := childrenFiles(root); ok {
		return out
	}
	return scanDescendants(root)
}

// childrenFiles lists root's descendants through the children files; ok is
// false when the kernel does not provide them.
func childrenFiles(root int) ([]int, bool) {
	if _, err := os.Stat("/proc/" + strconv.Itoa(root) + "/task"); err != nil {
		return nil, true // root is gone: no descendants to find this way
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		kids, ok := childrenOf(pid)
		if !ok {
			if pid == root {
				return nil, false
			}
			continue
		}
		for _, c := range kids {
			if p, ok := readStat(c); ok && p.state != 'Z' {
				out = append(out, c)
			}
			queue = append(queue, c)
		}
	}
	return out, true
}

// childrenOf lists pid's children from its threads' children files; ok is
// false when the kernel does not provide those files (a process gone
// meanwhile has no children: ok).
func childrenOf(pid int) ([]int, bool) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil, true
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(dir + t.Name() + "/children")
		if err != nil {
			if os.IsNotExist(err) && alive(pid) {
				if _, err := os.Stat(dir + t.Name()); err == nil {
					return nil, false
				}
			}
			continue
		}
		for _, f := range bytes.Fields(b) {
			if c, err := strconv.Atoi(string(f)); err == nil {
				out = append(out, c)
			}
		}
	}
	return out, true
}

// scanDescendants walks every process in /proc, following parent links.
func scanDescendants(root int) []int {
	procs := allProcs()
	children := map[int][]int{}
	for _, p := range procs {
		if p.state != 'Z' {
			children[p.ppid] = append(children[p.ppid], p.pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// groupMembers returns the live processes in process group pgid.
func groupMembers(pgid int) []int {
	var out []int
	for _, p := range allProcs() {
		if p.pgid == pgid && p.state != 'Z' {
			out = append(out, p.pid)
		}
	}
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	p, ok := readStat(pid)
	return ok && p.state != 'Z'
}

func signalAll(pids []int, sig syscall.Signal) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, sig)
	}
}

// hostOOMKills reads the kernel OOM killer's count for the guard's memory
// cgroup, which vLLM's tree shares; -1 when unknown.
func hostOOMKills() int64 {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return -1
	}
	return oomKills(string(b), os.ReadFile)
}

// oomKills finds the memory cgroup in a /proc/PID/cgroup text and reads its
// oom_kill count: cgroup v2's memory.events ("0::/path"), or, on hosts whose
// memory controller is still on cgroup v1 (older container hosts: the line
// "N:memory:/path"), memory.oom_control (kernel 4.13+). -1 when neither
// is readable.
func oomKills(procCgroup string, read func(string) ([]byte, error)) int64 {
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

// readIO is the storage I/O of pid: read_bytes + write_bytes of /proc/PID/io
// (bytes fetched from and sent to storage, so a download that writes to
// the cache counts, and CPU spinning or pipe chatter does not).
func readIO(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, false
	}
	var total uint64
	found := 0
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range []string{"read_bytes: ", "write_bytes: "} {
			if v, ok := strings.CutPrefix(l, k); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, false
				}
				total += n
				found++
			}
		}
	}
	return total, found == 2
}
