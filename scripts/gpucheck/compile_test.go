// Package gpucheck tests scripts/cudalloc.c, the C program scripts/gpu-check.sh builds; this
// test makes sure it compiles with plain gcc (no CUDA headers) and that the
// script parses, on machines without a GPU.
package gpucheck

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCudallocCompiles(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cudalloc")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", bin, "../cudalloc.c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "usage: cudalloc DEVICE MIB HOLD_SECONDS") {
		t.Fatalf("no arguments: %v\n%s", err, out)
	}
}

func TestScriptParses(t *testing.T) {
	for _, s := range []string{"../gpu-check.sh", "../gpu-standby-check.sh"} {
		if out, err := exec.Command("bash", "-n", s).CombinedOutput(); err != nil {
			t.Fatalf("bash -n %s: %v\n%s", s, err, out)
		}
	}
}

// The standby measurements' dry run walks every step without a GPU: the
// script's plumbing (its functions, the order of the runs) holds.
func TestStandbyCheckDryRun(t *testing.T) {
	cmd := exec.Command("bash", "../gpu-standby-check.sh")
	cmd.Env = append(cmd.Environ(), "GPU_CHECK_DRY_RUN=1", "GPU_CHECK_MODEL=/models/tiny")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	for _, want := range []string{"vllm serve /models/tiny --port", "would run: vllm preload --model /models/tiny",
		"--load-format ipc_cache", "--enable-sleep-mode", "would POST /sleep?level=2", "gpu-standby-check: done"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
}

// Without a CUDA vLLM or a model it skips, saying so, and succeeds
// (scripts/gpu-check.sh calls it last).
func TestStandbyCheckSkipsWithoutModel(t *testing.T) {
	cmd := exec.Command("bash", "../gpu-standby-check.sh")
	cmd.Env = append(cmd.Environ(), "GPU_CHECK_MODEL=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "skipped: set GPU_CHECK_MODEL") {
		t.Fatalf("%v\n%s", err, out)
	}
}
