// Package testbin builds the project's real binaries for tests that run
// them as processes: the guard, the vLLM simulator and the stand-in NVML
// library. Tests never skip when a helper is missing: they build it here.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
	dir   string
)

// Root is the repository root (the folder holding go.mod).
func Root() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("testbin: no go.mod above %s", wd)
		}
	}
}

func outDir() (string, error) {
	if dir != "" {
		return dir, nil
	}
	d, err := os.MkdirTemp("", "vllm-guard-testbin-")
	if err != nil {
		return "", err
	}
	dir = d
	return d, nil
}

// Cleanup removes what this process built. Call it from TestMain.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
		dir = ""
		built = map[string]string{}
	}
}

func goBuild(name, pkg string, race bool) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	key := name
	if race {
		key += "-race"
	}
	if p, ok := built[key]; ok {
		return p, nil
	}
	root, err := Root()
	if err != nil {
		return "", err
	}
	out, err := outDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(out, key)
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -Wno-deprecated-declarations")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testbin: go build %s: %v\n%s", pkg, err, b)
	}
	built[key] = bin
	return bin, nil
}

// Guard builds cmd/vllm-guard with the race detector on.
func Guard() (string, error) { return goBuild("vllm-guard", "./cmd/vllm-guard", true) }

// GuardPlain builds cmd/vllm-guard without the race detector, as shipped:
// for benchmarks of its CPU and memory.
func GuardPlain() (string, error) { return goBuild("vllm-guard", "./cmd/vllm-guard", false) }

// FakeVLLM builds the vLLM simulator.
func FakeVLLM() (string, error) { return goBuild("fakevllm", "./internal/integration/fakevllm", false) }

// FakeNVML builds the stand-in libnvidia-ml.so.1 and returns the folder that
// holds it, ready for LD_LIBRARY_PATH.
func FakeNVML() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built["fakenvml"]; ok {
		return p, nil
	}
	root, err := Root()
	if err != nil {
		return "", err
	}
	out, err := outDir()
	if err != nil {
		return "", err
	}
	inc, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		return "", fmt.Errorf("testbin: locate go-nvml: %v", err)
	}
	libDir := filepath.Join(out, "fakenvml")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wno-deprecated-declarations",
		"-I", filepath.Join(strings.TrimSpace(string(inc)), "pkg", "nvml"),
		"-o", filepath.Join(libDir, "libnvidia-ml.so.1"),
		filepath.Join(root, "internal", "integration", "fakenvml", "fakenvml.c"))
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testbin: gcc fakenvml: %v\n%s", err, b)
	}
	built["fakenvml"] = libDir
	return libDir, nil
}
