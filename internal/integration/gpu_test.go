package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// holdGPU starts a foreign process that holds bytes on device 0 in the
// stand-in NVML state, as another tenant would.
func holdGPU(t *testing.T, s *scene, bytes uint64) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	p := filepath.Join(s.gpuDir, "procs", fmt.Sprint(cmd.Process.Pid))
	if err := os.WriteFile(p+".tmp", []byte(fmt.Sprintf("0 %d\n", bytes)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// Memory held by someone else: the guard does not launch vLLM into it; it
// waits (waiting_gpu, naming the holder), then starts once it is freed.
func TestWaitsForFreeGPUMemoryBeforeStarting(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	holder := holdGPU(t, s, 40<<30)
	s.extra = "\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	w := s.WaitEvent("waiting for GPU memory", 1, 30*time.Second, inState("waiting_gpu"))
	if !strings.Contains(w.Reason, fmt.Sprintf("pid %d", holder.Process.Pid)) {
		t.Fatalf("the wait does not name the holder %d: %q", holder.Process.Pid, w.Reason)
	}
	if n := s.CountEvents(isStarting); n != 0 {
		t.Fatalf("vLLM launched into held memory")
	}
	holder.Process.Kill()
	holder.Wait()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures: the start should have waited for the memory", n)
	}
}

// The driver frees a dead process's memory with a delay: after an OOM the
// guard waits for the release, so the next start does not fail vLLM's
// free-memory check (gpu_busy).
func TestWaitsForReleaseAfterExit(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	os.WriteFile(filepath.Join(s.gpuDir, "release_delay_ms"), []byte("3000\n"), 0o644)
	// A SIGSEGV leaves the memory to the driver; a clean exit (crash_after's
	// exit 0) frees it at once and the delay would never apply.
	s.env["FAKEVLLM_FAULT"] = "segv_after=300ms"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "fault-fired")
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	// The fault fires 300 ms after vLLM's startup line, before or after the
	// guard's readiness on a loaded machine: what matters is the start after.
	crash := s.WaitEvent("the crash", 1, 60*time.Second, isExited)
	s.WaitEvent("ready after the crash", 1, 60*time.Second, after(crash, isReady))
	if n := s.CountEvents(exitedWith("gpu_busy")); n != 0 {
		t.Fatal("the restart ran into the old run's memory (gpu_busy)")
	}
	wait := s.WaitEvent("the release wait", 1, time.Second, inState("waiting_gpu"))
	end := s.WaitEvent("the release", 1, time.Second, after(wait, kind(events.KindState)))
	// The stand-in says when it let the dead run's memory go (3 s after
	// NVML first saw it dead): the wait must have lasted until then, at any
	// speed, and ended in backoff.
	b, err := os.ReadFile(filepath.Join(s.gpuDir, "released"))
	if err != nil {
		t.Fatalf("the stand-in never let the memory go: %v", err)
	}
	var releasedMs int64 // the last of the run's processes let go
	for _, line := range strings.Fields(strings.ReplaceAll(string(b), " ", "@")) {
		var pid int
		var ms int64
		if _, err := fmt.Sscanf(line, "%d@%d", &pid, &ms); err != nil {
			t.Fatalf("released %q: %v", b, err)
		}
		releasedMs = max(releasedMs, ms)
	}
	if end.State != "backoff" || end.Time.UnixMilli() < releasedMs || wait.Time.UnixMilli() > releasedMs {
		t.Fatalf("the release wait ran from %s to %s (into %s), the memory was let go at %s: the guard did not wait for the release",
			wait.Time.Format(time.StampMilli), end.Time.Format(time.StampMilli), end.State, time.UnixMilli(releasedMs).Format(time.StampMilli))
	}
}

// NVML fails mid-run (a driver error on the memory queries): the guard logs
// it, keeps vLLM serving, and recovers when NVML answers again. (A GPU
// that is lost is a gpu_fault instead: gpufault_test.go.)
func TestNVMLFailureMidRunIsSurvived(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.extra = "\n[gpu]\nsample_interval = \"100ms\"\n[liveness]\ninterval = \"200ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	fault := filepath.Join(s.gpuDir, "fault")
	os.WriteFile(fault, []byte("999\n"), 0o644) // NVML_ERROR_UNKNOWN
	s.WaitLog("the NVML error", 1, 10*time.Second, func(m map[string]any) bool {
		return m["logger"] == "gpu" && m["level"] == "warn"
	})
	os.Remove(fault)
	s.WaitLog("recovery", 1, 10*time.Second, func(m map[string]any) bool {
		text, _ := m["msg"].(string)
		return m["logger"] == "gpu" && strings.Contains(strings.ToLower(text), "recover")
	})
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("vLLM was restarted because NVML failed")
	}
}

// No NVML library at all: the guard says so once and supervises anyway.
func TestNoNVMLLibraryStillSupervises(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.noNVML = true
	s.start()
	s.WaitLog("the unavailable notice", 1, 30*time.Second, msgContains("GPU metrics unavailable"))
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	if n := s.CountLogs(msgContains("GPU metrics unavailable")); n != 1 {
		t.Fatalf("said %d times that GPU metrics are unavailable, want once", n)
	}
}

// keeperOf finds the guard's keeper process (its child running __keeper).
func keeperOf(t *testing.T, guardPID int) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || !strings.Contains(string(cmdline), "__keeper") {
			continue
		}
		var state string
		var ppid int
		fmt.Sscan(string(stat[i+2:]), &state, &ppid)
		if ppid == guardPID {
			return pid
		}
	}
	t.Fatalf("no keeper under guard %d", guardPID)
	return 0
}

// The keeper is killed out from under vLLM: the API server and EngineCore
// survive it, holding GPU memory. The guard stops them (their process group
// outlives the keeper; what left it is killed by PID), waits for the
// memory, and starts again.
func TestSurvivorsOfAKilledKeeperAreKilledBeforeTheNextStart(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	s.extra = "\n[restart]\ninitial_delay = \"100ms\"\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)
	before := s.ours()
	keeper := keeperOf(t, s.Cmd.Process.Pid)
	if err := syscall.Kill(keeper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f := s.WaitEvent("the failure", 1, 10*time.Second, isExited)
	if f.Failure.Exit != "killed by SIGKILL" {
		t.Fatalf("exit %v, want the keeper's SIGKILL", f.Failure.Exit)
	}
	s.WaitEvent("ready again", 2, 30*time.Second, isReady)
	for _, pid := range before {
		if alive(pid) {
			t.Errorf("old vLLM process %d still alive after the restart", pid)
		}
	}
	if n := s.CountEvents(exitedWith("gpu_busy")); n != 0 {
		t.Fatal("the restart ran into the survivors' memory (gpu_busy)")
	}
}

func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}
