package policy

import "fmt"

// The bounds of the proxy's in-flight limit, in the words status, metrics
// and the log use for the bound in force.
const (
	BoundRung      = "rung"      // max_num_seqs × inflight_factor
	BoundMemory    = "memory"    // the cost model's predicted peak
	BoundTrend     = "trend"     // the GPU trend predicted critical before the model was confident
	BoundReopening = "reopening" // after an OOM the model did not foresee: growing step by step
	BoundPressure  = "pressure"  // gpu_memory_critical or oom_predicted: halved
)

// AdmissionFacts are what one admission step looks at.
type AdmissionFacts struct {
	Rung             Rung
	InflightFactor   float64
	Headroom         float64 // [profile] headroom
	CriticalFraction float64 // [gpu] critical_fraction
	Pressure         bool    // gpu_memory_critical or oom_predicted in force
	Model            CostModel
	Inflight         int     // requests in flight now
	MeanTokens       float64 // prompt tokens of a typical recent request
	// SecondsToCritical is the GPU trend's (< 0 when not climbing);
	// Horizon the short horizon within which it steps admission down.
	SecondsToCritical, Horizon float64
	// Tick: this step follows a GPU sample (the trend and the reopening
	// move only then; other steps follow a change of rung or alerts).
	Tick bool
}

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

// Admission decides the proxy's limit one step at a time (each GPU sample
// and each change of rung or alerts). It is not safe for concurrent use.
//
// With a confident cost model the limit is the smaller of the rung's and the
// largest concurrency whose predicted peak stays under the memory ceiling.
// Before that, the rung's, halved under pressure, with two guards: when the
// trend predicts critical within the horizon, the limit steps down to 7/8 of
// what is in flight; after an OOM the model did not foresee, the limit starts
// at 1/16 of the rung's. From either it reopens by an eighth (at least 2) per
// step while the requests use it, so that concurrency never rises faster than
// the samples can follow and the model learns on the way.
type Admission struct {
	reopen int // > 0: the reopening limit in force
	kind   string
}

// OnOOM records that vLLM ran out of memory.
func (a *Admission) OnOOM(f AdmissionFacts) {
	if f.Model.Confident {
		return // the next samples correct the model; the memory bound stays
	}
	a.reopen, a.kind = max(rungLimit(f)/16, 2), BoundReopening
}

func rungLimit(f AdmissionFacts) int {
	return max(int(float64(f.Rung.MaxNumSeqs)*max(f.InflightFactor, 0)), 1)
}

// Ceiling is the memory fraction admission keeps the predicted peak under:
// 1 − headroom, or halfway between the utilization and critical_fraction
// when the headroom leaves no room above vLLM's own budget.
func (f AdmissionFacts) Ceiling() float64 {
	c := 1 - f.Headroom
	if c <= f.Rung.GPUMemoryUtilization {
		c = (f.Rung.GPUMemoryUtilization + max(f.CriticalFraction, f.Rung.GPUMemoryUtilization)) / 2
	}
	return c
}

// Step returns the bound in force now.
func (a *Admission) Step(f AdmissionFacts) AdmissionBound {
	rl := rungLimit(f)
	b := AdmissionBound{Limit: rl, Bound: BoundRung, Model: f.Model,
		Why: fmt.Sprintf("max_num_seqs %d × inflight_factor %g", f.Rung.MaxNumSeqs, f.InflightFactor)}
	m := f.Model
	if m.Confident {
		a.reopen = 0
		ceil := f.Ceiling()
		room := m.RoomBytes(f.Rung.GPUMemoryUtilization, 1-ceil)
		per := m.RequestBytes(f.MeanTokens)
		b.RoomBytes = max(room, 1) // a model that leaves no room admits nothing but is still a bound
		if n := int(room / per); per > 0 && n < rl {
			b.Limit, b.Bound = max(n, 1), BoundMemory
			b.Why = fmt.Sprintf("predicted peak under %.1f %% of the device: %d requests of %.0f prompt tokens (≈ %.0f MiB each over %.1f GiB of room)",
				ceil*100, n, f.MeanTokens, per/(1<<20), room/(1<<30))
		}
	} else {
		climbing := f.Tick && f.SecondsToCritical >= 0 && f.SecondsToCritical <= f.Horizon
		switch {
		case climbing && (a.reopen == 0 || f.Inflight*7/8 < a.reopen):
			a.reopen, a.kind = max(f.Inflight*7/8, 1), BoundTrend
		case climbing:
			// Already stepped down below what is in flight: hold.
		case f.Tick && a.reopen > 0 && f.Inflight >= a.reopen-1:
			a.reopen += max(a.reopen/8, 2)
		}
		if a.reopen >= rl {
			a.reopen = 0
		}
		if a.reopen > 0 {
			b.Limit, b.Bound = a.reopen, a.kind
			if a.kind == BoundTrend {
				b.Why = fmt.Sprintf("memory predicted to reach critical within %.0f s before the cost model is confident (%s): stepped down, reopening step by step", f.Horizon, m.Why)
			} else {
				b.Why = fmt.Sprintf("vLLM ran out of memory before the cost model was confident (%s): reopening step by step", m.Why)
			}
		}
	}
	if f.Pressure && b.Limit > 1 && b.RoomBytes == 0 {
		b.Limit, b.Bound = max(b.Limit/2, 1), BoundPressure
		b.Why = "halved while gpu_memory_critical or oom_predicted is active (" + b.Why + ")"
	}
	return b
}
