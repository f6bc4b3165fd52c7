package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// These benchmarks run the shipped guard (no race detector) over the
// simulator; `make bench` runs each once (-benchtime 1x).

func logTime(t testing.TB, m map[string]any) time.Time {
	ts, _ := m["ts"].(string)
	v, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts)
	if err != nil {
		t.Fatalf("log time %q: %v", ts, err)
	}
	return v
}

func plainScene(b *testing.B) *scene {
	guard, err := testbin.GuardPlain()
	if err != nil {
		b.Fatal(err)
	}
	s := newScene(b)
	s.logLevel = "info"
	s.guardBin = guard
	return s
}

// BenchmarkReadinessLatency: from the simulator's `Application startup
// complete.` (its own line, as the guard relays it) to the guard's ready
// event, over 10 starts (the simulator crashes 300 ms after each ready).
// The simulator follows uvicorn's order: it prints the line, then listens,
// so the probe the line triggers is usually refused and retried at a short
// cadence. Goals: median ≤ 20 ms, max ≤ 50 ms, with the default 250 ms
// poll and the default "auto" probe (health, models, a 1-token completion).
func BenchmarkReadinessLatency(b *testing.B) {
	s := plainScene(b)
	s.env["FAKEVLLM_FAULT"] = "crash_after=300ms"
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\nmax_delay = \"50ms\"\ngive_up_after = 100"
	s.start()
	const starts = 10
	s.WaitEvent("10 readies", starts, 120*time.Second, isReady)
	// Both times are the guard's clock: the log line's when it relayed the
	// simulator's line, the event's when it published ready.
	var completes []time.Time
	for _, m := range s.Logs() {
		if text, _ := m["msg"].(string); m["logger"] == "vllm" && strings.Contains(text, "Application startup complete") {
			completes = append(completes, logTime(s.t, m))
		}
	}
	var lat []float64
	var prev time.Time
	for _, e := range s.Events() {
		if !isReady(e) {
			continue
		}
		// The last startup line before this ready and after the previous one.
		var complete time.Time
		for _, c := range completes {
			if c.After(prev) && !c.After(e.Time) {
				complete = c
			}
		}
		if !complete.IsZero() {
			lat = append(lat, float64(e.Time.Sub(complete))/float64(time.Millisecond))
		}
		prev = e.Time
	}
	if len(lat) == 0 {
		b.Fatal("no startup line paired with a ready event")
	}
	slices.Sort(lat)
	b.ReportMetric(lat[len(lat)/2], "ms-median")
	b.ReportMetric(lat[len(lat)-1], "ms-max")
}

// BenchmarkIdleSupervision: the guard's resident memory and CPU while it
// supervises a ready, idle vLLM for 10 s (liveness every 10 s, GPU sampling
// every 1 s through the stand-in NVML). Goals: RSS ≤ 30 MB, CPU ≤ 0.5 % of a core.
func BenchmarkIdleSupervision(b *testing.B) {
	s := plainScene(b)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	pid := s.Cmd.Process.Pid
	cpu0, t0 := cpuNanos(pid), time.Now()
	time.Sleep(10 * time.Second) // the measured window itself, not a wait for an event
	cpu1, t1 := cpuNanos(pid), time.Now()
	b.ReportMetric(float64(cpu1-cpu0)/float64(t1.Sub(t0))*100, "%cpu")
	b.ReportMetric(float64(rssKB(pid))/1024, "MB-rss")
}

// BenchmarkLogFlood: the simulator floods its stdout with log lines at
// 100 MB/s (the goal), written every 10 ms; the guard pumps them. Reports
// the rate the child achieved over 3 s (it blocks when the guard does not
// keep up) and the longest time one of its writes blocked. Goals: ≥ 100 MB/s,
// ≤ 100 ms.
func BenchmarkLogFlood(b *testing.B) {
	s := plainScene(b)
	stats := filepath.Join(s.dir, "stats.json")
	s.skipVLLM = true // the harness reading the guard's log must not be the bottleneck
	s.env["FAKEVLLM_FAULT"] = "log_flood=100"
	s.env["FAKEVLLM_STATS_FILE"] = stats
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	type snap struct {
		MaxWriteBlockMS float64 `json:"max_write_block_ms"`
		BytesWritten    float64 `json:"bytes_written"`
		at              time.Time
	}
	// read returns the first statistics written after t (the simulator
	// rewrites the file every second; its mtime says when).
	read := func(after time.Time) snap {
		var st snap
		testkit.WaitFor(b, "flood statistics in "+stats, 10*time.Second, func() bool {
			fi, err := os.Stat(stats)
			if err != nil || !fi.ModTime().After(after) {
				return false
			}
			raw, err := os.ReadFile(stats)
			if err != nil || json.Unmarshal(raw, &st) != nil {
				return false
			}
			st.at = fi.ModTime()
			return true
		})
		return st
	}
	first := read(time.Now().Add(500 * time.Millisecond))
	last := read(first.at.Add(3 * time.Second))
	s.Cmd.Process.Signal(syscall.SIGTERM)
	s.WaitExit(30 * time.Second)
	b.ReportMetric((last.BytesWritten-first.BytesWritten)/last.at.Sub(first.at).Seconds()/1e6, "MB/s-absorbed")
	b.ReportMetric(last.MaxWriteBlockMS, "ms-max-write-block")
}

// cpuNanos is the CPU time pid's threads have used, in nanoseconds: the
// sum of each thread's /proc/PID/task/TID/schedstat (the scheduler's own
// count, not the 10 ms ticks of /proc/PID/stat, too coarse for a
// fraction of a percent over 10 s). A Go program keeps its threads.
func cpuNanos(pid int) int64 {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, p := range stats {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(raw)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			sum += n
		}
	}
	return sum
}

func rssKB(pid int) int64 {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}
