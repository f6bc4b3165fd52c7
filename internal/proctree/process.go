package proctree

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Exit is how vLLM's API server ended.
type Exit struct {
	Code   int    // -1 when killed by a signal
	Signal string // "" when it exited
	// StartFailure: the command could not be started because of itself
	// (not found, not executable): vLLM's configuration.
	StartFailure string
	// GuardFailure: the guard could not start vLLM because of an error of
	// its own (no file descriptor, no process slot, no memory, no keeper):
	// not the configuration; it backs off and tries again.
	GuardFailure string
	// Survivors are the processes of the tree the keeper could not kill
	// before it exited (nil when the tree was emptied).
	Survivors []procID
}

func (e Exit) String() string {
	switch {
	case e.GuardFailure != "":
		return "the guard could not start vLLM: " + e.GuardFailure
	case e.StartFailure != "":
		return "could not start: " + e.StartFailure
	case e.Signal != "":
		return "killed by " + e.Signal
	default:
		return "exit code " + strconv.Itoa(e.Code)
	}
}

// Spec is one start of vLLM under its keeper.
type Spec struct {
	Keeper []string // the keeper's argv prefix: [exe, KeeperArg]
	Argv   []string // vLLM's command
	Env    []string
	Dir    string
	Grace  time.Duration // how long the keeper leaves the tree after the API server's exit before it kills it
	Stdout io.Writer
	Stderr io.Writer
}

// Lingerer is a process that outlived the keeper and is not dead yet.
type Lingerer struct {
	PID   int
	State byte   // /proc/PID/stat's state: D is uninterruptible sleep (stuck in the kernel)
	WChan string // the kernel function it waits in, when readable
}

// keeperKillWait is how long kill() leaves the keeper to empty the tree
// before the guard kills the tree itself, keeper included (a keeper that
// was stopped or is wedged must not keep the tree alive).
const keeperKillWait = 2 * killWait

// Child is a running vLLM tree under its keeper.
type Child struct {
	keeperPID int
	apiPID    int           // vLLM's API server; 0 until the keeper reports it
	apiGoneC  chan struct{} // closed when the API server exited (the keeper may still be cleaning up)
	doneC     chan struct{} // closed when the keeper exited: the whole tree is gone
	exit      Exit          // valid after doneC
	treeCache atomic.Pointer[[]int]
	// seenPIDs: only the owner's goroutine (the supervisor's machine)
	// touches it, and the cleanup after the keeper (KillLeftovers) it hands
	// off and waits for.
	seenPIDs treeSeen

	// mu guards reaped: until the keeper is reaped its PID, and the process
	// group it leads, cannot name anything else, so signals to them are
	// sent under mu and only while reaped is false.
	mu       sync.Mutex
	reaped   bool
	outlived []procID // what outlived the keeper, being killed (Lingering)
	backstop sync.Once
	// backstopAfter is how long Kill leaves the keeper before the
	// guard kills the tree itself: keeperKillWait.
	backstopAfter time.Duration
}

// Start launches the keeper (which launches vLLM) from a goroutine that
// locks its OS thread and lives as long as the keeper: the parent-death
// signal fires when the *thread* that forked the child exits, so this thread
// must outlive it. Every error it returns is the guard's own (a pipe, the
// keeper's fork or binary), never vLLM's configuration.
func Start(spec Spec) (*Child, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start vLLM: report pipe: %w", err)
	}
	args := append(append([]string{}, spec.Keeper[1:]...),
		"--parent", strconv.Itoa(os.Getpid()), "--grace", spec.Grace.String(), "--")
	cmd := exec.Command(spec.Keeper[0], append(args, spec.Argv...)...)
	cmd.Env = spec.Env
	cmd.Dir = spec.Dir
	cmd.Stdout = spec.Stdout
	cmd.Stderr = spec.Stderr
	cmd.ExtraFiles = []*os.File{pw}
	// The keeper exits only after the whole tree is gone, so the output
	// pipes close with it. If the keeper itself is killed, survivors still
	// hold them: do not wait for those beyond a second.
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: keeperDeathSignal}

	c := &Child{doneC: make(chan struct{}), apiGoneC: make(chan struct{}), backstopAfter: keeperKillWait}
	pidc := make(chan int, 1)
	final := make(chan Exit, 1)
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with this goroutine, after the keeper.
		err := reaperStart(cmd)
		started <- err
		if err != nil {
			return
		}
		// Wait for the keeper's end without reaping it first, so that no
		// signal meant for it or its group can reach a reused PID.
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		c.mu.Lock()
		c.reaped = true
		c.mu.Unlock()
		waitErr := cmd.Wait()
		reaperForget(cmd.Process.Pid)
		if e, ok := <-final; ok {
			c.exit = e
		} else {
			// The keeper died without reporting (killed): report its own end.
			c.exit = keeperExit(cmd.ProcessState, waitErr)
		}
		close(c.doneC)
	}()
	if err := <-started; err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start vLLM keeper %s: %w", spec.Keeper[0], err)
	}
	pw.Close()
	c.keeperPID = cmd.Process.Pid

	// The keeper's report: the pid first, then how vLLM ended, then what
	// its cleanup left. The pipe closes when the keeper exits (vLLM does
	// not inherit it).
	go func() {
		defer pr.Close()
		defer close(final)
		var e Exit
		reported := false
		pidSent, apiClosed := false, false
		endPID := func() {
			if !pidSent {
				pidSent = true
				close(pidc)
			}
		}
		endAPI := func() {
			if !apiClosed {
				apiClosed = true
				close(c.apiGoneC)
			}
		}
		r := bufio.NewReader(pr)
		for {
			line, err := r.ReadString('\n')
			switch {
			case strings.HasPrefix(line, "pid ") && !pidSent:
				pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
				pidc <- pid
				endPID()
			case strings.HasPrefix(line, "start-failed "):
				e, reported = parseStartFailed(line), true
				endPID()
			case strings.HasPrefix(line, "exit "):
				e, reported = parseExitLine(line), true
				endAPI()
			case strings.HasPrefix(line, "done "):
				e.Survivors = parseDoneLine(line)
			}
			if err != nil {
				break
			}
		}
		endPID()
		endAPI() // also when the keeper died without a word
		if reported {
			final <- e
		}
	}()
	c.apiPID = <-pidc // 0 when vLLM did not start
	return c, nil
}

// parseStartFailed reads `start-failed KIND MESSAGE`: KIND "guard" is the
// guard's own failure, "command" the command's.
func parseStartFailed(line string) Exit {
	rest := strings.TrimSpace(strings.TrimPrefix(line, "start-failed "))
	kind, msg, _ := strings.Cut(rest, " ")
	switch kind {
	case startFailedGuard:
		return Exit{Code: -1, GuardFailure: msg}
	case startFailedCommand:
		return Exit{Code: -1, StartFailure: msg}
	}
	return Exit{Code: -1, StartFailure: rest}
}

func parseExitLine(line string) Exit {
	e := Exit{Code: -1}
	for _, f := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "code":
			e.Code, _ = strconv.Atoi(v)
		case "signal":
			e.Signal = v
		}
	}
	return e
}

// parseDoneLine reads `done survivors=N pids=PID:START,…`.
func parseDoneLine(line string) []procID {
	var out []procID
	for _, f := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(f, "=")
		if k != "pids" || v == "" {
			continue
		}
		for _, ps := range strings.Split(v, ",") {
			a, b, _ := strings.Cut(ps, ":")
			pid, err1 := strconv.Atoi(a)
			start, err2 := strconv.ParseUint(b, 10, 64)
			if err1 == nil && err2 == nil && pid > 0 {
				out = append(out, procID{pid: pid, start: start})
			}
		}
	}
	return out
}

func keeperExit(ps *os.ProcessState, err error) Exit {
	if ps == nil {
		return Exit{Code: -1, GuardFailure: fmt.Sprint(err)}
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return Exit{Code: -1, Signal: unix.SignalName(ws.Signal())}
	}
	return Exit{Code: ws.ExitStatus()}
}

// PID is vLLM's API server (0 when it never started).
func (c *Child) PID() int { return c.apiPID }

// APIGone is closed when the API server exited; the rest of the tree may
// still be going.
func (c *Child) APIGone() <-chan struct{} { return c.apiGoneC }

// Done is closed when the keeper exited: the whole tree is gone.
func (c *Child) Done() <-chan struct{} { return c.doneC }

// Exit is how the API server ended; valid after Done.
func (c *Child) Exit() Exit { return c.exit }

// signalGroup sends sig to the whole vLLM process group (the keeper leads
// it), while the keeper is not reaped.
func (c *Child) signalGroup(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.reaped {
		_ = syscall.Kill(-c.keeperPID, sig)
	}
}

// signalKeeper sends sig to the keeper alone, while it is not reaped.
func (c *Child) signalKeeper(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.reaped {
		_ = syscall.Kill(c.keeperPID, sig)
	}
}

// Stop asks vLLM to stop the way it expects: SIGTERM to the API server
// alone, which drains (with --shutdown-timeout) and then stops its own
// engine and workers. A signal to the whole group would reach the
// EngineCore and the workers directly and cut every request in flight.
func (c *Child) Stop() {
	if start, ok := c.seenPIDs.start[c.apiPID]; ok && c.apiPID > 0 &&
		signalProc(procID{pid: c.apiPID, start: start}, syscall.SIGTERM) {
		return
	}
	// The API server is not known (yet) or gone: what is left is the group's.
	c.signalGroup(syscall.SIGTERM)
}

// Kill asks the keeper to kill the whole tree at once: it is the subreaper,
// so orphans of processes that called setsid come back to it and it keeps
// killing until the tree is empty (killTree), then reports what survived
// and exits. The guard does not kill the keeper first: that would send the
// orphans to init, out of anyone's reach. If the keeper has not finished
// within keeperKillWait (it was stopped, or is wedged) the guard kills
// everything below the keeper itself, while the keeper is still there to
// take the orphans back, and the keeper last.
func (c *Child) Kill() {
	c.signalKeeper(keeperKillSignal)
	c.backstop.Do(func() {
		go func() {
			t := time.NewTimer(c.backstopAfter)
			defer t.Stop()
			select {
			case <-c.doneC:
			case <-t.C:
				killTree(c.below, nil)
				killTree(c.walk, nil)
			}
		}()
	})
}

// below is the keeper's group and children, the keeper left out, while it
// is not reaped; killTree takes in everything below them.
func (c *Child) below() []int {
	c.mu.Lock()
	reaped := c.reaped
	c.mu.Unlock()
	if reaped {
		return nil // its children went to init: nothing is below it now
	}
	kids, _ := childrenOf(c.keeperPID)
	for _, p := range groupMembers(c.keeperPID) {
		if p != c.keeperPID {
			kids = append(kids, p)
		}
	}
	return kids
}

// walk is the keeper (while not reaped) and what is below it.
func (c *Child) walk() []int {
	c.mu.Lock()
	reaped := c.reaped
	c.mu.Unlock()
	if reaped {
		return nil
	}
	return append([]int{c.keeperPID}, c.below()...)
}

// Refresh reads the tree from /proc, keeps it for Tree, and remembers
// every process seen: by the time the API server has exited, EngineCore may
// be gone from /proc while the driver still holds its memory, and the
// release wait must know its PID.
func (c *Child) Refresh() {
	t := Descendants(c.keeperPID)
	c.treeCache.Store(&t)
	c.seenPIDs.add(t)
}

// Tree is the tree now: the keeper's pid first, every live process below
// it read from /proc at this call, then those of the last refresh that are
// gone from /proc (the driver may still hold a dead EngineCore's memory).
// Safe from any goroutine: the GPU monitor asks every sample, and a list
// only as fresh as the last heartbeat missed an EngineCore started since,
// whose memory then read as a neighbour's (a load shorter than a second
// was over before the first heartbeat looked).
func (c *Child) Tree() []int {
	out := append([]int{c.keeperPID}, Descendants(c.keeperPID)...)
	if !slices.Contains(out, c.apiPID) {
		out = append(out, c.apiPID)
	}
	if t := c.treeCache.Load(); t != nil {
		for _, pid := range *t {
			if !slices.Contains(out, pid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// Seen is every PID seen in this run's tree (for the release wait).
func (c *Child) Seen() []int { return c.seenPIDs.pids() }

// IO reads read_bytes + write_bytes from /proc/PID/io for the tree as last
// read. Processes it cannot read (gone, or not ours to read) are left out.
func (c *Child) IO() map[int]uint64 {
	out := map[int]uint64{}
	for _, pid := range c.Tree() {
		if n, ok := readIO(pid); ok {
			out[pid] = n
		}
	}
	return out
}

// KillLeftovers: the keeper kills the whole tree before it exits; what it
// could not kill (its survivors report) or what outlived it because the
// keeper itself was killed (the processes seen, still alive) is killed
// here, with its descendants, through pidfds. It returns the PIDs that had
// outlived the keeper, and those still alive after every kill round. It
// may take long (a process stuck in the kernel): call it off any loop that
// must keep turning.
func (c *Child) KillLeftovers() (outlived, unkillable []int) {
	left := c.leftovers()
	if len(left) == 0 {
		return nil, nil
	}
	c.mu.Lock()
	c.outlived = left
	c.mu.Unlock()
	unkillable = killTree(func() []int { return pidsOf(stillAlive(left)) }, nil)
	return pidsOf(left), unkillable
}

// leftovers is what outlived the keeper: the processes seen in the tree
// that are still alive, and the survivors the keeper reported.
func (c *Child) leftovers() []procID {
	left := c.seenPIDs.survivors()
	for _, p := range c.exit.Survivors {
		if info, ok := readStat(p.pid); ok && info.start == p.start && info.state != 'Z' && !slices.Contains(left, p) {
			left = append(left, p)
		}
	}
	return left
}

// stillAlive is the processes of ps that are still the very ones seen and not
// yet dead.
func stillAlive(ps []procID) []procID {
	var out []procID
	for _, p := range ps {
		if info, ok := readStat(p.pid); ok && info.start == p.start && info.state != 'Z' {
			out = append(out, p)
		}
	}
	return out
}

// Lingering: what outlived the keeper and is still alive, with its state
// and the kernel function it waits in.
func (c *Child) Lingering() []Lingerer {
	c.mu.Lock()
	left := c.outlived
	c.mu.Unlock()
	var out []Lingerer
	for _, p := range left {
		info, ok := readStat(p.pid)
		if !ok || info.start != p.start || info.state == 'Z' {
			continue
		}
		wchan, _ := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/wchan")
		out = append(out, Lingerer{PID: p.pid, State: info.state, WChan: strings.TrimSpace(string(wchan))})
	}
	return out
}

// KillIfOurs kills pid if it is still the very process seen in the tree
// (its pidfd checked against the start time seen), and says whether it did.
func (c *Child) KillIfOurs(pid int) bool {
	id, ok := c.seenPIDs.id(pid)
	if !ok {
		return false
	}
	return signalProc(id, syscall.SIGKILL)
}

// seenCap bounds the processes remembered per run. At the cap, the entries
// of processes that have exited are dropped, oldest first; if every one is
// still alive, new processes are not remembered (the first ones, the API
// server, EngineCore and its workers, are those that hold GPU memory). A
// process not remembered is still killed with the tree by the keeper; only
// the guard's own cleanup after the keeper cannot name it.
const seenCap = 4096

// treeSeen remembers every process of vLLM's tree seen during a run, with
// its start time, so a PID reused by an unrelated process is never taken
// for ours. At most seenCap entries.
type treeSeen struct {
	start   map[int]uint64
	order   []int // PIDs, oldest first
	dropped int   // processes not remembered because of the cap
	limit   int   // the cap; 0 means seenCap
}

func (t *treeSeen) add(pids []int) {
	if t.start == nil {
		t.start = map[int]uint64{}
	}
	for _, p := range identify(pids) {
		if s, ok := t.start[p.pid]; ok && s == p.start {
			continue
		}
		limit := t.limit
		if limit == 0 {
			limit = seenCap
		}
		if _, ok := t.start[p.pid]; !ok && len(t.start) >= limit {
			t.pruneDead()
			if len(t.start) >= limit {
				t.dropped++
				continue
			}
		}
		if _, ok := t.start[p.pid]; !ok {
			t.order = append(t.order, p.pid)
		}
		t.start[p.pid] = p.start // a reused PID of the tree itself: the new process
	}
}

// pruneDead forgets the processes that are no longer alive.
func (t *treeSeen) pruneDead() {
	keep := t.order[:0]
	for _, p := range t.order {
		if t.same(p) {
			keep = append(keep, p)
		} else {
			delete(t.start, p)
		}
	}
	t.order = keep
}

func (t *treeSeen) pids() []int { return append([]int(nil), t.order...) }

// id is pid as it was seen; ok is false when it was never seen.
func (t *treeSeen) id(pid int) (procID, bool) {
	s, ok := t.start[pid]
	return procID{pid: pid, start: s}, ok
}

// same says whether pid is alive and the process seen (same start time).
func (t *treeSeen) same(pid int) bool {
	start, ok := t.start[pid]
	if !ok {
		return false
	}
	info, ok := readStat(pid)
	return ok && info.start == start && info.state != 'Z'
}

// survivors are the processes seen in the tree that are still alive.
func (t *treeSeen) survivors() []procID {
	var out []procID
	for _, p := range t.order {
		if t.same(p) {
			out = append(out, procID{pid: p, start: t.start[p]})
		}
	}
	return out
}
