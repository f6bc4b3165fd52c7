package realvllm

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// runToExit runs bin with args (no port: these runs must fail before
// they serve) and returns its exit code and its output's lines.
func runToExit(t *testing.T, bin string, env map[string]string, args ...string) (int, []string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(startBound, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer timer.Stop()
	var lines []string
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sc.Split(vllmlog.ScanLines)
	for sc.Scan() {
		lines = append(lines, vllmlog.StripANSI(sc.Text()))
	}
	_ = cmd.Wait()
	// Whatever it left behind (a worker) goes with it.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return cmd.ProcessState.ExitCode(), lines
}

// The CPU build refuses sleep mode and the weight cache (CUDA, ROCm and
// XPU only; CUDA and ROCm for IPC): the simulator as the CPU build
// (FAKEVLLM_DEVICE=cpu) must refuse them alike, with the same words, so
// that what the guard learns from the simulator holds on the real one.
// The three real runs go at once: the ipc_cache refusal comes only at
// the weights' load, after a whole engine start.
func TestCPUBuildRefusesSleepModeAndWeightCache(t *testing.T) {
	scenario(t, "the CPU build refuses sleep mode and ipc_cache; the simulator says the same")
	m := model("tiny-llama")
	common := []string{"--dtype", "float32", "--max-model-len", "4096", "--enforce-eager"}
	cases := []struct {
		name string
		args []string
		says string
	}{
		{"serve --enable-sleep-mode", append(append([]string{"serve", m}, common...), "--enable-sleep-mode"),
			"Value error, Sleep mode is not supported on current platform."},
		{"serve --load-format ipc_cache", append(append([]string{"serve", m}, common...), "--load-format", "ipc_cache"),
			"UnsupportedPlatformForIPCError: platform 'cpu' does not support CUDA IPC weight sharing; only CUDA and ROCm are supported. Use the default --load-format for this platform."},
		{"preload", append([]string{"preload", "--model", m}, common...),
			"UnsupportedPlatformForIPCError: platform 'cpu' does not support CUDA IPC weight sharing; only CUDA and ROCm are supported. Use the default --load-format for this platform."},
	}
	observe := func(bin string, env map[string]string) (map[string]string, map[string]time.Duration) {
		obs := map[string]string{}
		took := map[string]time.Duration{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range cases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				code, lines := runToExit(t, bin, env, c.args...)
				said := false
				for _, l := range lines {
					said = said || strings.Contains(l, c.says)
				}
				mu.Lock()
				defer mu.Unlock()
				took[c.name] = time.Since(start)
				obs[c.name+": exit code"] = fmt.Sprint(code)
				obs[c.name+": says why"] = fmt.Sprint(said)
				if !said {
					t.Logf("%s %s printed:\n%s", bin, c.name, strings.Join(lines[max(0, len(lines)-20):], "\n"))
				}
			}()
		}
		wg.Wait()
		return obs, took
	}
	start := time.Now()
	realObs, realTook := observe(real.vllm, vllmEnv(t.TempDir(), t.Name()))
	figure("cpu_refusals_wall_s", time.Since(start).Seconds())
	for name, d := range realTook {
		t.Logf("real vLLM %s refused after %.1f s", name, d.Seconds())
	}
	env := simEnv(t)
	env["FAKEVLLM_DEVICE"] = "cpu"
	simObs, _ := observe(real.fakevllm, env)
	for k, want := range map[string]string{"serve --enable-sleep-mode: exit code": "1", "preload: exit code": "1", "serve --load-format ipc_cache: exit code": "1"} {
		if realObs[k] != want {
			t.Errorf("real vLLM %s: %s, want %s", k, realObs[k], want)
		}
	}
	var diffs []string
	for k, v := range realObs {
		if simObs[k] != v {
			diffs = append(diffs, fmt.Sprintf("%-45s real: %-8s simulator: %s", k, v, simObs[k]))
		} else {
			t.Logf("agree  %-45s %s", k, v)
		}
	}
	if len(diffs) > 0 {
		t.Errorf("the simulator as the CPU build differs from vLLM %s:\n%s", real.version, strings.Join(diffs, "\n"))
	}
}
