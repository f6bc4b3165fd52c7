package heart

import "github.com/vllm-guard/vllm-guard/internal/status"

// The public state the machine shows lives in the leaf package status.
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
