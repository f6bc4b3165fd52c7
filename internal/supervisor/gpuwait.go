package supervisor

import (
	"fmt"
	"strings"
)

func holdersText(hs []Holder) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		c := h.Command
		if c == "" {
			c = "?"
		}
		parts = append(parts, fmt.Sprintf("pid %d (%s) %.1f GiB", h.PID, c, float64(h.Bytes)/(1<<30)))
	}
	return strings.Join(parts, ", ")
}
