package control

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Standby is the warm standby's part of the status document ([standby],
// issue 42): both vLLMs, which one serves, whether the other is ready as
// a standby, and the failovers.
type Standby struct {
	Mode         string        `json:"mode"`
	Serving      string        `json:"serving"` // "a" or "b"
	StandbyReady bool          `json:"standby_ready"`
	VLLMs        []StandbyVLLM `json:"vllms"`
	// AdmittedMaxNumSeqs is the max_num_seqs the proxy admits for: the
	// serving vLLM's, or the ladder's when that is lower (a promoted
	// standby still on the flags of the rung before an OOM).
	AdmittedMaxNumSeqs int `json:"admitted_max_num_seqs"`
	Failovers          int `json:"failovers"`
	// Swaps are the planned changes to a standby on the ladder's rung.
	Swaps        int              `json:"swaps"`
	LastFailover *events.Failover `json:"last_failover,omitempty"`
}

// StandbyVLLM is one of the two vLLMs.
type StandbyVLLM struct {
	Name       string       `json:"name"` // "a" ([vllm] port) or "b" ([standby] port)
	Role       string       `json:"role"` // "serving" or "standby"
	Port       int          `json:"port"`
	State      status.State `json:"state"`
	Reason     string       `json:"reason,omitempty"`
	PID        int          `json:"pid,omitempty"`
	Rung       int          `json:"rung"`
	MaxNumSeqs int          `json:"max_num_seqs"`
}

// writeStandby is the human view's lines for the two vLLMs.
func writeStandby(w io.Writer, d Doc) {
	sb := d.Standby
	if sb == nil {
		return
	}
	ready := "not ready"
	if sb.StandbyReady {
		ready = "ready"
	}
	last := "none"
	if f := sb.LastFailover; f != nil {
		last = fmt.Sprintf("%s → %s %s (%.2f s from the death to the switch", clean(f.From), clean(f.To), at(d.Now, f.At), f.Seconds)
		if f.FirstTokenSeconds > 0 {
			last += fmt.Sprintf(", %.2f s to the first continued token", f.FirstTokenSeconds)
		}
		last += ")"
	}
	fmt.Fprintf(w, "Standby (%s): vLLM %s serves (admitted for max_num_seqs %d); standby %s; %d %s, last %s\n", clean(sb.Mode), clean(sb.Serving),
		sb.AdmittedMaxNumSeqs, ready, sb.Failovers, plural(sb.Failovers, "failover", "failovers"), last)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range sb.VLLMs {
		pid := "not running"
		if v.PID != 0 {
			pid = fmt.Sprintf("pid %d", v.PID)
		}
		fmt.Fprintf(tw, "  vLLM %s\t%s\tport %d\t%s\t%s\trung %d (max_num_seqs %d)\t%s\n", clean(v.Name), clean(v.Role), v.Port,
			clean(string(v.State)), pid, v.Rung, v.MaxNumSeqs, clean(state.Cut(v.Reason, docText)))
	}
	tw.Flush()
}
