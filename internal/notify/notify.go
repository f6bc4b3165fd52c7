// Package notify owns the guard's conversation with systemd (sd_notify):
// READY=1 the first time vLLM is ready, STATUS= lines, EXTEND_TIMEOUT_USEC=
// while a slow load makes progress, STOPPING=1, and WATCHDOG=1 pings that are
// sent only while the supervisor's own loop is seen turning, so that a wedged
// guard is caught and restarted by systemd. Without NOTIFY_SOCKET (not under
// systemd, or Type= is not notify) every method does nothing.
package notify

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
)

// ExtendEvery is the least time between two EXTEND_TIMEOUT_USEC datagrams:
// vLLM can print hundreds of progress lines a second while capturing graphs.
const ExtendEvery = time.Second

// Notifier sends sd_notify datagrams. Its methods are safe from any goroutine
// and never block for long (one datagram on a local socket).
type Notifier struct {
	log     *zap.Logger
	enabled bool
	now     func() time.Time // the clock of Extend's rate limit; tests replace it

	mu           sync.Mutex
	ready        bool
	lastExtend   time.Time
	lastProgress time.Time // the last STATUS= of a load's step (load.go)
	failing      bool      // a send failed and was logged; logged again only after a success
}

// New reads NOTIFY_SOCKET once; without it the Notifier is a no-op.
func New(log *zap.Logger) *Notifier {
	if log == nil {
		log = zap.NewNop()
	}
	return &Notifier{log: log, enabled: os.Getenv("NOTIFY_SOCKET") != "", now: time.Now}
}

// Enabled reports whether the guard runs under a service manager that
// listens (NOTIFY_SOCKET set).
func (n *Notifier) Enabled() bool { return n.enabled }

// Ready sends READY=1 once; later calls do nothing, because systemd reads
// READY=1 as "startup finished" and a restart of vLLM is not a restart of
// the service.
func (n *Notifier) Ready() {
	n.mu.Lock()
	first := !n.ready
	n.ready = true
	n.mu.Unlock()
	if first {
		n.send(daemon.SdNotifyReady)
	}
}

// Status sends STATUS=line (shown by systemctl status); line breaks are
// turned into spaces since systemd shows one line.
func (n *Notifier) Status(line string) {
	n.send("STATUS=" + oneLine(line))
}

// Extend asks systemd to wait d more (from now) before its start timeout
// kills the service: call it on load progress while vLLM starts. Calls
// closer than ExtendEvery to the last sent one are dropped. Pass more than
// the guard's own stall_timeout, so the guard's hang detection acts first.
func (n *Notifier) Extend(d time.Duration) {
	if d <= 0 {
		return
	}
	n.mu.Lock()
	now := n.now()
	if !n.lastExtend.IsZero() && now.Sub(n.lastExtend) < ExtendEvery {
		n.mu.Unlock()
		return
	}
	n.lastExtend = now
	n.mu.Unlock()
	n.send(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", d.Microseconds()))
}

// Stopping sends STOPPING=1: the guard is shutting down on request.
func (n *Notifier) Stopping() {
	n.send(daemon.SdNotifyStopping)
}

// RunWatchdog pings systemd's watchdog until ctx ends, when WatchdogSec= is
// set for this process (WATCHDOG_USEC, and WATCHDOG_PID naming it). Every
// WATCHDOG_USEC/2 it sends WATCHDOG=1 only if lastTurn (when the
// supervisor's loop last turned; it turns at least once a second) is less
// than WATCHDOG_USEC/2 old. A loop stuck longer gets no pings, so systemd
// kills and restarts the guard: a ticker of its own would keep a wedged
// guard alive forever.
func (n *Notifier) RunWatchdog(ctx context.Context, lastTurn func() time.Time) {
	if !n.enabled {
		return
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.Warn("systemd watchdog settings unreadable; not sending WATCHDOG=1 (check WatchdogSec= in the unit)", zap.Error(err))
		return
	}
	if interval <= 0 {
		return
	}
	period := interval / 2
	if period < 2*time.Second {
		n.log.Warn("WatchdogSec is short for the guard: its loop proves itself once a second, so a WatchdogSec under 4s may kill a healthy guard",
			zap.Duration("watchdog", interval))
	}
	n.log.Info("systemd watchdog on", zap.Duration("watchdog", interval), zap.Duration("ping_every", period))
	wedged := false
	check := func() {
		age := time.Since(lastTurn())
		if age < period {
			if wedged {
				wedged = false
				n.log.Info("supervisor loop turning again; WATCHDOG=1 resumed", zap.Duration("stalled", age))
			}
			n.send(daemon.SdNotifyWatchdog)
			return
		}
		if !wedged {
			wedged = true
			n.log.Error("supervisor loop wedged: withholding WATCHDOG=1 so systemd restarts the guard",
				zap.Duration("last_turn_ago", age.Round(time.Millisecond)), zap.Duration("watchdog", interval))
		}
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	check()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			check()
		}
	}
}

func (n *Notifier) send(state string) {
	if !n.enabled {
		return
	}
	_, err := daemon.SdNotify(false, state)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		if !n.failing {
			n.failing = true
			n.log.Warn("sd_notify failed; systemd may not see the guard's state (is NOTIFY_SOCKET right, NotifyAccess=main?)",
				zap.String("socket", os.Getenv("NOTIFY_SOCKET")), zap.String("message", firstWord(state)), zap.Error(err))
		}
		return
	}
	if n.failing {
		n.failing = false
		n.log.Info("sd_notify works again")
	}
}

func firstWord(state string) string {
	k, _, _ := strings.Cut(state, "=")
	return k
}

// oneLine replaces control characters (line breaks above all) with spaces.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
