package supervisor

import (
	"sync/atomic"
	"time"
)

// processStart anchors monoTime: a time.Time from time.Now() carries the
// monotonic clock, and so does every time derived from it with Add.
var processStart = time.Now()

// monoTime is an instant shared between goroutines without a lock, kept as
// monotonic nanoseconds since processStart. Wall-clock nanoseconds
// (UnixNano) would make every duration taken from it jump with the system
// clock: a step back by an NTP correction or an operator's `date -s` would
// withhold WATCHDOG=1, call a loading vLLM stalled, or mark /livez wedged.
type monoTime struct{ ns atomic.Int64 }

func (m *monoTime) Store(t time.Time) { m.ns.Store(int64(t.Sub(processStart))) }

// Load returns the instant with its monotonic reading: time.Since and Sub
// against another time.Now() use the monotonic clock only.
func (m *monoTime) Load() time.Time { return processStart.Add(time.Duration(m.ns.Load())) }
