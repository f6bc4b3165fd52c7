// Package status holds the supervisor's state as every reader sees it (the
// control API, metrics, systemd, alerts, the proxy's gate, the drill): a
// leaf of shared types, so that no reader imports the supervisor for them.
package status

import (
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// State is one of the supervisor's public states (docs/design.md).
type State string

const (
	StateStarting   State = "starting"
	StateReady      State = "ready"
	StateStopping   State = "stopping"
	StateWaitingGPU State = "waiting_gpu"
	StateBackoff    State = "backoff"
	StateFailed     State = "failed"
	StateStopped    State = "stopped"
)

// States lists every state (metrics create one series each).
var States = []State{StateStarting, StateReady, StateStopping, StateWaitingGPU, StateBackoff, StateFailed, StateStopped}

// Status is the supervisor's state as readers see it: a copy, never shared.
type Status struct {
	State       State               `json:"state"`
	Since       time.Time           `json:"since"`
	Reason      string              `json:"reason"`
	PID         int                 `json:"pid,omitempty"`
	StartedAt   time.Time           `json:"started_at,omitzero"`
	ReadySince  time.Time           `json:"ready_since,omitzero"`
	Phase       string              `json:"phase,omitempty"`      // load phase while starting
	LastProbe   string              `json:"last_probe,omitempty"` // why the last readiness probe failed
	Probe       string              `json:"probe,omitempty"`      // the readiness probe in use, as it last answered
	Rung        policy.Rung         `json:"rung"`
	Starts      int                 `json:"starts"`
	Restarts    map[cause.Cause]int `json:"restarts_by_cause"`
	TimeToReady time.Duration       `json:"last_time_to_ready_ns,omitempty"`
	// LongestTimeToReady: the longest time to ready seen in this
	// state_dir, kept across restarts of the guard (the proxy's hold).
	LongestTimeToReady time.Duration `json:"longest_time_to_ready_ns,omitempty"`
	NextStartAt        time.Time     `json:"next_start_at,omitzero"`
	LastFailure        *Failure      `json:"last_failure,omitempty"`
	ExitCode           int           `json:"exit_code,omitempty"` // when failed or stopped
	LogDropped         uint64        `json:"log_lines_dropped"`
	Cost               string        `json:"cost_model,omitempty"` // what a running sequence costs, and the safe max_num_seqs
	// While starting: the load phase's progress where vLLM reports one,
	// and the time to ready expected from earlier starts (load.go).
	Progress *LoadProgress `json:"load_progress,omitempty"`
	Expected *Expected     `json:"expected_time_to_ready,omitempty"`
}

// Failure is one death of vLLM with its cause and what the guard did about
// it; it travels on the event stream.
type Failure = events.Failure

// Clone is a copy of s that shares nothing with it.
func (s Status) Clone() Status {
	m := make(map[cause.Cause]int, len(s.Restarts))
	for k, v := range s.Restarts {
		m[k] = v
	}
	s.Restarts = m
	return s
}

// StopRequested begins a stopping status's reason when the stop is the
// guard's own: vLLM is not restarted after it.
const StopRequested = "stop requested"

// FinalStop reports whether a stopping status's reason is the guard's own
// stop (vLLM is not coming back), not a restart, a restore or a death.
func FinalStop(reason string) bool { return strings.HasPrefix(reason, StopRequested) }
