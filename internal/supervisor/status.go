package supervisor

import "github.com/vllm-guard/vllm-guard/internal/status"

// The supervisor's public state lives in the leaf package status, which its
// readers import; these names keep the supervisor's own code short.
type (
	State   = status.State
	Status  = status.Status
	Failure = status.Failure
)

const (
	StateStarting   = status.StateStarting
	StateReady      = status.StateReady
	StateStopping   = status.StateStopping
	StateWaitingGPU = status.StateWaitingGPU
	StateBackoff    = status.StateBackoff
	StateFailed     = status.StateFailed
	StateStopped    = status.StateStopped
)
