package realvllm

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// BenchmarkRestart: the tiny model with torch.compile on (no
// --enforce-eager), cold (empty caches) versus the restart after a crash
// (SIGKILL of the EngineCore), with vLLM's caches in the guard's cache
// folder as the systemd units set them (XDG_CACHE_HOME, TRITON_CACHE_DIR;
// VLLM_CACHE_ROOT follows XDG_CACHE_HOME), so the compiled graphs survive.
// Reports time to ready of each, the restart from vLLM's death to ready,
// Python's import of vLLM (launch to its first line), and the guard's own
// share: uvicorn's startup line to ready, plus, for the restart, the exit
// to the next launch less the backoff.
//
//	make bench-restart
func BenchmarkRestart(b *testing.B) {
	for range b.N {
		benchRestartOnce(b)
	}
}

func benchRestartOnce(b *testing.B) {
	s := newBenchScene(b)
	s.start()
	first := s.WaitEvent("cold ready", 1, 2*startBound, isReady)
	core := s.byTitle("VLLM::EngineCore")
	if core == 0 {
		b.Fatal("no VLLM::EngineCore")
	}
	syscall.Kill(core, syscall.SIGKILL)
	ex := s.WaitEvent("exit", 1, exitBound, isExited)
	second := s.WaitEvent("ready after the crash", 2, 2*startBound, isReady)
	starts := []events.Event{}
	for _, e := range s.Events() {
		if isStarting(e) {
			starts = append(starts, e)
		}
	}
	if len(starts) < 2 {
		b.Fatalf("%d starts", len(starts))
	}
	// The guard's share: uvicorn's startup line → ready (the probes), and
	// for the restart also vLLM's death → the next launch, less the
	// backoff. Launch → vLLM's first line is Python importing vLLM.
	firstLines, completes := s.logTimes(""), s.logTimes("Application startup complete")
	after := func(ts []time.Time, from time.Time) time.Time {
		for _, t := range ts {
			if t.After(from) {
				return t
			}
		}
		return time.Time{}
	}
	probes := func(start, ready events.Event) time.Duration {
		var complete time.Time
		for _, c := range completes {
			if c.After(start.Time) && !c.After(ready.Time) {
				complete = c
			}
		}
		return ready.Time.Sub(complete)
	}
	backoff := 100 * time.Millisecond
	gap := starts[1].Time.Sub(ex.Time) - backoff
	b.ReportMetric(first.TimeToReady.Seconds(), "s-cold-to-ready")
	b.ReportMetric(second.TimeToReady.Seconds(), "s-restart-to-ready")
	b.ReportMetric(second.Time.Sub(ex.Time).Seconds(), "s-death-to-ready")
	b.ReportMetric(after(firstLines, starts[0].Time).Sub(starts[0].Time).Seconds(), "s-import-cold")
	b.ReportMetric(float64(probes(starts[0], first))/float64(time.Millisecond), "ms-guard-cold")
	b.ReportMetric(float64(probes(starts[1], second)+gap)/float64(time.Millisecond), "ms-guard-restart")
}

// newBenchScene: torch.compile on, the caches where the units put them,
// a short backoff (subtracted from the guard's share).
func newBenchScene(b *testing.B) *scene {
	s := newScene(b, tiny("tiny-llama", 512)...)
	delete(s.env, "VLLM_CACHE_ROOT")
	s.env["XDG_CACHE_HOME"] = filepath.Join(s.dir, "cache")
	s.env["TRITON_CACHE_DIR"] = filepath.Join(s.dir, "cache", "triton")
	s.backoff = "100ms"
	return s
}
