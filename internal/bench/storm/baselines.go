package main

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// The baselines: what operators run vLLM under today, each a small
// re-creation of the tool's documented restart semantics, scaled.

// systemdBaseline is Type=simple, Restart=on-failure, KillMode=control-group.
func (r *run) systemdBaseline(ctx context.Context, cfg systemdConfig) {
	u := systemdUnit{cfg: cfg}
	for {
		if !u.allowStart(time.Now()) {
			r.setTerminal("gave up (start-limit-hit)")
			return
		}
		r.setPhase("activating")
		c, err := r.launch()
		if err != nil {
			r.setTerminal("gave up (" + err.Error() + ")")
			return
		}
		if !waitExit(ctx, c) {
			return
		}
		// KillMode=control-group: once the main process is gone the rest of
		// the cgroup (an orphaned EngineCore) gets SIGTERM, then SIGKILL
		// after TimeoutStopSec.
		r.stopTagged(cfg.TimeoutStop)
		restart, delay := u.onExit(c.code, c.sig)
		if !restart {
			r.setTerminal(fmt.Sprintf("down (%s is success for Restart=on-failure)", c.status()))
			return
		}
		r.setPhase("auto-restart")
		if !sleepCtx(ctx, delay) {
			return
		}
	}
}

// kubeletConfig is the container's liveness probe and the kubelet's backoff.
type kubeletConfig struct {
	initialDelay, period, probeTimeout, grace time.Duration
	threshold                                 int
	backoffInitial, backoffMax                time.Duration
}

// kubeletBaseline is a Deployment's container (restartPolicy Always) with
// an HTTP liveness probe on /health.
func (r *run) kubeletBaseline(ctx context.Context, cfg kubeletConfig) {
	b := crashLoopBackOff{initial: cfg.backoffInitial, max: cfg.backoffMax}
	for {
		r.setPhase("Running")
		c, err := r.launch()
		if err != nil {
			r.setTerminal("gave up (" + err.Error() + ")")
			return
		}
		if !r.runContainer(ctx, c, cfg) {
			return
		}
		// The container's PID 1 is gone: the runtime tears down its PID
		// namespace, which SIGKILLs everything left in it.
		killAll(r.left())
		r.waitGone(5 * time.Second)
		wait := b.onExit(time.Now())
		if wait > 0 {
			r.setPhase("CrashLoopBackOff")
		}
		if !sleepCtx(ctx, wait) {
			return
		}
	}
}

// runContainer probes liveness until the container exits; a liveness
// failure kills it: SIGTERM to PID 1, SIGKILL after the grace period.
func (r *run) runContainer(ctx context.Context, c *child, cfg kubeletConfig) bool {
	probe := livenessProbe{initialDelay: cfg.initialDelay, period: cfg.period, threshold: cfg.threshold}
	tick := time.NewTicker(cfg.period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-c.done:
			return true
		case <-tick.C:
			if !probe.due(time.Since(c.started)) || !probe.observe(r.get("/health", cfg.probeTimeout)) {
				continue
			}
			r.note(func(rec *record) { rec.kills++ })
			_ = syscall.Kill(c.pid, syscall.SIGTERM)
			if !sleepUntilExit(ctx, c, cfg.grace) {
				killAll(r.left())
			}
			return waitExit(ctx, c)
		}
	}
}

// sleepUntilExit waits up to d for the child to exit.
func sleepUntilExit(ctx context.Context, c *child, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// supervisordBaseline is a [program:vllm] section with the defaults: no
// health check, no group kill.
func (r *run) supervisordBaseline(ctx context.Context, p supervisordProgram) {
	for {
		c, err := r.launch()
		if err != nil {
			r.setTerminal("gave up (" + err.Error() + ")")
			return
		}
		p.spawned(c.started)
		r.setPhase("STARTING")
		if !waitExit(ctx, c) {
			return
		}
		code := c.code
		if c.sig != 0 {
			code = -1
		}
		// Only the main pid was ever supervisord's: an orphaned EngineCore
		// is left where it is.
		next := p.exited(time.Now(), code)
		if !next.respawn {
			if next.state == "FATAL" {
				r.setTerminal("gave up (FATAL)")
			} else {
				r.setTerminal(fmt.Sprintf("down (EXITED, %s expected)", c.status()))
			}
			return
		}
		r.setPhase(next.state)
		if !sleepCtx(ctx, next.after) {
			return
		}
	}
}
