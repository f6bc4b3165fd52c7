package supervisor

import (
	"bufio"
	"fmt"
	"io"
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

// launchSpec is one start of vLLM.
type launchSpec struct {
	keeper []string // the keeper's argv prefix: [exe, KeeperArg]
	argv   []string
	env    []string
	dir    string
	grace  time.Duration
	stdout io.Writer
	stderr io.Writer
}

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
	pid       int           // vLLM's API server; 0 until the keeper reports it
	apiGone   chan struct{} // closed when the API server exited (the keeper may still be cleaning up)
	done      chan struct{} // closed when the keeper exited: the whole tree is gone
	exit      exitInfo      // valid after done
	treeCache atomic.Pointer[[]int]
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

	c := &child{done: make(chan struct{}), apiGone: make(chan struct{})}
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
			c.exit = e
		} else {
			// The keeper died without reporting (killed): report its own end.
			c.exit = keeperExit(cmd.ProcessState, waitErr)
		}
		close(c.done)
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
		defer close(c.apiGone) // also when the keeper died without a word
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
	c.pid = <-pidc // 0 when vLLM did not start
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

// signalGroup sends sig to the whole vLLM process group (the keeper leads it).
func (c *child) signalGroup(sig syscall.Signal) {
	_ = syscall.Kill(-c.keeperPID, sig)
}

// kill sends SIGKILL to the group and to every descendant of the keeper,
// including those that left the group.
func (c *child) kill() {
	rest := Descendants(c.keeperPID)
	c.signalGroup(syscall.SIGKILL)
	signalAll(rest, syscall.SIGKILL)
}

// tree lists the live processes of this vLLM: the keeper's descendants.
func (c *child) tree() []int { return Descendants(c.keeperPID) }

// refreshTree reads the tree from /proc and keeps it for cachedTree: the
// GPU monitor asks every sample, and one /proc walk a second is enough.
func (c *child) refreshTree() []int {
	t := c.tree()
	c.treeCache.Store(&t)
	return t
}

// cachedTree is the tree as last read (the keeper's pid first, so the
// monitor always knows the group even before the first read).
func (c *child) cachedTree() []int {
	if t := c.treeCache.Load(); t != nil {
		return append([]int{c.keeperPID}, (*t)...)
	}
	return []int{c.keeperPID, c.pid}
}
