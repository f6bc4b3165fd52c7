package main

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

// Report is the whole benchmark: the table and results.json.
type Report struct {
	Date          string   `json:"date"`
	Command       string   `json:"command"`
	Clients       int      `json:"clients"`
	MaxTokens     int      `json:"max_tokens"`
	Ramp          string   `json:"ramp"`
	Hold          string   `json:"hold"`
	Burst         string   `json:"burst"`
	WarmupClients int      `json:"warmup_clients"`
	TrueSafe      int      `json:"true_safe_concurrency"`
	WallS         float64  `json:"wall_s"`
	Results       []Result `json:"results"`
	Goals         []Goal   `json:"goals"`
}

// Goal is one of the goals for the guard's proxy, checked.
type Goal struct {
	What     string `json:"what"`
	Met      bool   `json:"met"`
	Measured string `json:"measured"`
}

// goals checks the guard's runs against the goals.
func goals(rs []Result) []Goal {
	var gs []Goal
	steady := func(r Result) Goal {
		g := Goal{What: fmt.Sprintf("%s, %s: admitted concurrency at steady state ≥ 90 %% of the true safe %d", r.Shape, r.label(), trueSafe)}
		if r.Admitted == nil {
			g.Measured = "no status reading at steady state"
			return g
		}
		g.Met = r.Admitted.InflightP50*10 >= trueSafe*9
		g.Measured = fmt.Sprintf("median %d in flight (%.1f %%), at most %d; limit %d bound by %s", r.Admitted.InflightP50, r.Admitted.Percent,
			r.Admitted.InflightMax, r.Admitted.Limit, r.Admitted.Bound)
		return g
	}
	for _, r := range rs {
		if r.Front != "guard" || r.Error != "" {
			continue
		}
		if r.Shape == "burst" {
			gs = append(gs, Goal{What: "burst after warm-up, " + r.label() + ": 0 OOMs",
				Met:      r.OOMs == 0,
				Measured: fmt.Sprintf("%d OOMs in the burst (%d in the warm-up of %.0fs; cost model bounding by memory at its end: %v)", r.OOMs, r.WarmupOOMs, r.WarmupS, r.WarmupConfident)})
			gs = append(gs, steady(r))
			continue
		}
		gs = append(gs, Goal{What: "ramp past the point of failure, " + r.label() + ": 0 OOMs, 0 streams cut, excess clients queued or refused with Retry-After",
			Met: r.OOMs == 0 && r.StreamsCut == 0 && r.RefusedNoRetryAfter == 0 && r.Failed == 0,
			Measured: fmt.Sprintf("%d OOMs, %d streams cut, %d refused (%d without Retry-After), %d failed", r.OOMs, r.StreamsCut,
				r.Refused, r.RefusedNoRetryAfter, r.Failed)})
		gs = append(gs, steady(r))
	}
	return gs
}

func (rep Report) markdown(w io.Writer) {
	fmt.Fprintf(w, "Date: %s. Command: `%s`. Wall time %.0f s.\n\n", rep.Date, rep.Command, rep.WallS)
	fmt.Fprintf(w, "N = %d streaming clients (%d-token prompts, %d tokens at one per %s); the true safe concurrency is %d.\n\n",
		rep.Clients, promptTokens, rep.MaxTokens, tokenInterval, rep.TrueSafe)
	fmt.Fprintf(w, "Ramp: 0 → N clients over %s, then all N for %s (steady state: its second half). Burst: N at once for %s (steady state: its second half), "+
		"after a warm-up of %d clients in 6 steps (under the guard, until its cost model bounds the proxy by memory or the warm-up's limit).\n\n",
		rep.Ramp, rep.Hold, rep.Burst, rep.WarmupClients)
	fmt.Fprintln(w, "| front | shape | OOMs | streams cut | refused (no Retry-After) | failed | completed | goodput tok/s | TTFT p50 / p99 | vLLM running p50 / max | admitted at steady state |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, r := range rep.Results {
		if r.Error != "" {
			fmt.Fprintf(w, "| %s | %s | could not run: %s |||||||||\n", r.label(), r.Shape, strings.ReplaceAll(r.Error, "\n", " "))
			continue
		}
		shape, ooms := r.Shape, fmt.Sprint(r.OOMs)
		if r.Shape == "burst" {
			shape = fmt.Sprintf("burst (%.0fs warm-up)", r.WarmupS)
			ooms = fmt.Sprintf("%d (warm-up %d)", r.OOMs, r.WarmupOOMs)
		}
		adm := "n/a"
		if a := r.Admitted; a != nil {
			adm = fmt.Sprintf("%d (%.1f %% of %d; limit %d, %s)", a.InflightP50, a.Percent, trueSafe, a.Limit, a.Bound)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d (%d) | %s | %d | %.0f | %s / %s | %d / %d | %s |\n",
			r.label(), shape, ooms, r.StreamsCut, r.Refused, r.RefusedNoRetryAfter, failedCell(r.Counts), r.Completed, r.GoodputTokS,
			ms(r.TTFTP50Ms), ms(r.TTFTP99Ms), r.RunningP50, r.RunningMax, adm)
	}
	if len(rep.Goals) > 0 {
		fmt.Fprintln(w, "\nGoals (the guard's proxy):")
		fmt.Fprintln(w)
		for _, g := range rep.Goals {
			v := "MET"
			if !g.Met {
				v = "MISSED"
			}
			fmt.Fprintf(w, "- %s: **%s** (%s)\n", g.What, v, g.Measured)
		}
	}
}

// failedCell is the failures and, when there are any, by kind, most first.
func failedCell(c Counts) string {
	if c.Failed == 0 {
		return "0"
	}
	kinds := make([]string, 0, len(c.FailedBy))
	for k := range c.FailedBy {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if c.FailedBy[kinds[i]] != c.FailedBy[kinds[j]] {
			return c.FailedBy[kinds[i]] > c.FailedBy[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, c.FailedBy[k]))
	}
	return fmt.Sprintf("%d (%s)", c.Failed, strings.Join(parts, ", "))
}

func ms(v float64) string {
	if v == 0 {
		return "–"
	}
	return (time.Duration(v * float64(time.Millisecond))).Round(time.Millisecond).String()
}

// scrape reads a Prometheus text exposition: each series' name (labels
// dropped) to its value (the last one of a name wins).
func scrape(url string) (map[string]float64, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return vllmstats.Flat(resp.Body)
}
