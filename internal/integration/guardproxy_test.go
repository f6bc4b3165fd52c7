package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The same drill (concurrency 4 × max_num_seqs, long prompts) through the
// real guard: straight at vLLM's port it runs vLLM out of memory; through
// the guard's proxy nothing runs out, requests queue instead, and the drill
// passes. The arithmetic is the one of proxy_test.go's oomEnv, on the
// stand-in GPU (which also counts the API process's 256 MiB): 7 424 MiB of
// room; 32 running × (40 MiB + 125 MiB of prompt) = 5 280 MiB fits, the
// 128 admitted at once directly do not.
func TestDrillThroughTheGuardsProxy(t *testing.T) {
	t.Parallel()
	for _, through := range []string{"proxy", "direct"} {
		t.Run(through, func(t *testing.T) {
			t.Parallel()
			s := newScene(t)
			proxyPort := testkit.FreePort(t)
			for k, v := range oomEnv {
				s.env[k] = v
			}
			s.extra = fmt.Sprintf(`
[profile]
max_num_seqs = %d
gpu_memory_utilization = 0.9
min_gpu_memory_utilization = 0.9
[restart]
initial_delay = "300ms"
[gpu]
sample_interval = "100ms"
[proxy]
listen = "127.0.0.1:%d"
queue_size = 512
queue_timeout = "20s"
`, oomSeqs, proxyPort)
			s.start()
			s.WaitEvent("ready", 1, 30*time.Second, isReady)
			url := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
			if through == "direct" {
				url = fmt.Sprintf("http://127.0.0.1:%d", s.port)
			}
			report := filepath.Join(s.dir, "drill.json")
			cmd := exec.Command(bins.guard, "drill", "--url", url, "--model", "test-model",
				"--concurrency", fmt.Sprint(4*oomSeqs), "--prompt-tokens", "2000", "--max-tokens", "32",
				"--duration", "3s", "--socket", filepath.Join(s.dir, "guard.sock"), "--json", report)
			out, _ := cmd.CombinedOutput()
			ooms := s.CountEvents(exitedWith("oom"))
			switch through {
			case "proxy":
				if cmd.ProcessState.ExitCode() != 0 {
					t.Fatalf("drill through the proxy: exit %d, want 0 (PASS)\n%s", cmd.ProcessState.ExitCode(), out)
				}
				if ooms != 0 {
					t.Fatalf("%d OOMs through the proxy", ooms)
				}
				var rep map[string]any
				raw, _ := os.ReadFile(report)
				if err := json.Unmarshal(raw, &rep); err != nil {
					t.Fatalf("drill JSON: %v", err)
				}
				if rep["admission_engaged"] != true {
					t.Fatalf("admission did not engage: %s", raw)
				}
				// The status document carries the proxy's counters.
				st, err := exec.Command(bins.guard, "status", "--json", "--socket", filepath.Join(s.dir, "guard.sock")).Output()
				var doc struct {
					Proxy *struct {
						Admitted uint64 `json:"admitted"`
						Engaged  bool   `json:"engaged"`
					} `json:"proxy"`
				}
				if json.Unmarshal(st, &doc); doc.Proxy == nil || doc.Proxy.Admitted == 0 || !doc.Proxy.Engaged {
					t.Fatalf("status lacks the proxy's counters (%v): %s", err, st)
				}
			case "direct":
				// The exit is classified after the drill may have ended:
				// wait for it (bounded) rather than count what came so far.
				if ooms == 0 {
					s.WaitEvent("the OOM of the burst straight at vLLM", 1, 30*time.Second, exitedWith("oom"))
				}
			}
		})
	}
}
