package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The end-to-end tests build the real binaries into a temporary folder.
func TestMain(m *testing.M) { testkit.MainWithCleanup(m, testbin.Cleanup) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func defaultSystemd() systemdConfig {
	return systemdConfig{RestartSec: 100 * time.Millisecond, StartLimitInterval: 10 * time.Second, StartLimitBurst: 5, TimeoutStop: 90 * time.Second}
}

// A unit that fails at once: five starts inside 10 s, the sixth is refused.
func TestSystemdStartLimitHitsAfterFiveStartsInTenSeconds(t *testing.T) {
	u := systemdUnit{cfg: defaultSystemd()}
	now := t0
	for i := 1; i <= 5; i++ {
		if !u.allowStart(now) {
			t.Fatalf("start %d refused, want allowed", i)
		}
		restart, delay := u.onExit(2, 0)
		if !restart || delay != 100*time.Millisecond {
			t.Fatalf("after start %d: restart=%v delay=%s, want a restart after 100ms", i, restart, delay)
		}
		now = now.Add(delay + 50*time.Millisecond)
	}
	if u.allowStart(now) {
		t.Fatal("sixth start within 10 s allowed, want start-limit-hit")
	}
}

// Starts spaced wider than the window never hit the limit: the window is
// fixed and opens again at the first start after it expired.
func TestSystemdStartLimitWindowResets(t *testing.T) {
	u := systemdUnit{cfg: defaultSystemd()}
	for i := range 20 {
		if !u.allowStart(t0.Add(time.Duration(i) * 3 * time.Second)) {
			t.Fatalf("start %d (every 3 s) refused", i+1)
		}
	}
	u = systemdUnit{cfg: defaultSystemd()}
	for i := range 5 {
		u.allowStart(t0.Add(time.Duration(i) * time.Second))
	}
	if u.allowStart(t0.Add(9 * time.Second)) {
		t.Fatal("6th start at 9 s allowed")
	}
	if !u.allowStart(t0.Add(10*time.Second + time.Millisecond)) {
		t.Fatal("start after the window refused")
	}
}

// Restart=on-failure: exit 0 and the clean signals are success, no restart.
func TestSystemdOnFailureTreatsExitZeroAsSuccess(t *testing.T) {
	cases := []struct {
		code    int
		sig     syscall.Signal
		restart bool
	}{
		{0, 0, false}, {1, 0, true}, {2, 0, true},
		{-1, syscall.SIGTERM, false}, {-1, syscall.SIGKILL, true}, {-1, syscall.SIGSEGV, true}, {-1, syscall.SIGPIPE, false},
	}
	for _, c := range cases {
		u := systemdUnit{cfg: defaultSystemd()}
		if got, _ := u.onExit(c.code, c.sig); got != c.restart {
			t.Errorf("exit code=%d signal=%v: restart=%v, want %v", c.code, c.sig, got, c.restart)
		}
	}
}

// RestartSteps=4, RestartSec=100ms, RestartMaxDelaySec=1.6s: 100, 200, 400, 800 ms, then the maximum.
func TestSystemdRestartStepsGrowGeometrically(t *testing.T) {
	cfg := defaultSystemd()
	cfg.RestartSteps, cfg.RestartMaxDelay = 4, 1600*time.Millisecond
	u := systemdUnit{cfg: cfg}
	for i, want := range []time.Duration{100, 200, 400, 800, 1600, 1600} {
		_, got := u.onExit(1, 0)
		if d := got - want*time.Millisecond; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("restart %d: delay %s, want %dms", i+1, got, want)
		}
	}
}

// CrashLoopBackOff: first restart immediate, then 10 s doubling to 300 s.
func TestCrashLoopBackOffDoublesToTheMaximum(t *testing.T) {
	b := crashLoopBackOff{initial: 10 * time.Second, max: 300 * time.Second}
	now := t0
	for i, want := range []time.Duration{0, 10, 20, 40, 80, 160, 300, 300} {
		got := b.onExit(now)
		if got != want*time.Second {
			t.Fatalf("exit %d: wait %s, want %ds", i+1, got, want)
		}
		now = now.Add(got + 30*time.Second) // restarted, ran 30 s, died again
	}
}

// Ten minutes (2 × 300 s) after the last restart the backoff starts over.
func TestCrashLoopBackOffResetsAfterTenMinutesRunning(t *testing.T) {
	b := crashLoopBackOff{initial: 10 * time.Second, max: 300 * time.Second}
	now := t0
	for range 5 {
		now = now.Add(b.onExit(now) + time.Second)
	}
	if got := b.onExit(now.Add(9 * time.Minute)); got != 160*time.Second {
		t.Fatalf("after 9 min running: wait %s, want 160s (no reset yet)", got)
	}
	last := now.Add(9*time.Minute + 160*time.Second)
	if got := b.onExit(last.Add(10*time.Minute + time.Second)); got != 0 {
		t.Fatalf("after 10 min running: wait %s, want 0 (reset)", got)
	}
	if got := b.onExit(last.Add(11 * time.Minute)); got != 10*time.Second {
		t.Fatalf("next exit after the reset: wait %s, want 10s", got)
	}
}

// initialDelaySeconds 120, period 10, failureThreshold 3 over a load that
// never answers: probes at 120, 130, 140 s, kill at 140 s.
func TestLivenessKillsAfterThreeFailuresPastTheInitialDelay(t *testing.T) {
	p := livenessProbe{initialDelay: 120 * time.Second, period: 10 * time.Second, threshold: 3}
	var killedAt time.Duration
	for at := p.period; at <= 200*time.Second; at += p.period {
		if !p.due(at) {
			continue
		}
		if p.observe(false) {
			killedAt = at
			break
		}
	}
	if killedAt != 140*time.Second {
		t.Fatalf("killed at %s, want 140s", killedAt)
	}
	p = livenessProbe{threshold: 3}
	p.observe(false)
	p.observe(false)
	if p.observe(true) || p.observe(false) || p.observe(false) {
		t.Fatal("a success must reset the failure count")
	}
}

// Exits within startsecs: retries after 1, 2, 3 s, then FATAL: 4 starts.
func TestSupervisordFatalAfterStartRetries(t *testing.T) {
	p := supervisordProgram{startsecs: time.Second, startretries: 3, exitcodes: []int{0}, second: time.Second}
	now, starts := t0, 0
	for {
		p.spawned(now)
		starts++
		n := p.exited(now.Add(200*time.Millisecond), 2)
		if !n.respawn {
			if n.state != "FATAL" {
				t.Fatalf("state %s, want FATAL", n.state)
			}
			break
		}
		if want := time.Duration(starts) * time.Second; n.after != want || n.state != "BACKOFF" {
			t.Fatalf("after start %d: %+v, want BACKOFF and a retry after %s", starts, n, want)
		}
		now = now.Add(200*time.Millisecond + n.after)
	}
	if starts != 4 {
		t.Fatalf("%d starts, want 4 (1 + startretries)", starts)
	}
}

// After RUNNING: exit 0 is expected (EXITED, no restart); any other code,
// or a signal, respawns at once, forever; and the BACKOFF count restarts.
func TestSupervisordRespawnsAtOnceAfterRunning(t *testing.T) {
	p := supervisordProgram{startsecs: time.Second, startretries: 3, exitcodes: []int{0}, second: time.Second}
	p.spawned(t0)
	if n := p.exited(t0.Add(500*time.Millisecond), 1); n.state != "BACKOFF" {
		t.Fatalf("quick exit: %+v", n)
	}
	now := t0.Add(2 * time.Second)
	for i := range 10 {
		p.spawned(now)
		now = now.Add(5 * time.Second)
		n := p.exited(now, 1)
		if !n.respawn || n.after != 0 || n.state != "EXITED" {
			t.Fatalf("exit %d after RUNNING: %+v, want an immediate respawn", i+1, n)
		}
	}
	p.spawned(now)
	if n := p.exited(now.Add(5*time.Second), -1); !n.respawn {
		t.Fatal("death by signal after RUNNING must respawn")
	}
	p.spawned(now)
	if n := p.exited(now.Add(5*time.Second), 0); n.respawn || n.state != "EXITED" {
		t.Fatalf("exit 0 after RUNNING: %+v, want EXITED without a respawn", n)
	}
}
