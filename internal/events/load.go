package events

import "fmt"

// LoadProgress is a load phase's progress as vLLM reports it (its
// progress bars: the weights' shards, the CUDA graphs captured); it
// travels on progress events and in the status.
type LoadProgress struct {
	Phase   string `json:"phase"` // the load phase it belongs to: weights, graphs
	Unit    string `json:"unit"`  // what it counts: shards, tensors, graphs
	Done    int    `json:"done"`
	Total   int    `json:"total"`
	Percent int    `json:"percent"` // as vLLM printed it (rounded)
}

// Ratio is done/total, 0..1.
func (p LoadProgress) Ratio() float64 {
	if p.Total <= 0 {
		return 0
	}
	return float64(p.Done) / float64(p.Total)
}

// String is the progress in the operator's words: "2/3 shards (67%)".
func (p LoadProgress) String() string {
	return fmt.Sprintf("%d/%d %s (%d%%)", p.Done, p.Total, p.Unit, p.Percent)
}
