// Package admission decides how many requests the proxy sends vLLM, and
// holds what that decision is made of, in one leaf: the cost model and its
// fits (cost.go: FitAdmission for admission, FitCost for the restart
// policy's computed rungs), the bound step by step (policy.go: Policy.Step
// over Facts; which GPU samples count: SettledSample, InflightSpan,
// KeepSample) and the bound in force (Bound, the Bound* names). Pure: no
// I/O, no clock, no import of the guard's own; the proxy enforces the
// bound, the restart policy reads the fit, and internal/gate wires the
// samples, the alerts and admission.json to it.
package admission

// The proxy's in-flight limit and why, as Policy decides it: the value the
// proxy, status and metrics read.

// The bounds of the proxy's in-flight limit, in the words status, metrics
// and the log use for the bound in force.
const (
	BoundRung      = "rung"      // max_num_seqs × inflight_factor
	BoundMemory    = "memory"    // the cost model's predicted peak
	BoundTrend     = "trend"     // the GPU trend predicted critical before the model was confident
	BoundReopening = "reopening" // after an OOM the model did not foresee: growing step by step
	BoundPressure  = "pressure"  // gpu_memory_critical or oom_predicted before the model was confident
)

// Bound is the proxy's limit and why.
type Bound struct {
	Limit int `json:"limit"`
	// RoomBytes > 0: the memory bound is in force: the predicted cost of
	// the requests in flight (Model.RequestBytes each) stays within it.
	RoomBytes float64   `json:"memory_room_bytes,omitempty"`
	Bound     string    `json:"bound"`
	Why       string    `json:"why"`
	Model     CostModel `json:"-"`
}

// StillTolerance is how far the requests in flight may move while counting
// as held still (SettledSample; FitAdmission's levels).
func StillTolerance(n int) int { return max(2, n/20) }
