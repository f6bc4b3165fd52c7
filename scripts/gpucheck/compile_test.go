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
	if out, err := exec.Command("bash", "-n", "../gpu-check.sh").CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
}
