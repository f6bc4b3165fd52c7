package integration

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Without a standby, vLLM's API server outlives its dead engine for
// seconds (its watchdog looks every 5 s; about 6 s on the real server,
// here 4 s: longer than the proxy's wait for the guard to notice a death).
// The guard knows at /health's 503 that vLLM is going (engine_dead) though
// its status still says ready; the proxy is told at once, so each stream
// the engine's death cut is held and continued after the restart — whole,
// its text and ids vLLM's own uninterrupted answer, no error event —
// instead of being judged "cut while vLLM stayed up" and ended with vLLM's
// error (issue 42's real failover bench saw that on 4 of 6 deaths).
func TestStreamsCutByAnEngineDeathOutliveTheSlowExit(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_ERA"] = "v1"
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "60ms"
	s.env["FAKEVLLM_ENGINE_DEAD_EXIT"] = "4s"
	proxyPort := testkit.FreePort(t)
	s.extra = fmt.Sprintf("\n[restart]\ninitial_delay = \"100ms\"\n[liveness]\ninterval = \"1s\"\n[proxy]\nlisten = \"127.0.0.1:%d\"\n", proxyPort)
	proxyURL := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)

	const n = 3
	var bodies []string
	for i := range n {
		bodies = append(bodies, greedyBody(i, 40))
	}
	want := ownAnswers(t, fmt.Sprintf("http://127.0.0.1:%d", s.port), bodies, 40)
	wait := streamsInFlight(t, proxyURL, bodies)
	if err := syscall.Kill(engineOf(t, ready.PID), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("vLLM's exit", 1, 60*time.Second, isExited)
	s.WaitEvent("ready again", 2, 60*time.Second, isReady)
	got := wait()
	for i := range n {
		if g := got[i]; g.errors != 0 || g.done != 1 || g.text != want[i].text || !slices.Equal(g.ids, want[i].ids) || len(g.finishes) != 1 {
			t.Errorf("stream %d through the engine's death: %q ids %v, %d errors, %d [DONE], finishes %v\nwant %q ids %v", i, g.text, g.ids,
				g.errors, g.done, g.finishes, want[i].text, want[i].ids)
		}
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}
