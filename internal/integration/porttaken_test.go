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
	other := startSim(t, s.port, nil) // answers /health, /v1/models and completions at once
	s.start()
	if code := s.waitExit(60 * time.Second); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	if n := s.countEvents(isReady); n != 0 {
		t.Fatalf("%d ready events: the other instance's vLLM was taken for this one", n)
	}
	if n := s.countEvents(isStarting); n != 1 {
		t.Errorf("%d starts, want 1", n)
	}
	ex := s.waitEvent("exit", 1, time.Second, exitedWith("config_error"))
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
