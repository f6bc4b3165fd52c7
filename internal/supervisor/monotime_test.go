package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// hasMonotonic says whether t carries a monotonic clock reading: time.Time's
// String ends in "m=±<seconds>" exactly when it does.
func hasMonotonic(v any) bool { return strings.Contains(fmt.Sprint(v), " m=") }

// The loop's last turn (WATCHDOG=1, /livez) and the last output line (the
// stall check while vLLM loads) are kept on the monotonic clock (issue 24
// item 8). Kept as wall-clock nanoseconds, a step of the system clock (NTP,
// `date -s`) made a turning loop look wedged and a loading vLLM stalled.
// The stored values are checked, not a stepped clock: a test cannot step
// the machine's clock, and time.Since on a value that carries the reading
// ignores the wall clock by the time package's contract.
func TestLastTurnAndLastLineAreMonotonic(t *testing.T) {
	var s Supervisor
	s.beat()
	if lt := s.LastTurn(); !hasMonotonic(lt) {
		t.Errorf("LastTurn() = %v has no monotonic reading: time.Since on it follows wall-clock steps", lt)
	}

	o := newTestOutput(t)
	fmt.Fprint(o.writer("stderr"), "Loading safetensors checkpoint shards:   0% Completed\n")
	if ll := o.lastLine.Load(); !hasMonotonic(ll) {
		t.Errorf("the last line's time %v has no monotonic reading: the stall check follows wall-clock steps", ll)
	}
}

func TestMonoTimeKeepsTheInstant(t *testing.T) {
	var m monoTime
	now := time.Now()
	m.Store(now)
	if got := m.Load(); !got.Equal(now) || got.Sub(now) != 0 || !hasMonotonic(got) {
		t.Fatalf("Load() = %v after Store(%v)", got, now)
	}
	later := now.Add(90 * time.Second)
	m.Store(later)
	if d := m.Load().Sub(now); d != 90*time.Second {
		t.Fatalf("Load() is %s after the first instant, want 1m30s", d)
	}
}
