package gpumon

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints what `vllm-guard gpus` shows: one line per device
// (index, name, UUID, used/total GiB, percent, trend), then the processes
// holding memory.
func WriteTable(w io.Writer, s Snapshot) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !s.Up && len(s.Devices) == 0 {
		fmt.Fprintf(tw, "%s\n", orDefault(s.Reason, "GPU metrics unavailable"))
		return tw.Flush()
	}
	if s.Driver != "" {
		fmt.Fprintf(tw, "driver %s\n", s.Driver)
	}
	if !s.Up && s.Reason != "" {
		fmt.Fprintf(tw, "warning: %s (last good readings below)\n", s.Reason)
	}
	fmt.Fprintln(tw, "GPU\tNAME\tUUID\tUSED GiB\tTOTAL GiB\tUSED %\tTREND")
	var procs []Proc
	for _, d := range s.Devices {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.1f\t%.1f\t%.1f\t%s\n", d.Index, orDefault(d.Name, "-"), d.UUID,
			float64(d.Used)/(1<<30), float64(d.Total)/(1<<30), d.Fraction*100, trendText(d))
		procs = append(procs, d.Processes...)
	}
	fmt.Fprintln(tw)
	if len(procs) == 0 {
		fmt.Fprintln(tw, "no process holds GPU memory")
		return tw.Flush()
	}
	fmt.Fprintln(tw, "GPU\tPID\tUSED GiB\tCOMMAND")
	for _, p := range procs {
		cmd := orDefault(p.Command, "(not visible here)")
		if p.Ours {
			cmd += "  [vllm-guard child]"
		} else if p.Role != "" {
			cmd += "  [vllm-guard " + p.Role + "]"
		}
		fmt.Fprintf(tw, "%d\t%d\t%.1f\t%s\n", p.Device, p.PID, float64(p.Used)/(1<<30), cmd)
	}
	if strings.HasPrefix(s.Attribution, "device totals") {
		fmt.Fprintf(tw, "\nattribution: %s\n", s.Attribution)
	}
	return tw.Flush()
}

func trendText(d Device) string {
	if d.Trend == TrendClimbing && d.SecondsToCritical >= 0 {
		return fmt.Sprintf("climbing, critical in %s", secs(d.SecondsToCritical))
	}
	return orDefault(d.Trend, TrendSteady)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
