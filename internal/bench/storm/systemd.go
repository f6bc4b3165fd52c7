package main

import (
	"math"
	"syscall"
	"time"
)

// systemdConfig is the part of a unit file that decides restarts, in
// scenario time. Defaults as systemd documents them (systemd.service(5),
// systemd.unit(5), systemd.kill(5)).
type systemdConfig struct {
	RestartSec         time.Duration // RestartSec=, default 100ms
	RestartSteps       int           // RestartSteps=, 0 = off (default)
	RestartMaxDelay    time.Duration // RestartMaxDelaySec=, 0 = unset (default infinity)
	StartLimitInterval time.Duration // StartLimitIntervalSec=, default 10s
	StartLimitBurst    int           // StartLimitBurst=, default 5
	TimeoutStop        time.Duration // TimeoutStopSec=, default 90s: SIGTERM then SIGKILL
}

// systemdUnit is a Type=simple, Restart=on-failure, KillMode=control-group
// service: its restart decisions, nothing else. It never sleeps or reads
// the clock; the driver passes the time in.
type systemdUnit struct {
	cfg       systemdConfig
	rlBegin   time.Time // start of the current start-limit window
	rlNum     int       // starts counted in that window
	nRestarts int       // automatic restarts since the operator's start
}

// allowStart is systemd's ratelimit_below() on the unit's start limit: a
// fixed window that opens at the first start after the previous one
// expired; more than StartLimitBurst starts inside it are refused and the
// unit fails with result "start-limit-hit".
func (u *systemdUnit) allowStart(now time.Time) bool {
	if u.cfg.StartLimitInterval <= 0 || u.cfg.StartLimitBurst <= 0 {
		return true
	}
	if u.rlBegin.IsZero() || now.Sub(u.rlBegin) > u.cfg.StartLimitInterval {
		u.rlBegin, u.rlNum = now, 1
		return true
	}
	u.rlNum++
	return u.rlNum <= u.cfg.StartLimitBurst
}

// cleanExit is Restart=on-failure's notion of success: exit code 0, or
// one of the clean signals SIGHUP, SIGINT, SIGTERM, SIGPIPE. vLLM exits 0
// after its engine dies at runtime, so that death counts as clean.
func cleanExit(code int, sig syscall.Signal) bool {
	if sig != 0 {
		switch sig {
		case syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE:
			return true
		}
		return false
	}
	return code == 0
}

// onExit decides after the main process exited: restart or not, and after
// how long (service_restart_usec_next: RestartSec growing geometrically to
// RestartMaxDelaySec over RestartSteps restarts).
func (u *systemdUnit) onExit(code int, sig syscall.Signal) (restart bool, delay time.Duration) {
	if cleanExit(code, sig) {
		return false, 0
	}
	next := u.nRestarts + 1
	u.nRestarts = next
	c := u.cfg
	if next <= 1 || c.RestartSteps == 0 || c.RestartSec == 0 || c.RestartMaxDelay <= c.RestartSec {
		return true, c.RestartSec
	}
	if next > c.RestartSteps {
		return true, c.RestartMaxDelay
	}
	ratio := float64(c.RestartMaxDelay) / float64(c.RestartSec)
	return true, time.Duration(float64(c.RestartSec) * math.Pow(ratio, float64(next-1)/float64(c.RestartSteps)))
}
