package policy

// The proxy's in-flight limit and why, as internal/admission's Policy
// decides it: the value the proxy, status and metrics read. It lives here,
// below the proxy, because the proxy enforces it and internal/admission
// (which decides it) sits above the proxy.

// The bounds of the proxy's in-flight limit, in the words status, metrics
// and the log use for the bound in force.
const (
	BoundRung      = "rung"      // max_num_seqs × inflight_factor
	BoundMemory    = "memory"    // the cost model's predicted peak
	BoundTrend     = "trend"     // the GPU trend predicted critical before the model was confident
	BoundReopening = "reopening" // after an OOM the model did not foresee: growing step by step
	BoundPressure  = "pressure"  // gpu_memory_critical or oom_predicted before the model was confident
)

// AdmissionBound is the proxy's limit and why.
type AdmissionBound struct {
	Limit int `json:"limit"`
	// RoomBytes > 0: the memory bound is in force: the predicted cost of
	// the requests in flight (Model.RequestBytes each) stays within it.
	RoomBytes float64   `json:"memory_room_bytes,omitempty"`
	Bound     string    `json:"bound"`
	Why       string    `json:"why"`
	Model     CostModel `json:"-"`
}

// StillTolerance is how far the requests in flight may move while counting
// as held still (internal/admission's samples; FitAdmission's levels).
func StillTolerance(n int) int { return max(2, n/20) }
