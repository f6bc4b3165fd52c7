package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Real vLLM deployments, part 2: stopping without cutting requests, a
// wedged engine, a silent first download, reload and signals.

// streamResult is how one streamed completion ended.
type streamResult struct {
	chunks int
	done   bool // ended with data: [DONE]
	status int
	err    error
}

// stream posts a streamed completion of n tokens to base and reads it to
// its end; first is closed at the first chunk.
func stream(base string, n int, first chan<- struct{}) streamResult {
	body, _ := json.Marshal(map[string]any{"model": "test-model", "prompt": "drain me", "max_tokens": n, "stream": true})
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return streamResult{err: err}
	}
	defer resp.Body.Close()
	r := streamResult{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		r.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			r.done = true
		case strings.HasPrefix(line, "data: {") && strings.Contains(line, `"text"`):
			if r.chunks == 0 && first != nil {
				close(first)
			}
			r.chunks++
		}
	}
	r.err = sc.Err()
	return r
}

func TestStopDrainsAStreamInFlight(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--shutdown-timeout\", \"20\"]", bins.fakevllm)
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "40ms"
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	first := make(chan struct{})
	res := make(chan streamResult, 1)
	go func() { res <- stream(fmt.Sprintf("http://127.0.0.1:%d", s.port), 50, first) }()
	select {
	case <-first:
	case r := <-res:
		t.Fatalf("the stream ended before its first chunk: %+v", r)
	case <-time.After(30 * time.Second):
		t.Fatal("no first chunk")
	}
	s.Cmd.Process.Signal(syscall.SIGTERM)
	var r streamResult
	select {
	case r = <-res:
	case <-time.After(60 * time.Second):
		t.Fatal("the stream did not end")
	}
	if !r.done || r.chunks != 50 || r.err != nil {
		t.Fatalf("the stream in flight was cut by the stop: %+v", r)
	}
	if code := s.WaitExit(60 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures recorded for a stop on request", n)
	}
	if n := s.CountEvents(decided(events.DecisionKill)); n != 0 {
		t.Fatal("vLLM was killed instead of drained")
	}
	s.waitNoProcesses(10 * time.Second)
}

func TestRestartThroughTheProxyIsAPause(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	proxyPort := testkit.FreePort(t)
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--shutdown-timeout\", \"20\"]", bins.fakevllm)
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "20ms"
	// vLLM 0.32.0's own drain (the simulator's v1 era): new requests 500,
	// requests in flight cut after a few seconds; through the proxy no
	// client sees either.
	s.env["FAKEVLLM_ERA"] = "v1"
	s.env["FAKEVLLM_DRAIN_CUT"] = "200ms"
	s.extra = fmt.Sprintf("\n[proxy]\nlisten = \"127.0.0.1:%d\"\nqueue_timeout = \"60s\"\n", proxyPort)
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)
	base := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)

	// Clients stream through the proxy before, during and after the restart.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var results []streamResult
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := stream(base, 30, nil)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	// Let the clients be in flight, then restart.
	testkit.WaitFor(t, "a client's request to finish", 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(results) >= 4 })
	out, err := exec.Command(bins.guard, "restart", "--socket", filepath.Join(s.dir, "guard.sock")).CombinedOutput()
	if err != nil {
		t.Fatalf("vllm-guard restart: %v: %s", err, out)
	}
	s.WaitEvent("ready again", 1, 60*time.Second, after(ready, isReady))
	mark := func() int { mu.Lock(); defer mu.Unlock(); return len(results) }()
	testkit.WaitFor(t, "clients served after the restart", 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(results) >= mark+4 })
	close(stop)
	wg.Wait()
	bad := 0
	for _, r := range results {
		if !r.done || r.err != nil || r.chunks != 30 {
			bad++
			t.Errorf("client result %+v", r)
		}
	}
	if bad > 0 || len(results) < 8 {
		t.Fatalf("%d of %d client requests failed across a planned restart", bad, len(results))
	}
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures recorded for a planned restart", n)
	}
	s.stopCleanly(60*time.Second, 10*time.Second)
}

func TestTensorParallelStopAndKillNineFreeBothGPUs(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stop", "kill -9"} {
		t.Run(how, func(t *testing.T) {
			s := quick(newScene(t))
			s.writeDevices(
				"GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3",
				"GPU-5e1f0000-0000-4000-8000-000000000002 85899345920 536870912 NVIDIA H100 80GB HBM3")
			s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--tensor-parallel-size\", \"2\"]", bins.fakevllm)
			s.env["CUDA_VISIBLE_DEVICES"] = "0,1"
			s.start()
			s.WaitEvent("ready", 1, 60*time.Second, isReady)
			if n := len(s.ours()); n < 4 {
				t.Fatalf("%d processes in vLLM's tree; want the API server, the EngineCore and 2 workers", n)
			}
			if held := gpuHolders(t, s); len(held) < 2 {
				t.Fatalf("memory held by %v; want both workers' shares", held)
			}
			if how == "stop" {
				s.Cmd.Process.Signal(syscall.SIGTERM)
				if code := s.WaitExit(60 * time.Second); code != 0 {
					t.Fatalf("exit %d", code)
				}
			} else {
				s.Cmd.Process.Kill()
				s.WaitExit(60 * time.Second)
			}
			s.waitNoProcesses(15 * time.Second)
			testkit.WaitFor(t, "both GPUs free", 15*time.Second, func() bool { return len(gpuHolders(t, s)) == 0 })
		})
	}
}

// gpuHolders lists the processes NVML (the stand-in library, read through
// `vllm-guard gpus --json`, which also lets it retire dead processes) says
// hold memory on any device.
func gpuHolders(t *testing.T, s *scene) []int {
	t.Helper()
	cmd := exec.Command(bins.guard, "gpus", "--json")
	cmd.Env = append(os.Environ(), "FAKENVML_STATE="+s.gpuDir, "LD_LIBRARY_PATH="+bins.nvmlDir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("vllm-guard gpus: %v: %s", err, out)
	}
	var snap struct {
		Devices []struct {
			Processes []struct {
				PID  int    `json:"pid"`
				Used uint64 `json:"used_bytes"`
			} `json:"processes"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(out, &snap); err != nil {
		t.Fatalf("vllm-guard gpus --json: %v: %s", err, out)
	}
	var pids []int
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if p.Used > 0 {
				pids = append(pids, p.PID)
			}
		}
	}
	return pids
}

func TestAWedgedEngineIsAHangAndABusyOneIsNot(t *testing.T) {
	t.Parallel()
	t.Run("busy and progressing", func(t *testing.T) {
		t.Parallel()
		s := quick(newScene(t))
		s.env["FAKEVLLM_TOKEN_INTERVAL"] = "30ms"
		s.extra = "\n[liveness]\nstuck_timeout = \"1s\"\n[gpu]\nsample_interval = \"100ms\"\n"
		s.start()
		s.WaitEvent("ready", 1, 60*time.Second, isReady)
		base := fmt.Sprintf("http://127.0.0.1:%d", s.port)
		// Ten times stuck_timeout of steady, slow load.
		deadline := time.Now().Add(10 * time.Second)
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					if r := stream(base, 20, nil); !r.done {
						t.Errorf("a request under load: %+v", r)
						return
					}
				}
			})
		}
		wg.Wait()
		if n := s.CountEvents(isExited); n != 0 {
			t.Fatalf("a progressing vLLM under load was restarted: %v", s.Events())
		}
		s.stopCleanly(30*time.Second, 10*time.Second)
	})
	t.Run("wedged", func(t *testing.T) {
		t.Parallel()
		s := quick(newScene(t))
		s.env["FAKEVLLM_TOKEN_INTERVAL"] = "30ms"
		oneShot(s, "wedge_after=300ms")
		s.extra = "\n[liveness]\nstuck_timeout = \"1s\"\n[gpu]\nsample_interval = \"100ms\"\n"
		s.start()
		s.WaitEvent("ready", 1, 60*time.Second, isReady)
		base := fmt.Sprintf("http://127.0.0.1:%d", s.port)
		for range 3 {
			go stream(base, 1000, nil) // in flight when the engine wedges; cut by the restart
		}
		e := s.WaitEvent("the hang", 1, 60*time.Second, exitedWith("hang"))
		if !strings.Contains(verdictText(e), "stuck") {
			t.Fatalf("the hang does not say vLLM was stuck: %s", verdictText(e))
		}
		s.WaitEvent("ready after the hang", 2, 60*time.Second, isReady)
		s.stopCleanly(30*time.Second, 10*time.Second)
	})
}

func TestASilentDownloadIsNotAStallButASilentHangIs(t *testing.T) {
	t.Parallel()
	t.Run("download", func(t *testing.T) {
		t.Parallel()
		s := quick(newScene(t))
		s.env["FAKEVLLM_DOWNLOAD"] = "6s"
		s.env["FAKEVLLM_DOWNLOAD_DIR"] = filepath.Join(s.dir, "hub")
		s.extra = "\n[readiness]\nstall_timeout = \"2s\"\n"
		s.start()
		s.WaitEvent("ready after the download", 1, 90*time.Second, isReady)
		if n := s.CountEvents(isExited); n != 0 {
			t.Fatalf("a silent download longer than stall_timeout was killed: %v", s.Events())
		}
		if n := s.CountEvents(func(e events.Event) bool { return e.Kind == events.KindProgress && e.Phase == "io" }); n == 0 {
			t.Fatal("no I/O progress said while the download was silent")
		}
		s.stopCleanly(30*time.Second, 10*time.Second)
	})
	t.Run("hang", func(t *testing.T) {
		t.Parallel()
		s := quick(newScene(t))
		s.env["FAKEVLLM_SILENT_COMPILE"] = "1"
		s.env["FAKEVLLM_COMPILE"] = "1h"
		s.extra = "\n[readiness]\nstall_timeout = \"2s\"\n"
		s.start()
		e := s.WaitEvent("the hang", 1, 60*time.Second, exitedWith("hang"))
		if !strings.Contains(verdictText(e), "no disk I/O") {
			t.Fatalf("verdict %s", verdictText(e))
		}
		s.stopCleanly(30*time.Second, 10*time.Second)
	})
}

func TestSignalsHaveMeanings(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2} {
		s.Cmd.Process.Signal(sig)
	}
	// A broken file on SIGHUP changes nothing.
	cfg := filepath.Join(s.dir, "vllm-guard.toml")
	good, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(append([]byte{}, good...), []byte("\n[liveness]\ninterval = 5\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Cmd.Process.Signal(syscall.SIGHUP)
	refused := s.WaitEvent("the reload refused", 1, 30*time.Second, decided(events.DecisionReload))
	if !strings.HasPrefix(refused.Reason, "refused: ") || !strings.Contains(refused.Reason, "vllm-guard.toml:") {
		t.Fatalf("a broken file on SIGHUP: %q; want refused, naming the file and line", refused.Reason)
	}
	before := statusDoc(t, s).GPU.Devices[0].WarnAt
	// A good file applies without restarting vLLM: a lower warning margin
	// over vLLM's budget moves the threshold at the next sample.
	if err := os.WriteFile(cfg, append(append([]byte{}, good...), []byte("\n[gpu]\nwarn_over_budget = 0.01\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Cmd.Process.Signal(syscall.SIGHUP)
	if e := s.WaitEvent("the reload", 2, 30*time.Second, decided(events.DecisionReload)); e.Reason != "applied" {
		t.Fatalf("reload: %q", e.Reason)
	}
	testkit.WaitFor(t, "the new threshold in status", 30*time.Second, func() bool {
		after := statusDoc(t, s).GPU.Devices[0].WarnAt
		return after > 0 && after < before-0.015
	})
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d starts: a reload or an ignored signal restarted vLLM", n)
	}
	if n := s.CountEvents(after(ready, kind(events.KindState))); n != 0 {
		t.Fatalf("the state changed on SIGUSR1/SIGUSR2/SIGHUP: %v", s.Events())
	}
	// SIGQUIT stops gracefully.
	s.Cmd.Process.Signal(syscall.SIGQUIT)
	if code := s.WaitExit(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGQUIT", code)
	}
	s.waitNoProcesses(10 * time.Second)
}

func TestASecondStopSignalKillsAtOnce(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_FAULT"] = "ignore_sigterm"
	s.editConfig = func(text string) string {
		return strings.Replace(text, `stop_timeout = "3s"`, `stop_timeout = "10m"`, 1)
	}
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	s.Cmd.Process.Signal(syscall.SIGTERM)
	s.WaitEvent("stopping", 1, 30*time.Second, inState("stopping"))
	s.Cmd.Process.Signal(syscall.SIGINT)
	s.WaitEvent("the kill", 1, 30*time.Second, decided(events.DecisionKill))
	if code := s.WaitExit(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s.waitNoProcesses(10 * time.Second)
}
