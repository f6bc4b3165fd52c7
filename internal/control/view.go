package control

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// sparkWidth is the most characters a sparkline takes.
const sparkWidth = 40

var sparkRunes = []rune("▁▂▃▄▅▆▇█")

// WriteStatus writes the human view of `vllm-guard status`. It depends
// only on d (ages are taken against d.Now, times are shown in UTC), so the
// same document always renders the same text. It never writes colours.
func WriteStatus(w io.Writer, d Doc) {
	d = Redacted(d) // a document from an older guard may hold secrets
	g := d.Guard
	name := "vllm-guard"
	if d.Version != "" {
		name += " " + state.Cut(d.Version, docVersion)
	}
	// Every string in the document came from another process: cleaned.
	fmt.Fprintf(w, "%s: %s since %s\n", clean(name), clean(state.Cut(strings.ToUpper(string(g.State)), docText)), at(d.Now, g.Since))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(label, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t%s\n", label, clean(fmt.Sprintf(format, args...)))
	}
	if g.Reason != "" {
		row("reason", "%s", g.Reason)
	}
	switch g.State {
	case status.StateStarting:
		loadRows(row, d) // load.go
		if g.LastProbe != "" {
			row("last probe", "%s", g.LastProbe)
		}
	case status.StateBackoff:
		if !g.NextStartAt.IsZero() {
			row("next start", "in %s (%s)", age(g.NextStartAt.Sub(d.Now)), clock(g.NextStartAt))
		}
	case status.StateFailed, status.StateStopped:
		row("exit code", "%d", g.ExitCode)
	}
	if g.PID != 0 {
		up := ""
		if !g.StartedAt.IsZero() {
			up = ", up " + age(d.Now.Sub(g.StartedAt))
		}
		row("vLLM", "pid %d%s", g.PID, up)
	} else {
		row("vLLM", "not running")
	}
	ttr := "never ready yet"
	if g.TimeToReady > 0 {
		ttr = g.TimeToReady.Round(100 * time.Millisecond).String()
	}
	row("time to ready", "%s (last start); %d %s", ttr, g.Starts, plural(g.Starts, "start", "starts"))
	if g.Rung.KVCacheMemoryBytes > 0 {
		row("profile", "rung %d: max_num_seqs %d, kv_cache_memory_bytes %d (%s)",
			g.Rung.Index, g.Rung.MaxNumSeqs, g.Rung.KVCacheMemoryBytes, gib(g.Rung.KVCacheMemoryBytes))
	} else {
		row("profile", "rung %d: max_num_seqs %d, gpu_memory_utilization %.2f",
			g.Rung.Index, g.Rung.MaxNumSeqs, g.Rung.GPUMemoryUtilization)
	}
	if sv := d.Saved; sv != nil && !sv.OK {
		row("saved state", "NOT SAVED since %s: %s; a restarted guard resumes rung %d (the one on disk), not rung %d",
			at(d.Now, sv.Since), state.Cut(sv.Error, docText), sv.SavedRung, g.Rung.Index)
	}
	if g.Probe != "" {
		row("probe", "%s", g.Probe)
	}
	if g.Cost != "" {
		row("cost model", "%s", g.Cost)
	}
	row("restarts", "%s", restarts(g.Restarts))
	row("requests", "%s", vllmLine(d))
	if p := d.Proxy; p != nil {
		row("proxy", "%d in flight of %d, %d queued of %d; %d admitted, %d refused (429/503)",
			p.Inflight, p.Limit, p.Queued, p.QueueSize, p.Admitted, p.Rejected)
		if p.Bound != "" {
			row("proxy limit", "bound by %s: %s", clean(p.Bound), clean(p.Why))
		}
		if p.Held > 0 || p.Paused > 0 {
			row("proxy hold", "holding %d requests (%d streams paused), resuming when vLLM is ready", p.Held, p.Paused)
		}
		if s := p.LastSuspect; s != nil {
			row("proxy suspect", "%d refused a resend after %d deaths in flight, last %s from %s: %d bytes, about %.0f prompt tokens",
				p.Suspects, s.Deaths, clean(s.Path), clean(s.Client), s.BodyBytes, s.PromptTokens)
		}
	}
	tw.Flush()
	writeStandby(w, d)
	writeGroup(w, d)

	writeGPUs(w, d)

	if len(d.Alerts) == 0 {
		fmt.Fprintln(w, "Alerts: none")
	} else {
		fmt.Fprintln(w, "Alerts:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, a := range d.Alerts {
			fmt.Fprintf(tw, "  %s\tsince %s\t%s\n", clean(a.Name), at(d.Now, a.Since), clean(a.Message))
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "Last incident: %s\n", incidentLine(d.LastIncident))
}

func writeGPUs(w io.Writer, d Doc) {
	gpu := d.GPU
	if !gpu.Up {
		why := gpu.Reason
		if why == "" {
			why = "no reason given"
		}
		fmt.Fprintf(w, "GPUs: unavailable (%s)\n", clean(why))
		return
	}
	if len(gpu.Devices) == 0 {
		fmt.Fprintln(w, "GPUs: none watched")
		return
	}
	header := "GPUs"
	if gpu.Attribution != "" {
		header += " (memory attributed by " + clean(gpu.Attribution) + ")"
	}
	fmt.Fprintf(w, "%s, last 10 minutes:\n", header)
	for _, dev := range gpu.Devices {
		fmt.Fprintf(w, "  %d  %s  %s / %s  %.0f%%  %s\n",
			dev.Index, clean(dev.Name), gib(dev.Used), gib(dev.Total), dev.Fraction*100, trend(dev))
		if dev.WarnAt > 0 {
			budget := "not known yet"
			if dev.Budget > 0 {
				budget = fmt.Sprintf("%.1f%%", dev.Budget*100)
			}
			fmt.Fprintf(w, "     vLLM's budget %s; warn at %.1f%%, critical at %.1f%%\n", budget, dev.WarnAt*100, dev.CriticalAt*100)
		}
		if len(dev.History) > 0 {
			lo, hi := SparkScale(dev.History)
			fmt.Fprintf(w, "     %s  %.0f%%–%.0f%%\n", Sparkline(dev.History, sparkWidth, lo, hi), lo*100, hi*100)
		}
	}
}

// sparkMinSpan is the narrowest range a sparkline spans: noise of a
// point or two must not fill the whole height.
const sparkMinSpan = 0.10

// SparkScale is the range a sparkline of fractions is drawn over: from
// the lowest to the highest value, at least sparkMinSpan wide, within 0..1.
// A relative scale shows a climb from 80% to 93% that an absolute one
// would draw as two heights.
func SparkScale(fractions []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, f := range fractions {
		if !math.IsNaN(f) {
			lo, hi = min(lo, f), max(hi, f)
		}
	}
	if lo > hi { // nothing but NaN
		return 0, 1
	}
	lo, hi = min(max(lo, 0), 1), min(max(hi, 0), 1)
	if hi-lo < sparkMinSpan {
		hi = min(lo+sparkMinSpan, 1)
		lo = hi - sparkMinSpan
	}
	return lo, hi
}

// Sparkline draws fractions in at most width characters, oldest first, ▁
// at lo and █ at hi. Longer series are cut into width buckets, each drawn
// at its highest value: a short spike is what matters for memory.
func Sparkline(fractions []float64, width int, lo, hi float64) string {
	n := len(fractions)
	if n == 0 || width <= 0 {
		return "-"
	}
	width = min(width, n)
	span := hi - lo
	var b strings.Builder
	for i := range width {
		start, end := i*n/width, (i+1)*n/width
		peak := math.Inf(-1)
		for _, f := range fractions[start:end] {
			if !math.IsNaN(f) {
				peak = max(peak, f)
			}
		}
		idx := 0
		if span > 0 && !math.IsInf(peak, 0) {
			// Levels are equal slices of the span; the top value lands in
			// the last one.
			x := (peak - lo) / span * float64(len(sparkRunes))
			idx = int(min(max(x, 0), float64(len(sparkRunes)-1)))
		}
		b.WriteRune(sparkRunes[idx])
	}
	return b.String()
}

func trend(dev gpumon.Device) string {
	switch dev.Trend {
	case "":
		return "-"
	case gpumon.TrendClimbing:
		s := fmt.Sprintf("climbing %s/s", mib(dev.SlopeBytesPerSec))
		if dev.SecondsToCritical >= 0 {
			s += ", critical in " + age(time.Duration(dev.SecondsToCritical*float64(time.Second)))
		}
		return s
	default:
		return clean(dev.Trend)
	}
}

func vllmLine(d Doc) string {
	v := d.VLLM
	if v.Up {
		s := fmt.Sprintf("running %g, waiting %g, KV cache %.1f%%, preemptions %g", v.Running, v.Waiting, v.KVUsage*100, v.Preemptions)
		if !v.ScrapedAt.IsZero() {
			s += " (scraped " + age(d.Now.Sub(v.ScrapedAt)) + " ago)"
		}
		return s
	}
	if v.LastError != "" && d.Guard.State == status.StateReady {
		return fmt.Sprintf("unknown: vLLM's /metrics failed %d of %d scrapes; last: %s", v.Failures, v.Scrapes, v.LastError)
	}
	if d.Group != nil && d.Group.Rank != 0 {
		return "not scraped: a group's follower runs vLLM headless (the leader's status has the group's requests)"
	}
	return "not scraped (vLLM not ready)"
}

func restarts(m map[cause.Cause]int) string {
	var parts []string
	seen := map[cause.Cause]bool{}
	for _, c := range cause.Causes {
		seen[c] = true
		if m[c] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", c, m[c]))
		}
	}
	// Causes a newer guard knows and this view does not, in a stable order.
	var extra []string
	for c, n := range m {
		if !seen[c] && n > 0 {
			extra = append(extra, fmt.Sprintf("%s %d", c, n))
		}
	}
	slices.Sort(extra)
	parts = append(parts, extra...)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// incidentWidth bounds the last incident's line so it fits a terminal.
const incidentWidth = 160

func incidentLine(inc *state.Incident) string {
	if inc == nil {
		return "none"
	}
	after := fmt.Sprintf("rung %d → %d", inc.RungBefore.Index, inc.RungAfter.Index)
	if inc.Action == policy.ActionGiveUp {
		after = fmt.Sprintf("rung %d, gave up", inc.RungBefore.Index)
	}
	what := inc.Summary
	if len(inc.Evidence) > 0 {
		what = fmt.Sprintf("L%d: %s", inc.Evidence[0].N, strings.TrimSpace(inc.Evidence[0].Text))
	}
	if inc.VLLM != "" {
		after = fmt.Sprintf("vLLM %s (%s), %s", inc.VLLM, inc.Role, after)
		if inc.TakenOverBy != "" {
			after += ", vLLM " + inc.TakenOverBy + " took over"
		}
	}
	s := clean(fmt.Sprintf("%s %s, %s: %s", inc.Time.UTC().Format("2006-01-02 15:04:05 UTC"), inc.Cause, after, what))
	if r := []rune(s); len(r) > incidentWidth {
		s = string(r[:incidentWidth-1]) + "…"
	}
	return s
}

// at writes a past instant as "12:04:05 UTC (5m55s ago)" against now; the
// date is added when it is not now's date.
func at(now, t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return fmt.Sprintf("%s (%s ago)", stamp(now, t), age(now.Sub(t)))
}

func stamp(now, t time.Time) string {
	t, now = t.UTC(), now.UTC()
	if t.Format(time.DateOnly) == now.Format(time.DateOnly) {
		return t.Format("15:04:05 UTC")
	}
	return t.Format("2006-01-02 15:04:05 UTC")
}

func clock(t time.Time) string { return t.UTC().Format("15:04:05 UTC") }

// age writes a duration in whole seconds, minutes or hours as operators
// read them: "41s", "5m55s", "2h03m", "3d04h".
func age(d time.Duration) string {
	d = max(d, 0).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func mib(bytesPerSec float64) string {
	return fmt.Sprintf("%+.0f MiB", bytesPerSec/(1<<20))
}

// clean keeps a field on one line and the terminal safe: control and
// format characters (escape sequences from vLLM's output or a peer guard's
// document included) become spaces (state.Clean).
func clean(s string) string { return state.Clean(s) }
