package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tagVar marks every simulator process of one run (inherited by the
// EngineCore and any descendant), so the benchmark finds them in /proc
// whoever their parent is now.
const tagVar = "STORM_RUN"

// proc is one live process as /proc shows it.
type proc struct {
	pid, ppid int
	start     uint64 // start time in clock ticks: tells a reused pid apart
	tag       string // value of STORM_RUN, "" if none
}

// procTable is a snapshot of every live, non-zombie process.
type procTable map[int]proc

// parseStat reads pid, ppid, state and start time from /proc/PID/stat.
// The command name may hold spaces and parentheses: split after the last ')'.
func parseStat(b []byte) (ppid int, state byte, start uint64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+2:]))
	// fields after the name: state(0) ppid(1) … starttime(19)
	if len(f) < 20 {
		return 0, 0, 0, false
	}
	p, err1 := strconv.Atoi(f[1])
	st, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	return p, f[0][0], st, true
}

// envValue returns the value of key in a NUL-separated environ block.
func envValue(environ []byte, key string) string {
	for kv := range bytes.SplitSeq(environ, []byte{0}) {
		if len(kv) > len(key) && kv[len(key)] == '=' && string(kv[:len(key)]) == key {
			return string(kv[len(key)+1:])
		}
	}
	return ""
}

// scanner shares /proc scans between the runs: the tag of a process is
// read once per (pid, start time), since environ never changes.
type scanner struct {
	mu    sync.Mutex
	last  procTable
	at    time.Time
	cache map[[2]uint64]string
}

func newScanner() *scanner { return &scanner{cache: map[[2]uint64]string{}} }

// table returns a snapshot at most maxAge old.
func (s *scanner) table(maxAge time.Duration) procTable {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil && time.Since(s.at) < maxAge {
		return s.last
	}
	ents, _ := os.ReadDir("/proc")
	t := make(procTable, len(ents))
	seen := make(map[[2]uint64]string, len(s.cache))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		ppid, state, start, ok := parseStat(b)
		if !ok || state == 'Z' || state == 'X' {
			continue
		}
		key := [2]uint64{uint64(pid), start}
		tag, ok := s.cache[key]
		if !ok {
			env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
			tag = envValue(env, tagVar)
		}
		seen[key] = tag
		t[pid] = proc{pid: pid, ppid: ppid, start: start, tag: tag}
	}
	s.cache, s.last, s.at = seen, t, time.Now()
	return t
}

// tagged lists the processes of one run.
func (t procTable) tagged(tag string) []proc {
	var out []proc
	for _, p := range t {
		if p.tag == tag {
			out = append(out, p)
		}
	}
	return out
}

// descends reports whether pid is root or below it.
func (t procTable) descends(pid, root int) bool {
	if root <= 0 {
		return false
	}
	for range 64 { // bounded: a pid reused mid-scan can make a loop
		if pid == root {
			return true
		}
		p, ok := t[pid]
		if !ok || p.ppid <= 1 {
			return false
		}
		pid = p.ppid
	}
	return false
}

// youngestChild is the most recently started child of parent (0 if none).
func (t procTable) youngestChild(parent int) int {
	best, bestStart := 0, uint64(0)
	for _, p := range t {
		if p.ppid == parent && (best == 0 || p.start > bestStart) {
			best, bestStart = p.pid, p.start
		}
	}
	return best
}

// parseProcsFile sums the bytes of a stand-in NVML procs file:
// "<device_index> <used_bytes>" per line.
func parseProcsFile(b []byte) int64 {
	var sum int64
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue
		}
		if n, err := strconv.ParseInt(f[1], 10, 64); err == nil && n > 0 && sum+n > sum {
			sum += n
		}
	}
	return sum
}

// gpuBytes is the GPU memory the stand-in NVML shows for these processes.
func gpuBytes(gpuDir string, ps []proc) int64 {
	var sum int64
	for _, p := range ps {
		if b, err := os.ReadFile(filepath.Join(gpuDir, "procs", strconv.Itoa(p.pid))); err == nil {
			sum += parseProcsFile(b)
		}
	}
	return sum
}

// killAll SIGKILLs these processes (a container's PID namespace ending, a
// cgroup's SIGKILL, or the benchmark's own cleanup).
func killAll(ps []proc) {
	for _, p := range ps {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// signalAll sends sig to these processes.
func signalAll(ps []proc, sig syscall.Signal) {
	for _, p := range ps {
		_ = syscall.Kill(p.pid, sig)
	}
}
