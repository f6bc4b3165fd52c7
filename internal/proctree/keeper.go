package proctree

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The keeper is a small process between the guard and vLLM: the guard
// re-executes itself as `vllm-guard __keeper`. It leads vLLM's process
// group, is a child subreaper for it, and holds the guard's parent-death
// signal. So whatever happens to the guard, even SIGKILL, the keeper kills
// the whole vLLM tree (API server, EngineCore, workers, and descendants that
// left the group), which a parent-death signal on the API server alone could
// not do: vLLM's EngineCore survives its parent.
//
// Protocol on fd 3 (a pipe to the guard), one line each:
//
//	pid N                          vLLM's API server started
//	start-failed command MESSAGE   the command could not be started because of
//	                               itself (not found, not executable): configuration
//	start-failed guard MESSAGE     it could not be started because of the keeper's
//	                               own trouble (no fd, no process slot, no memory)
//	exit code=N signal=NAME        vLLM's API server exited (signal "" if it exited)
//	done survivors=N pids=P:S,…    the cleanup is over; N processes (PID:start
//	                               time) could not be killed
//
// As soon as the API server exits the keeper reports it, then sends SIGTERM
// to what is left of the tree, waits up to --grace, and kills what is still
// there with killTree: stop everything, walk again until nothing new, kill,
// wait, in bounded rounds until the tree is empty. The guard's kill (the
// keeper's kill signal) and the guard's death (the parent-death signal) run
// the same killTree at once. vLLM starts with /dev/null on fd 0.

// KeeperArg is the hidden subcommand that runs the keeper.
const KeeperArg = "__keeper"

// keeperDeathSignal is the parent-death signal the guard gives the keeper;
// nothing else sends it.
const keeperDeathSignal = syscall.SIGUSR1

// keeperKillSignal: the guard asks the keeper to kill the whole tree now.
const keeperKillSignal = syscall.SIGUSR2

// Kinds of start-failed.
const (
	startFailedCommand = "command"
	startFailedGuard   = "guard"
)

// RunKeeper is the keeper's main. args are the arguments after KeeperArg.
func RunKeeper(args []string) int {
	// The keeper holds vLLM's command line and environment (API keys):
	// no core dump, no ptrace or /proc/PID/environ by the same user. vLLM,
	// which it execs, is dumpable again (execve resets the flag).
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	fs := flag.NewFlagSet(KeeperArg, flag.ContinueOnError)
	grace := fs.Duration("grace", 30*time.Second, "")
	parent := fs.Int("parent", 0, "")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "vllm-guard keeper: internal use only: __keeper --parent PID --grace D -- ARGV...")
		return 2
	}
	// vLLM must not inherit the report pipe: the guard reads it to its end
	// to learn that the keeper is gone.
	syscall.CloseOnExec(3)
	report := os.NewFile(3, "guard-report")
	w := bufio.NewWriter(report)
	say := func(format string, a ...any) {
		fmt.Fprintf(w, format+"\n", a...)
		w.Flush()
	}

	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	// SIGCHLD has a channel of its own: signal.Notify drops what does not
	// fit, and a burst of children ending must never crowd out the guard's
	// death or kill signal. One pending SIGCHLD is enough (reap waits for
	// every zombie).
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, keeperDeathSignal, keeperKillSignal)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	next := func() os.Signal {
		select {
		case sig := <-sigs:
			return sig
		case <-chld:
			return syscall.SIGCHLD
		}
	}
	// The guard may have died before the handler was in place.
	if *parent != 0 && os.Getppid() != *parent {
		return 1
	}

	argv := fs.Args()
	path, err := lookPath(argv[0])
	if err != nil {
		say("start-failed %s %s", startFailureKind(err), oneLine(err.Error()))
		return 0
	}
	// vLLM gets /dev/null as stdin: with fd 0 closed its first open() would
	// become its stdin.
	null, err := os.Open(os.DevNull)
	if err != nil {
		say("start-failed %s %s", startFailedGuard, oneLine(err.Error()))
		return 0
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{null, os.Stdout, os.Stderr},
	})
	null.Close()
	if err != nil {
		say("start-failed %s %s", startFailureKind(err), oneLine(err.Error()))
		return 0
	}
	main := proc.Pid
	say("pid %d", main)

	self := os.Getpid()
	tree := func() []int {
		// Group members and everything below the keeper: descendants that
		// called setsid are still below us (we are their subreaper).
		seen := map[int]bool{self: true}
		var out []int
		for _, p := range append(groupMembers(self), Descendants(self)...) {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
		return out
	}
	var mainStatus *syscall.WaitStatus
	reap := func() {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				return
			}
			if pid == main {
				s := ws
				mainStatus = &s
			}
		}
	}
	// What killTree starts from: it stops each process before reading its
	// children, so a tree that forks as fast as it can is frozen from the
	// top instead of chased.
	roots := func() []int {
		kids, _ := childrenOf(self)
		for _, p := range groupMembers(self) {
			if p != self {
				kids = append(kids, p)
			}
		}
		return kids
	}
	var survivors []int
	killAll := func() { survivors = killTree(roots, reap) }
	done := func() {
		reap()
		ids := identify(survivors)
		parts := make([]string, len(ids))
		for i, p := range ids {
			parts[i] = fmt.Sprintf("%d:%d", p.pid, p.start)
		}
		say("done survivors=%d pids=%s", len(ids), strings.Join(parts, ","))
	}
	guardGone := func(sig os.Signal) bool { return sig == keeperDeathSignal || os.Getppid() != *parent }

	for mainStatus == nil {
		sig := next()
		switch {
		case guardGone(sig):
			// The guard is gone: nobody is left to supervise, so nothing may survive.
			killAll()
			return 1
		case sig == keeperKillSignal:
			killAll()
		case sig == syscall.SIGCHLD:
			reap()
		}
		// Any other signal is the keeper's to absorb. The guard signals
		// vLLM's API server itself (SIGTERM, which vLLM drains on); a
		// terminal's SIGINT or SIGTERM to the whole group reaches vLLM too,
		// which handles those, and the keeper waits for it to exit. SIGHUP
		// is caught only so that a hangup does not kill the keeper: vLLM
		// installs no SIGHUP handler (Python's default kills it), so the
		// guard never forwards one (to the guard, SIGHUP means reload).
	}

	// The API server is gone: say so at once (the guard must not take the
	// time the cleanup needs for a hang), then clean up what it left behind.
	code, sig := -1, ""
	if mainStatus.Signaled() {
		sig = unix.SignalName(mainStatus.Signal())
	} else {
		code = mainStatus.ExitStatus()
	}
	say("exit code=%d signal=%s", code, sig)
	if rest := identify(tree()); len(rest) > 0 {
		signalProcs(rest, syscall.SIGTERM)
		timer := time.NewTimer(*grace)
		defer timer.Stop()
	grace:
		for len(tree()) > 0 {
			var sig os.Signal
			select {
			case sig = <-sigs:
			case <-chld:
				sig = syscall.SIGCHLD
			case <-timer.C:
				break grace
			}
			if guardGone(sig) {
				killAll()
				done()
				return 1
			}
			if sig == keeperKillSignal {
				break grace
			}
			reap()
		}
		killAll()
	}
	done()
	return 0
}

// startFailureKind says whose fault a failed start is: the command's (it
// does not exist, is not executable, is not a program: configuration) or
// the keeper's (no file descriptor, no process slot, no memory, anything
// else: the guard retries).
func startFailureKind(err error) string {
	if errors.Is(err, errNotExecutable) || errors.Is(err, errNotInPath) {
		return startFailedCommand
	}
	for _, e := range []syscall.Errno{syscall.ENOENT, syscall.EACCES, syscall.ENOEXEC, syscall.ENOTDIR,
		syscall.ELOOP, syscall.ENAMETOOLONG, syscall.E2BIG, syscall.EISDIR, syscall.EPERM} {
		if errors.Is(err, e) {
			return startFailedCommand
		}
	}
	return startFailedGuard
}

// lookPath's own refusals: the command names no program.
var (
	errNotExecutable = errors.New("not an executable file")
	errNotInPath     = errors.New("executable file not found in $PATH")
)

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// lookPath is exec.LookPath without its relative-path refusal: an operator's
// "./serve.sh" means what it says.
func lookPath(file string) (string, error) {
	if strings.Contains(file, "/") {
		fi, err := os.Stat(file)
		if err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s: %w", file, errNotExecutable)
		}
		return file, nil
	}
	for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: %w", file, errNotInPath)
}
