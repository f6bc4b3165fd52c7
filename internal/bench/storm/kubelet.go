package main

import "time"

// crashLoopBackOff is the kubelet's per-container restart backoff
// (k8s.io/client-go/util/flowcontrol.Backoff as the kubelet uses it):
// the first restart is immediate, each later one waits the current
// backoff, which starts at 10 s and doubles up to 300 s; an entry not
// updated for twice the maximum (10 minutes of running) starts over.
type crashLoopBackOff struct {
	initial, max time.Duration
	backoff      time.Duration
	lastUpdate   time.Time // the last restart
	has          bool
}

// onExit returns how long after a container finished the kubelet starts it
// again, and records that restart.
func (b *crashLoopBackOff) onExit(finished time.Time) time.Duration {
	expired := !b.has || finished.Sub(b.lastUpdate) > 2*b.max
	var wait time.Duration
	if !expired {
		wait = b.backoff // IsInBackOffSince: CrashLoopBackOff until finished+backoff
	}
	if expired {
		b.backoff = b.initial
	} else {
		b.backoff = min(2*b.backoff, b.max)
	}
	b.has, b.lastUpdate = true, finished.Add(wait)
	return wait
}

// livenessProbe is one container's liveness prober: the worker ticks every
// period from the container's start, skips ticks before initialDelay, and
// kills the container after failureThreshold consecutive failures.
type livenessProbe struct {
	initialDelay, period time.Duration
	threshold            int
	fails                int
}

// due reports whether the tick at sinceStart probes (not within the initial delay).
func (p *livenessProbe) due(sinceStart time.Duration) bool { return sinceStart >= p.initialDelay }

// observe records one probe result and reports whether the container must be killed.
func (p *livenessProbe) observe(ok bool) (kill bool) {
	if ok {
		p.fails = 0
		return false
	}
	p.fails++
	return p.fails >= p.threshold
}
