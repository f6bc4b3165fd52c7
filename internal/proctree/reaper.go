package proctree

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The reaper matters when the guard is PID 1 (a container entrypoint) or
// runs with --init: orphans anywhere below are re-parented to the guard and
// must be reaped, or they stay zombies. A bare wait4(-1) would steal the exit
// status that exec.Cmd.Wait is waiting for, so children started through
// reaperStart are registered, and the reaper waits only for the others, by PID.

var reaper struct {
	mu    sync.Mutex
	owned map[int]bool
}

// reaperStart starts cmd with its PID registered before the reaper can see it.
func reaperStart(cmd *exec.Cmd) error {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	if reaper.owned == nil {
		reaper.owned = map[int]bool{}
	}
	reaper.owned[cmd.Process.Pid] = true
	return nil
}

// reaperForget drops pid once exec.Cmd.Wait has reaped it.
func reaperForget(pid int) {
	reaper.mu.Lock()
	delete(reaper.owned, pid)
	reaper.mu.Unlock()
}

// StartCommand starts cmd so that the reaper never takes its exit status.
// Every child the guard starts (alert commands included) goes through here.
func StartCommand(cmd *exec.Cmd) error { return reaperStart(cmd) }

// ForgetCommand is called after cmd.Wait returned.
func ForgetCommand(cmd *exec.Cmd) {
	if cmd.Process != nil {
		reaperForget(cmd.Process.Pid)
	}
}

// BecomeSubreaper makes the guard the reaper of orphans below it and reaps
// them until ctx ends. It returns at once if the kernel refuses.
func BecomeSubreaper(ctx context.Context) error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		defer signal.Stop(sigs)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sigs:
				reapOrphans()
			}
		}
	}()
	reapOrphans()
	return nil
}

// reapOrphans waits for every zombie child of the guard that exec.Cmd does
// not own.
func reapOrphans() {
	self := os.Getpid()
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	for _, p := range allProcs() {
		if p.ppid != self || p.state != 'Z' || reaper.owned[p.pid] {
			continue
		}
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
	}
}
