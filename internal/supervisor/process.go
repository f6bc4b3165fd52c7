package supervisor

import (
	"bufio"
	"fmt"
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

// exitInfo is how vLLM's API server ended.
type exitInfo struct {
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

func (e exitInfo) String() string {
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

// keeperKillWait is how long kill() leaves the keeper to empty the tree
// before the guard kills the tree itself, keeper included (a keeper that
// was stopped or is wedged must not keep the tree alive).
const keeperKillWait = 2 * killWait

// child is a running vLLM tree under its keeper.
type child struct {
	keeperPID int
	apiPID    int           // vLLM's API server; 0 until the keeper reports it
	apiGoneC  chan struct{} // closed when the API server exited (the keeper may still be cleaning up)
	doneC     chan struct{} // closed when the keeper exited: the whole tree is gone
	exitInfo  exitInfo      // valid after doneC
	treeCache atomic.Pointer[[]int]
	// seenPIDs: only the machine's goroutine touches it, and the cleanup
	// after the keeper (killLeftovers) it hands off and waits for.
	seenPIDs treeSeen

	// mu guards reaped: until the keeper is reaped its PID, and the process
	// group it leads, cannot name anything else, so signals to them are
	// sent under mu and only while reaped is false.
	mu       sync.Mutex
	reaped   bool
	outlived []procID // what outlived the keeper, being killed (lingering)
	backstop sync.Once
	// backstopAfter is how long kill() leaves the keeper before the
	// guard kills the tree itself: keeperKillWait.
	backstopAfter time.Duration
}

// start launches the keeper (which launches vLLM) from a goroutine that
// locks its OS thread and lives as long as the keeper: the parent-death
// signal fires when the *thread* that forked the child exits, so this thread
// must outlive it. Every error it returns is the guard's own (a pipe, the
// keeper's fork or binary), never vLLM's configuration.
func start(spec launchSpec) (*child, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start vLLM: report pipe: %w", err)
	}
	args := append(append([]string{}, spec.keeper[1:]...),
		"--parent", strconv.Itoa(os.Getpid()), "--grace", spec.grace.String(), "--")
	cmd := exec.Command(spec.keeper[0], append(args, spec.argv...)...)
	cmd.Env = spec.env
	cmd.Dir = spec.dir
	cmd.Stdout = spec.stdout
	cmd.Stderr = spec.stderr
	cmd.ExtraFiles = []*os.File{pw}
	// The keeper exits only after the whole tree is gone, so the output
	// pipes close with it. If the keeper itself is killed, survivors still
	// hold them: do not wait for those beyond a second.
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: keeperDeathSignal}

	c := &child{doneC: make(chan struct{}), apiGoneC: make(chan struct{}), backstopAfter: keeperKillWait}
	pidc := make(chan int, 1)
	final := make(chan exitInfo, 1)
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
			c.exitInfo = e
		} else {
			// The keeper died without reporting (killed): report its own end.
			c.exitInfo = keeperExit(cmd.ProcessState, waitErr)
		}
		close(c.doneC)
	}()
	if err := <-started; err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start vLLM keeper %s: %w", spec.keeper[0], err)
	}
	pw.Close()
	c.keeperPID = cmd.Process.Pid

	// The keeper's report: the pid first, then how vLLM ended, then what
	// its cleanup left. The pipe closes when the keeper exits (vLLM does
	// not inherit it).
	go func() {
		defer pr.Close()
		defer close(final)
		var e exitInfo
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
func parseStartFailed(line string) exitInfo {
	rest := strings.TrimSpace(strings.TrimPrefix(line, "start-failed "))
	kind, msg, _ := strings.Cut(rest, " ")
	switch kind {
	case startFailedGuard:
		return exitInfo{Code: -1, GuardFailure: msg}
	case startFailedCommand:
		return exitInfo{Code: -1, StartFailure: msg}
	}
	return exitInfo{Code: -1, StartFailure: rest}
}

func parseExitLine(line string) exitInfo {
	e := exitInfo{Code: -1}
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

func keeperExit(ps *os.ProcessState, err error) exitInfo {
	if ps == nil {
		return exitInfo{Code: -1, GuardFailure: fmt.Sprint(err)}
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return exitInfo{Code: -1, Signal: unix.SignalName(ws.Signal())}
	}
	return exitInfo{Code: ws.ExitStatus()}
}

func (c *child) pid() int                 { return c.apiPID }
func (c *child) apiGone() <-chan struct{} { return c.apiGoneC }
func (c *child) done() <-chan struct{}    { return c.doneC }
func (c *child) exit() exitInfo           { return c.exitInfo }

// signalGroup sends sig to the whole vLLM process group (the keeper leads
// it), while the keeper is not reaped.
func (c *child) signalGroup(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.reaped {
		_ = syscall.Kill(-c.keeperPID, sig)
	}
}

// signalKeeper sends sig to the keeper alone, while it is not reaped.
func (c *child) signalKeeper(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.reaped {
		_ = syscall.Kill(c.keeperPID, sig)
	}
}

// stop asks vLLM to stop the way it expects: SIGTERM to the API server
// alone, which drains (with --shutdown-timeout) and then stops its own
// engine and workers. A signal to the whole group would reach the
// EngineCore and the workers directly and cut every request in flight.
func (c *child) stop() {
	if start, ok := c.seenPIDs.start[c.apiPID]; ok && c.apiPID > 0 &&
		signalProc(procID{pid: c.apiPID, start: start}, syscall.SIGTERM) {
		return
	}
	// The API server is not known (yet) or gone: what is left is the group's.
	c.signalGroup(syscall.SIGTERM)
}

// kill asks the keeper to kill the whole tree at once: it is the subreaper,
// so orphans of processes that called setsid come back to it and it keeps
// killing until the tree is empty (killTree), then reports what survived
// and exits. The guard does not kill the keeper first: that would send the
// orphans to init, out of anyone's reach. If the keeper has not finished
// within keeperKillWait (it was stopped, or is wedged) the guard kills
// everything below the keeper itself, while the keeper is still there to
// take the orphans back, and the keeper last.
func (c *child) kill() {
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
func (c *child) below() []int {
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
func (c *child) walk() []int {
	c.mu.Lock()
	reaped := c.reaped
	c.mu.Unlock()
	if reaped {
		return nil
	}
	return append([]int{c.keeperPID}, c.below()...)
}

// refresh reads the tree from /proc, keeps it for tree(), and remembers
// every process seen: by the time the API server has exited, EngineCore may
// be gone from /proc while the driver still holds its memory, and the
// release wait must know its PID.
func (c *child) refresh() {
	t := Descendants(c.keeperPID)
	c.treeCache.Store(&t)
	c.seenPIDs.add(t)
}

// tree is the tree now: the keeper's pid first, every live process below
// it read from /proc at this call, then those of the last refresh that are
// gone from /proc (the driver may still hold a dead EngineCore's memory).
// Safe from any goroutine: the GPU monitor asks every sample, and a list
// only as fresh as the last heartbeat missed an EngineCore started since,
// whose memory then read as a neighbour's (a load shorter than a second
// was over before the first heartbeat looked).
func (c *child) tree() []int {
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

func (c *child) seen() []int { return c.seenPIDs.pids() }

// io reads read_bytes + write_bytes from /proc/PID/io for the tree as last
// read. Processes it cannot read (gone, or not ours to read) are left out.
func (c *child) io() map[int]uint64 {
	out := map[int]uint64{}
	for _, pid := range c.tree() {
		if n, ok := readIO(pid); ok {
			out[pid] = n
		}
	}
	return out
}

// killLeftovers: the keeper kills the whole tree before it exits; what it
// could not kill (its survivors report) or what outlived it because the
// keeper itself was killed (the processes seen, still alive) is killed
// here, with its descendants, through pidfds. It returns the PIDs that had
// outlived the keeper, and those still alive after every kill round.
func (c *child) killLeftovers() (outlived, unkillable []int) {
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
func (c *child) leftovers() []procID {
	left := c.seenPIDs.survivors()
	for _, p := range c.exitInfo.Survivors {
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

// lingering: what outlived the keeper and is still alive, with its state
// and the kernel function it waits in.
func (c *child) lingering() []lingerer {
	c.mu.Lock()
	left := c.outlived
	c.mu.Unlock()
	var out []lingerer
	for _, p := range left {
		info, ok := readStat(p.pid)
		if !ok || info.start != p.start || info.state == 'Z' {
			continue
		}
		wchan, _ := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/wchan")
		out = append(out, lingerer{pid: p.pid, state: info.state, wchan: strings.TrimSpace(string(wchan))})
	}
	return out
}

// killIfOurs kills pid if it is still the very process seen in the tree
// (its pidfd checked against the start time seen), and says whether it did.
func (c *child) killIfOurs(pid int) bool {
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
