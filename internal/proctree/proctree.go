// Package proctree owns vLLM's process tree: the keeper (`vllm-guard
// __keeper`, which leads vLLM's process group, is its child subreaper and
// holds the guard's parent-death signal), the guard's side of it (Start,
// Child: the keeper's report, the tree as read from /proc, what outlived
// the keeper), the tree kill (stop top-down, walk until nothing new,
// SIGKILL through pidfds checked against the start time seen, in bounded
// rounds: KillTree), and the guard's reaper (StartCommand, BecomeSubreaper)
// for the children it starts and the orphans it inherits as PID 1.
//
// The supervisor uses it behind its own small launcher/proc interface; the
// alert command runs through StartCommand and KillTree.
package proctree

import (
	"bytes"
	"os"
	"strconv"
	"strings"
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
