package launch

import (
	"slices"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/policy"
)

func TestBuildArgvReplacesProfileFlags(t *testing.T) {
	r := policy.Rung{MaxNumSeqs: 128, GPUMemoryUtilization: 0.8}
	cases := []struct {
		name    string
		command []string
		extra   []string
		want    string
		ep      Endpoint
	}{
		{"adds everything", []string{"vllm", "serve", "m"}, nil,
			"vllm serve m --max-num-seqs 128 --gpu-memory-utilization 0.8 --host 127.0.0.1 --port 8000", Endpoint{"127.0.0.1", 8000}},
		{"replaces operator's profile flags, both spellings", []string{"vllm", "serve", "m", "--max-num-seqs", "512", "--gpu-memory-utilization=0.95", "--enforce-eager"}, nil,
			"vllm serve m --enforce-eager --max-num-seqs 128 --gpu-memory-utilization 0.8 --host 127.0.0.1 --port 8000", Endpoint{"127.0.0.1", 8000}},
		{"keeps the operator's host and port", []string{"vllm", "serve", "m", "--port", "9000", "--host=0.0.0.0"}, nil,
			"vllm serve m --port 9000 --host=0.0.0.0 --max-num-seqs 128 --gpu-memory-utilization 0.8", Endpoint{"127.0.0.1", 9000}},
		// vLLM reads an unambiguous abbreviation as its flag (issue 32 item 3).
		{"abbreviations, as vLLM reads them", []string{"vllm", "serve", "m", "--por", "9000", "--max-num-se", "4", "--gpu_mem=0.9"}, nil,
			"vllm serve m --por 9000 --max-num-seqs 128 --gpu-memory-utilization 0.8 --host 127.0.0.1", Endpoint{"127.0.0.1", 9000}},
		{"extra args after --, profile flags there too", []string{"vllm", "serve", "m"}, []string{"--max-model-len", "4096", "--max-num-seqs=1"},
			"vllm serve m --max-model-len 4096 --max-num-seqs 128 --gpu-memory-utilization 0.8 --host 127.0.0.1 --port 8000", Endpoint{"127.0.0.1", 8000}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			argv, ep := BuildArgv(c.command, c.extra, r, "127.0.0.1", 8000)
			if got := strings.Join(argv, " "); got != c.want {
				t.Errorf("argv\n got %s\nwant %s", got, c.want)
			}
			if ep != c.ep {
				t.Errorf("endpoint %+v, want %+v", ep, c.ep)
			}
		})
	}
}

// With --kv-cache-memory-bytes the rung's bytes replace the operator's
// (in the command or after --, either spelling); without bytes on the rung
// the operator's flag stays as written.
func TestBuildArgvOwnsKVCacheBytes(t *testing.T) {
	r := policy.Rung{MaxNumSeqs: 128, GPUMemoryUtilization: 0.8, KVCacheMemoryBytes: 18 << 30}
	argv, _ := BuildArgv([]string{"vllm", "serve", "m", "--kv-cache-memory-bytes", "20G"}, []string{"--kv_cache_memory_bytes=21G"}, r, "127.0.0.1", 8000)
	want := "vllm serve m --max-num-seqs 128 --gpu-memory-utilization 0.8 --kv-cache-memory-bytes 19327352832 --host 127.0.0.1 --port 8000"
	if got := strings.Join(argv, " "); got != want {
		t.Errorf("argv\n got %s\nwant %s", got, want)
	}
	r.KVCacheMemoryBytes = 0
	argv, _ = BuildArgv([]string{"vllm", "serve", "m", "--kv-cache-memory-bytes", "20G"}, nil, r, "127.0.0.1", 8000)
	if !slices.Contains(argv, "20G") {
		t.Errorf("operator's flag dropped with no bytes on the rung: %q", argv)
	}
}

func TestChildEnvDropsGuardOnlyVariables(t *testing.T) {
	env := ChildEnv([]string{"PATH=/bin", "NOTIFY_SOCKET=/run/x", "WATCHDOG_USEC=1000", "WATCHDOG_PID=1", "HF_HOME=/a"},
		map[string]string{"HF_HOME": "/b", "CUDA_VISIBLE_DEVICES": "1", "NOTIFY_SOCKET": "/evil"})
	slices.Sort(env)
	want := []string{"CUDA_VISIBLE_DEVICES=1", "HF_HOME=/b", "PATH=/bin"}
	if !slices.Equal(env, want) {
		t.Fatalf("env %q, want %q", env, want)
	}
}

// vLLM starts with its startup plan on, unless the operator said otherwise
// (in [vllm] env or the guard's own environment, "0" included).
func TestVLLMEnvTurnsTheStartupPlanOn(t *testing.T) {
	has := func(env []string, kv string) bool { return slices.Contains(env, kv) }
	if env := VLLMEnv([]string{"PATH=/bin"}, nil); !has(env, "VLLM_ENABLE_STARTUP_PLAN=1") {
		t.Fatalf("not set: %q", env)
	}
	env := VLLMEnv([]string{"PATH=/bin"}, map[string]string{"VLLM_ENABLE_STARTUP_PLAN": "0"})
	if !has(env, "VLLM_ENABLE_STARTUP_PLAN=0") || has(env, "VLLM_ENABLE_STARTUP_PLAN=1") {
		t.Fatalf("[vllm] env says 0: %q", env)
	}
	env = VLLMEnv([]string{"PATH=/bin", "VLLM_ENABLE_STARTUP_PLAN=0"}, nil)
	if !has(env, "VLLM_ENABLE_STARTUP_PLAN=0") || has(env, "VLLM_ENABLE_STARTUP_PLAN=1") {
		t.Fatalf("the guard's environment says 0: %q", env)
	}
}
