package supervisor

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// exitInfo is how vLLM's API server ended.
type exitInfo struct {
	Code         int    // -1 when killed by a signal
	Signal       string // "" when it exited
	StartFailure string // the command could not be started at all
}

func (e exitInfo) String() string {
	switch {
	case e.StartFailure != "":
		return "could not start: " + e.StartFailure
	case e.Signal != "":
		return "killed by " + e.Signal
	default:
		return "exit code " + strconv.Itoa(e.Code)
	}
}

// child is a running vLLM tree under its keeper.
type child struct {
	keeperPID int
	apiPID    int           // vLLM's API server; 0 until the keeper reports it
	apiGoneC  chan struct{} // closed when the API server exited (the keeper may still be cleaning up)
	doneC     chan struct{} // closed when the keeper exited: the whole tree is gone
	exitInfo  exitInfo      // valid after doneC
	treeCache atomic.Pointer[[]int]
	seenPIDs  treeSeen // only the machine's goroutine touches it
}

// start launches the keeper (which launches vLLM) from a goroutine that
// locks its OS thread and lives as long as the keeper: the parent-death
// signal fires when the *thread* that forked the child exits, so this thread
// must outlive it.
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

	c := &child{doneC: make(chan struct{}), apiGoneC: make(chan struct{})}
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

	// The keeper's report: the pid first, then how vLLM ended. The pipe
	// closes when the keeper exits (vLLM does not inherit it).
	go func() {
		defer pr.Close()
		defer close(final)
		defer close(pidc)
		defer close(c.apiGoneC) // also when the keeper died without a word
		r := bufio.NewReader(pr)
		for {
			line, err := r.ReadString('\n')
			switch {
			case strings.HasPrefix(line, "pid "):
				pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
				pidc <- pid
			case strings.HasPrefix(line, "start-failed "):
				final <- exitInfo{Code: -1, StartFailure: strings.TrimSpace(strings.TrimPrefix(line, "start-failed "))}
				return
			case strings.HasPrefix(line, "exit "):
				final <- parseExitLine(line)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	c.apiPID = <-pidc // 0 when vLLM did not start
	return c, nil
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

func keeperExit(ps *os.ProcessState, err error) exitInfo {
	if ps == nil {
		return exitInfo{Code: -1, StartFailure: fmt.Sprint(err)}
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

// signalGroup sends sig to the whole vLLM process group (the keeper leads it).
func (c *child) signalGroup(sig syscall.Signal) {
	_ = syscall.Kill(-c.keeperPID, sig)
}

// stop asks vLLM to stop the way it expects: SIGTERM to the API server
// alone, which drains (with --shutdown-timeout) and then stops its own
// engine and workers. A signal to the whole group would reach the
// EngineCore and the workers directly and cut every request in flight.
func (c *child) stop() {
	if c.apiPID > 0 && c.seenPIDs.same(c.apiPID) {
		_ = syscall.Kill(c.apiPID, syscall.SIGTERM)
		return
	}
	// The API server is not known (yet) or gone: what is left is the group's.
	c.signalGroup(syscall.SIGTERM)
}

// kill sends SIGKILL to the group and to every descendant of the keeper,
// including those that left the group.
func (c *child) kill() {
	rest := Descendants(c.keeperPID)
	c.signalGroup(syscall.SIGKILL)
	signalAll(rest, syscall.SIGKILL)
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

// tree is the tree as last read (the keeper's pid first, so the monitor
// always knows the group even before the first read). Safe from any
// goroutine: the GPU monitor asks every sample.
func (c *child) tree() []int {
	if t := c.treeCache.Load(); t != nil {
		return append([]int{c.keeperPID}, (*t)...)
	}
	return []int{c.keeperPID, c.apiPID}
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

// killLeftovers: the keeper kills the whole tree before it exits; if the
// keeper itself was killed, what it left is killed here.
func (c *child) killLeftovers() []int {
	left := c.seenPIDs.survivors()
	signalAll(left, syscall.SIGKILL)
	return left
}

func (c *child) killIfOurs(pid int) bool {
	if !c.seenPIDs.same(pid) {
		return false
	}
	return syscall.Kill(pid, syscall.SIGKILL) == nil
}

// treeSeen remembers every process of vLLM's tree seen during a run, with
// its start time, so a PID reused by an unrelated process is never taken
// for ours.
type treeSeen map[int]uint64

func (t *treeSeen) add(pids []int) {
	if *t == nil {
		*t = treeSeen{}
	}
	for _, p := range pids {
		if info, ok := readStat(p); ok {
			(*t)[p] = info.start
		}
	}
}

func (t treeSeen) pids() []int {
	out := make([]int, 0, len(t))
	for p := range t {
		out = append(out, p)
	}
	return out
}

// same says whether pid is alive and the process seen (same start time).
func (t treeSeen) same(pid int) bool {
	start, ok := t[pid]
	if !ok {
		return false
	}
	info, ok := readStat(pid)
	return ok && info.start == start && info.state != 'Z'
}

// survivors are the processes seen in the tree that are still alive.
func (t treeSeen) survivors() []int {
	var out []int
	for p := range t {
		if t.same(p) {
			out = append(out, p)
		}
	}
	return out
}
