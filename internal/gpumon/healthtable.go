package gpumon

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteHealth prints each device's hardware health, one line each, in the
// words of nvidia-smi -q -d ECC,ROW_REMAPPER (for `vllm-guard gpus`).
func WriteHealth(w io.Writer, h Health) {
	for _, d := range h.Devices {
		var parts []string
		switch {
		case d.Lost:
			parts = append(parts, "LOST (fallen off the bus)")
		case d.ResetRequired:
			parts = append(parts, "RESET REQUIRED")
		}
		if d.ECC != nil {
			parts = append(parts, fmt.Sprintf("uncorrected ECC volatile %d aggregate %d", d.ECC.VolatileUncorrected, d.ECC.AggregateUncorrected))
		}
		if r := d.Remap; r != nil {
			parts = append(parts, fmt.Sprintf("remapped rows correctable %d uncorrectable %d pending %s failure %s",
				r.Correctable, r.Uncorrectable, yesNo(r.Pending), yesNo(r.Failure)))
		}
		if p := d.RetiredPagesPending; p != nil {
			parts = append(parts, "retired pages pending "+yesNo(*p))
		}
		if d.ThrottleKnown {
			t := "none"
			if len(d.Throttle) > 0 {
				t = strings.Join(d.Throttle, ", ")
			}
			parts = append(parts, "hardware clock slowdown "+t)
		}
		if len(d.XIDCounts) > 0 {
			xs := make([]uint64, 0, len(d.XIDCounts))
			for x := range d.XIDCounts {
				xs = append(xs, x)
			}
			slices.Sort(xs)
			var s []string
			for _, x := range xs {
				s = append(s, fmt.Sprintf("%d×%d", x, d.XIDCounts[x]))
			}
			parts = append(parts, "XIDs "+strings.Join(s, " "))
		}
		if len(d.Unsupported) > 0 {
			parts = append(parts, "not reported: "+strings.Join(d.Unsupported, ", "))
		}
		fmt.Fprintf(w, "GPU %d health: %s\n", d.Index, strings.Join(parts, "; "))
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
