package status

import (
	"fmt"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
)

// LoadProgress is a load phase's progress as vLLM reports it.
type LoadProgress = events.LoadProgress

// Expected is the time to ready expected of the start in progress,
// learned from this host's earlier starts of the same model on the same
// rung (internal/starttimes), set at its launch. From 0: unknown, no such
// start was seen yet.
type Expected struct {
	TimeToReady time.Duration `json:"time_to_ready_ns"`
	From        int           `json:"from_starts"` // how many earlier starts it was learned from (0: unknown)
	Cold        bool          `json:"cold"`        // from starts that were the first of the model since a boot
	Basis       string        `json:"basis"`       // in words: "3 earlier starts of this model on rung 0", "unknown: no earlier start of this model on rung 0 seen"
}

// ReadyIn is the time left until the start in progress is expected to be
// ready, at now: never negative (0 once the expected time has passed). ok
// is false when none is expected: not starting, not launched yet, or no
// earlier start of this model on this rung was seen.
func (s Status) ReadyIn(now time.Time) (left time.Duration, ok bool) {
	if s.State != StateStarting || s.Expected == nil || s.Expected.From <= 0 || s.StartedAt.IsZero() {
		return 0, false
	}
	return starttimes.Remaining(s.Expected.TimeToReady, now.Sub(s.StartedAt)), true
}

// LoadingProgress is the load phase's progress while starting, where vLLM
// reports one.
func (s Status) LoadingProgress() (LoadProgress, bool) {
	if s.State != StateStarting || s.Progress == nil {
		return LoadProgress{}, false
	}
	return *s.Progress, true
}

// ReadyInText says when the start in progress is expected to be ready, at
// now, for people: "ready in ~41 s (from 3 earlier starts of this model on
// rung 0)"; "ready time unknown (no earlier start ...)" before a start of
// the model on the rung was seen. "" when not starting, or before the
// launch (nothing is expected yet).
func (s Status) ReadyInText(now time.Time) string {
	if s.State != StateStarting || s.Expected == nil {
		return ""
	}
	left, ok := s.ReadyIn(now)
	switch {
	case !ok:
		return "ready time unknown (" + strings.TrimPrefix(s.Expected.Basis, "unknown: ") + ")"
	case left == 0:
		return fmt.Sprintf("taking longer than expected (usually ~%s, from %s)", Approx(s.Expected.TimeToReady), s.Expected.Basis)
	}
	return fmt.Sprintf("ready in ~%s (from %s)", Approx(left), s.Expected.Basis)
}

// Approx is a duration as a person reads an estimate: "41 s", "3 min
// 20 s", "1 h 5 min".
func Approx(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	switch {
	case s < 100:
		return fmt.Sprintf("%d s", s)
	case s < 3600:
		if s%60 == 0 || s >= 600 {
			return fmt.Sprintf("%d min", (s+30)/60)
		}
		return fmt.Sprintf("%d min %d s", s/60, s%60)
	default:
		return fmt.Sprintf("%d h %d min", s/3600, s%3600/60)
	}
}
