package status

import (
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
)

// LoadProgress is a load phase's progress as vLLM reports it.
type LoadProgress = events.LoadProgress

// Expected is the time to ready expected of the start in progress,
// learned from this host's earlier starts of the same model on the same
// rung (internal/starttimes).
type Expected struct {
	TimeToReady time.Duration `json:"time_to_ready_ns"`
	From        int           `json:"from_starts"` // how many earlier starts it was learned from
	Cold        bool          `json:"cold"`        // from starts that were the first of the model since a boot
	Basis       string        `json:"basis"`       // where it came from, in words: "3 earlier starts of this model on rung 0"
}

// ReadyIn is the time left until the start in progress is expected to be
// ready, at now: never negative (0 once the expected time has passed). ok
// is false when none is expected: not starting, or no earlier start of
// this model on this rung was seen.
func (s Status) ReadyIn(now time.Time) (left time.Duration, ok bool) {
	if s.State != StateStarting || s.Expected == nil || s.StartedAt.IsZero() {
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
