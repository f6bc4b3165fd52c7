package alerts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of killTree: rounds of stop-and-kill, processes per round, and the
// wait for the killed ones to be gone.
const (
	killRounds   = 10
	killMaxProcs = 4096
	killWait     = 5 * time.Second
)

// proc is one process, identified by PID and start time (clock ticks since
// boot) so that a PID reused by an unrelated process is never signalled.
type proc struct {
	pid   int
	start uint64
}

// killTree kills root and every descendant of it, those that left its
// process group or session (setsid) included, and waits until they are
// gone. Each round walks the tree from root through
// /proc/PID/task/*/children, stops every process found (SIGSTOP: a stopped
// process can neither fork nor exit and orphan its children), walks again
// until no new process appears, then SIGKILLs them all and the group, and
// waits for them to exit. Rounds repeat until a walk finds nothing alive,
// at most killRounds times. It returns the PIDs still alive at the end.
//
// A descendant whose parent exited before the kill was reparented away from
// root (to init or a subreaper) and is out of its reach.
func killTree(root int) []int {
	var left []int
	for range killRounds {
		found := stopTree(root)
		// The group too: a member the walk missed (a race with an exit).
		_ = syscall.Kill(-root, syscall.SIGKILL)
		if len(found) == 0 {
			return left
		}
		left = killAndWait(found)
	}
	return left
}

// stopTree stops root and its descendants and returns them with a pidfd
// each, walking until a walk adds nothing.
func stopTree(root int) map[proc]int {
	found := map[proc]int{}
	for len(found) < killMaxProcs {
		added := false
		for _, p := range tree(root) {
			if _, ok := found[p]; ok || len(found) >= killMaxProcs {
				continue
			}
			fd, err := openProc(p)
			if err != nil {
				continue // gone already, or its PID now names another process
			}
			_ = unix.PidfdSendSignal(fd, unix.SIGSTOP, nil, 0)
			found[p] = fd
			added = true
		}
		if !added {
			break
		}
	}
	return found
}

// killAndWait SIGKILLs every process of found through its pidfd, waits up
// to killWait for them to exit, closes the pidfds and returns the PIDs of
// those still alive.
func killAndWait(found map[proc]int) []int {
	fds := make([]unix.PollFd, 0, len(found))
	pids := map[int32]int{}
	for p, fd := range found {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		pids[int32(fd)] = p.pid
	}
	defer func() {
		for _, fd := range found {
			unix.Close(fd)
		}
	}()
	// A pidfd polls readable once its process has exited (a zombie
	// counts: it holds nothing but its PID).
	deadline := time.Now().Add(killWait)
	for len(fds) > 0 {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			break
		}
		n, err := unix.Poll(fds, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			break
		}
		if n <= 0 {
			continue
		}
		rest := fds[:0]
		for _, f := range fds {
			if f.Revents == 0 {
				rest = append(rest, f)
			}
		}
		fds = rest
	}
	var left []int
	for _, f := range fds {
		left = append(left, pids[f.Fd])
	}
	return left
}

// openProc opens a pidfd for p and checks that it still names p (same
// start time), so that a signal through it cannot reach a reused PID.
func openProc(p proc) (int, error) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		return -1, err
	}
	if st, err := readStat(p.pid); err != nil || st.start != p.start || st.state == 'Z' {
		unix.Close(fd)
		return -1, fmt.Errorf("process %d is gone or was replaced", p.pid)
	}
	return fd, nil
}

// tree returns root and its live descendants, root first.
func tree(root int) []proc {
	var out []proc
	queue := []int{root}
	seen := map[int]bool{}
	for len(queue) > 0 && len(out) < killMaxProcs {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' && pid != root {
			continue
		}
		if st.state != 'Z' {
			out = append(out, proc{pid: pid, start: st.start})
		}
		queue = append(queue, children(pid)...)
	}
	return out
}

// children lists the children of every thread of pid (a child belongs to
// the thread that forked it).
func children(pid int) []int {
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

type stat struct {
	state byte
	ppid  int
	start uint64
}

// readStat reads the state, parent and start time of pid from
// /proc/PID/stat. The command name (field 2) may hold spaces and
// parentheses: the fields after it start after its last ')'.
func readStat(pid int) (stat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return stat{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	// Fields 3 (state), 4 (ppid) … 22 (starttime).
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return stat{}, fmt.Errorf("/proc/%d/stat: %d fields after the name, want 20 or more", pid, len(f))
	}
	ppid, _ := strconv.Atoi(f[1])
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: start time %q: %w", pid, f[19], err)
	}
	return stat{state: f[0][0], ppid: ppid, start: start}, nil
}
