package integration

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Two instance configs that share vLLM's port (issue 32 item 4): another
// vLLM already serves on it. The guard must not call that vLLM ready: no
// READY, exit 78 after its one start, a reason that names the holder's
// pid; the other vLLM is untouched and still serving.
func TestPortHeldByAnotherVLLMIsAConfigError(t *testing.T) {
	s := newScene(t)
	portWait(s, "1s")                 // the holder stays: the wait at the first start is portguard_test.go's
	other := startSim(t, s.port, nil) // answers /health, /v1/models and completions at once
	s.start()
	if code := s.WaitExit(60 * time.Second); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	if n := s.CountEvents(isReady); n != 0 {
		t.Fatalf("%d ready events: the other instance's vLLM was taken for this one", n)
	}
	if n := s.CountEvents(isStarting); n != 1 {
		t.Errorf("%d starts, want 1", n)
	}
	ex := s.WaitEvent("exit", 1, time.Second, exitedWith("config_error"))
	pid := "pid " + strconv.Itoa(other.cmd.Process.Pid)
	if text := verdictText(ex); !strings.Contains(text, pid) || !strings.Contains(text, "port "+strconv.Itoa(s.port)) {
		t.Errorf("the verdict does not name the holder (%s) and the port:\n%s", pid, text)
	}
	if !other.alive() {
		t.Fatal("the other vLLM was stopped")
	}
	resp, err := http.Get(other.url() + "/health")
	if err != nil {
		t.Fatalf("the other vLLM no longer answers: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the other vLLM's /health: %d", resp.StatusCode)
	}
	if left := s.ours(); len(left) != 0 {
		t.Errorf("this guard's vLLM processes left: %v", describe(left))
	}
}

// The issue's own case: two guard instances whose configs share vLLM's
// port. The first runs and is ready; the second says no READY, exits 78
// after one start naming the first instance's vLLM (its API server's pid),
// and the first instance is untouched: still ready, same vLLM, no restart.
func TestSecondGuardOnTheSamePortLeavesTheFirstAlone(t *testing.T) {
	first := newScene(t)
	first.start()
	first.WaitEvent("the first instance ready", 1, 60*time.Second, isReady)
	before := waitState(t, first.socket(), "ready", 10*time.Second)

	second := newScene(t)
	second.port = first.port
	portWait(second, "1s")
	second.start()
	if code := second.WaitExit(60 * time.Second); code != 78 {
		t.Fatalf("second guard: exit %d, want 78", code)
	}
	if n := second.CountEvents(isReady); n != 0 {
		t.Fatalf("second guard: %d ready events", n)
	}
	ex := second.WaitEvent("exit", 1, time.Second, exitedWith("config_error"))
	if text := verdictText(ex); !strings.Contains(text, "pid "+strconv.Itoa(before.Guard.PID)) {
		t.Errorf("the second guard's verdict does not name the first vLLM (pid %d):\n%s", before.Guard.PID, text)
	}
	after := waitState(t, first.socket(), "ready", 10*time.Second)
	if after.Guard.PID != before.Guard.PID || first.CountEvents(isStarting) != 1 || first.CountEvents(isExited) != 0 {
		t.Errorf("the first instance was disturbed: pid %d then %d, %d starts, %d exits",
			before.Guard.PID, after.Guard.PID, first.CountEvents(isStarting), first.CountEvents(isExited))
	}
	first.stopCleanly(30*time.Second, 10*time.Second)
}
