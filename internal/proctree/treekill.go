package proctree

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Every signal the guard and the keeper send to one process of vLLM's tree
// goes through a pidfd opened for that PID and checked against the start
// time the process had when it was seen: a PID that was reused by an
// unrelated process after ours exited is never signalled. Where the kernel
// has no pidfds (before 5.3) the start time is checked just before kill(2),
// which leaves only the instant between the two open.

// procID names one process: a PID and the start time it had (clock ticks
// since boot) when it was seen.
type procID struct {
	pid   int
	start uint64
}

// identify reads the start time of each live PID in pids (zombies and
// processes already gone are left out).
func identify(pids []int) []procID {
	out := make([]procID, 0, len(pids))
	for _, p := range pids {
		if info, ok := readStat(p); ok && info.state != 'Z' {
			out = append(out, procID{pid: p, start: info.start})
		}
	}
	return out
}

// errReplaced: the PID is gone, a zombie, or names another process now.
var errReplaced = errors.New("process gone or its PID reused")

// openProc opens a pidfd for p and checks that it still names p. With no
// pidfd support it returns -1 and a nil error after the same check.
func openProc(p procID) (int, error) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil && !errors.Is(err, unix.ENOSYS) {
		return -1, err // ESRCH: gone; EMFILE: no fd to spare (try again later)
	}
	if info, ok := readStat(p.pid); !ok || info.start != p.start || info.state == 'Z' {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, errReplaced
	}
	if err != nil {
		return -1, nil
	}
	return fd, nil
}

// signalProc sends sig to p if p is still the very process seen, and says
// whether it did.
func signalProc(p procID, sig syscall.Signal) bool {
	fd, err := openProc(p)
	if err != nil {
		return false
	}
	if fd < 0 {
		return syscall.Kill(p.pid, sig) == nil
	}
	defer unix.Close(fd)
	return unix.PidfdSendSignal(fd, sig, nil, 0) == nil
}

// signalProcs sends sig to every process of ps that is still itself.
func signalProcs(ps []procID, sig syscall.Signal) {
	for _, p := range ps {
		signalProc(p, sig)
	}
}

// Bounds of killTree.
const (
	killRounds   = 10              // rounds of stop-walk-kill
	killMaxProcs = 4096            // processes stopped per round
	killWait     = 5 * time.Second // wait per round for the killed to exit
)

// killTree kills every process roots returns and everything below them,
// and those that appear while it does so, until a pass finds none alive.
// Each round stops the tree top-down (SIGSTOP: a stopped process can
// neither fork nor exit and orphan its children): every process is stopped
// before its children are read, so a parent cannot add a child behind the
// walk's back, and a tree that forks as fast as it can is frozen in one
// pass over what exists, not chased by whole-tree walks that each take
// longer than the tree needs to grow. Passes repeat until one adds nothing
// new (a fork that was under way when its parent was stopped). Then it
// SIGKILLs them all through their pidfds and waits (up to killWait; reap
// runs on each wake, for the caller's zombies) until each has exited. At
// most killRounds rounds of at most killMaxProcs processes each. It returns
// the PIDs a last pass still finds alive: nil when the tree is empty.
func killTree(roots func() []int, reap func()) []int {
	for range killRounds {
		found := stopAll(roots)
		if len(found) == 0 {
			if reap != nil {
				reap()
			}
			return nil
		}
		killAndWait(found, reap)
	}
	if reap != nil {
		reap()
	}
	return pidsOf(identify(treeBelow(roots())))
}

// stopAll stops what roots returns and everything below it, top-down,
// passing again until a pass stops nothing new and sees nothing die, and
// returns the processes stopped with their pidfds (-1 without pidfds).
//
// A process that dies during a pass (vLLM's API server ending by itself
// as the guard dies, its output pipes gone) hands its children to the
// keeper, the subreaper, after the pass read the roots: they are in
// neither the roots it read nor below a process it could walk. Such a
// pass stopping nothing new used to end the walk, the tree was called
// empty and the EngineCore lived on (issue 32 item 6). A pass that finds a
// process dead or gone for the first time therefore counts as a change,
// and the next pass reads the roots again.
func stopAll(roots func() []int) map[procID]int {
	found := map[procID]int{}
	dead := map[int]bool{} // PIDs seen dying or gone during the walk: one more pass each
	for len(found) < killMaxProcs {
		added := false
		kids := childLister{}
		queue := roots()
		gone := func(pid int) {
			if !dead[pid] {
				dead[pid] = true
				added = true
			}
		}
		for len(queue) > 0 && len(found) < killMaxProcs {
			pid := queue[0]
			queue = queue[1:]
			info, ok := readStat(pid)
			if !ok || info.state == 'Z' {
				gone(pid)
				continue
			}
			p := procID{pid: pid, start: info.start}
			if _, ok := found[p]; !ok {
				fd, err := openProc(p)
				if err != nil {
					gone(pid)
					continue
				}
				if fd < 0 {
					_ = syscall.Kill(p.pid, syscall.SIGSTOP)
				} else {
					_ = unix.PidfdSendSignal(fd, unix.SIGSTOP, nil, 0)
				}
				found[p] = fd
				added = true
			}
			queue = append(queue, kids.of(pid)...)
		}
		if !added {
			break
		}
	}
	return found
}

// treeBelow is roots and every live process below them.
func treeBelow(roots []int) []int {
	kids := childLister{}
	seen := map[int]bool{}
	var out []int
	for len(roots) > 0 {
		pid := roots[0]
		roots = roots[1:]
		if seen[pid] || !alive(pid) {
			continue
		}
		seen[pid] = true
		out = append(out, pid)
		roots = append(roots, kids.of(pid)...)
	}
	return out
}

// childLister lists a process's children: from its children files, or,
// where the kernel has none, from one scan of /proc per lister.
type childLister struct {
	byParent map[int][]int // nil until the kernel is found to lack children files
}

func (l *childLister) of(pid int) []int {
	if l.byParent == nil {
		if out, ok := childrenOf(pid); ok {
			return out
		}
		l.byParent = map[int][]int{}
		for _, p := range allProcs() {
			if p.state != 'Z' {
				l.byParent[p.ppid] = append(l.byParent[p.ppid], p.pid)
			}
		}
	}
	return l.byParent[pid]
}

// killAndWait SIGKILLs every process of found and waits, up to killWait,
// until each has exited (a pidfd polls readable once its process is a
// zombie). It closes the pidfds.
func killAndWait(found map[procID]int, reap func()) {
	fds := make([]unix.PollFd, 0, len(found))
	var blind []procID // no pidfd: checked through /proc
	for p, fd := range found {
		if fd < 0 {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
			blind = append(blind, p)
			continue
		}
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	defer func() {
		for _, fd := range found {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	deadline := time.Now().Add(killWait)
	for len(fds) > 0 || len(blind) > 0 {
		if reap != nil {
			reap()
		}
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return
		}
		if len(blind) > 0 {
			// Without pidfds there is nothing to wait on: look again soon.
			ms = min(ms, 10)
			rest := blind[:0]
			for _, p := range blind {
				if info, ok := readStat(p.pid); ok && info.start == p.start && info.state != 'Z' {
					rest = append(rest, p)
				}
			}
			blind = rest
		}
		if len(fds) == 0 {
			if len(blind) > 0 {
				time.Sleep(time.Duration(ms) * time.Millisecond)
			}
			continue
		}
		n, err := unix.Poll(fds, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
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
	if reap != nil {
		reap()
	}
}

func pidsOf(ps []procID) []int {
	if len(ps) == 0 {
		return nil
	}
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.pid
	}
	return out
}

// KillTree kills root, its process group and every descendant of root
// (those that left the group or the session included) with killTree, and
// returns the PIDs still alive at the end. For a command the caller started
// (an alert command): the caller reaps root itself.
func KillTree(root int) []int {
	left := killTree(func() []int { return []int{root} }, nil)
	_ = syscall.Kill(-root, syscall.SIGKILL) // a group member the walks missed
	return left
}
