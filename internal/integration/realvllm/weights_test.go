package realvllm

import (
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
	"github.com/vllm-guard/vllm-guard/internal/weightcache"
)

// The weight cache daemon's command as the guard derives it from vLLM's
// (internal/weightcache) is one the real `vllm preload` takes: every flag
// parses, and the CPU build goes on to its platform refusal, the first
// thing it does after reading its arguments (a GPU would load there).
func TestRealPreloadTakesTheGuardsCommand(t *testing.T) {
	scenario(t, "the daemon's command the guard derives parses in the real vllm preload")
	dir := t.TempDir()
	a, err := vllmargs.Parse([]string{"vllm", "serve", model("tiny-llama"), "--dtype", "float32", "--max-model-len", "4096",
		"--enforce-eager", "--load-format", "ipc_cache", "-tp", "1", "--trust-remote-code", "--download-dir", dir,
		"--model-loader-extra-config", `{"socket_dir": "` + dir + `"}`}, nil, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	argv, err := weightcache.PreloadArgv(a)
	if err != nil {
		t.Fatal(err)
	}
	argv = append(argv, "--weight-cache-health-port", "0", "--weight-cache-health-host", "127.0.0.1")
	code, lines := runToExit(t, real.vllm, vllmEnv(dir, t.Name()), argv[1:]...)
	out := strings.Join(lines, "\n")
	if code != 1 || !strings.Contains(out, "UnsupportedPlatformForIPCError: platform 'cpu' does not support CUDA IPC weight sharing") {
		t.Fatalf("vllm %s: exit %d, want 1 with the platform refusal (the arguments taken); it printed:\n%s",
			strings.Join(argv[1:], " "), code, lines[max(0, len(lines)-20):])
	}
}
