package supervisor

import (
	"bufio"
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
//	pid N                     vLLM's API server started
//	start-failed MESSAGE      the command could not be started
//	exit code=N signal=NAME   vLLM's API server exited (signal "" if it exited)
//
// As soon as the API server exits the keeper reports it, then sends SIGTERM
// to what is left of the tree, waits up to --grace, sends SIGKILL, reaps
// everything, and exits 0.

// KeeperArg is the hidden subcommand that runs the keeper.
const KeeperArg = "__keeper"

// keeperDeathSignal is the parent-death signal the guard gives the keeper;
// nothing else sends it.
const keeperDeathSignal = syscall.SIGUSR1

// RunKeeper is the keeper's main. args are the arguments after KeeperArg.
func RunKeeper(args []string) int {
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
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, keeperDeathSignal)
	// The guard may have died before the handler was in place.
	if *parent != 0 && os.Getppid() != *parent {
		return 1
	}

	argv := fs.Args()
	path, err := lookPath(argv[0])
	if err != nil {
		say("start-failed %s", oneLine(err.Error()))
		return 0
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{nil, os.Stdout, os.Stderr},
	})
	if err != nil {
		say("start-failed %s", oneLine(err.Error()))
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
	killAll := func() {
		signalAll(tree(), syscall.SIGKILL)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			reap()
			if len(tree()) == 0 {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	for mainStatus == nil {
		sig := <-sigs
		switch {
		case sig == keeperDeathSignal || os.Getppid() != *parent:
			// The guard is gone: nobody is left to supervise, so nothing may survive.
			killAll()
			return 1
		case sig == syscall.SIGCHLD:
			reap()
		}
		// SIGTERM/SIGINT/SIGHUP from the guard reached the whole group; vLLM
		// handles them itself and we wait for it to exit.
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
	if rest := tree(); len(rest) > 0 {
		signalAll(rest, syscall.SIGTERM)
		deadline := time.Now().Add(*grace)
		for len(tree()) > 0 && time.Now().Before(deadline) {
			select {
			case sig := <-sigs:
				if sig == keeperDeathSignal || os.Getppid() != *parent {
					killAll()
					return 1
				}
			case <-time.After(20 * time.Millisecond):
			}
			reap()
		}
		killAll()
	}
	reap()
	return 0
}

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
			return "", fmt.Errorf("%s: not an executable file", file)
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
	return "", fmt.Errorf("%q: executable file not found in $PATH", file)
}
