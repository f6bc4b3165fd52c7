package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/vllm-guard/vllm-guard/"

// testOnly is the level of design.md's row "tests": packages that only
// _test.go files import, from any level.
const testOnly = -1

// testKitReach is the highest level a test-only package may import: the
// records everyone shares (internal/events, the stream a scene reads).
const testKitReach = 4

// levels reads design.md's table of which package may import which: each
// row a level and its packages; a package imports only from lower levels.
// The row "tests" holds the test-only packages (level testOnly).
func levels(t *testing.T) map[string]int {
	t.Helper()
	md := read(t, "design.md")
	_, table, ok := strings.Cut(md, "## Which package may import which")
	if !ok {
		t.Fatal("design.md has no section \"Which package may import which\"")
	}
	if i := strings.Index(table, "\n## "); i >= 0 {
		table = table[:i]
	}
	row := regexp.MustCompile("^\\| (\\d+|tests) \\|([^|]*)\\|")
	pkg := regexp.MustCompile("`([a-z0-9/_-]+)`")
	out := map[string]int{}
	for _, line := range strings.Split(table, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n := testOnly
		if m[1] != "tests" {
			n, _ = strconv.Atoi(m[1])
		}
		for _, p := range pkg.FindAllStringSubmatch(m[2], -1) {
			if _, dup := out[p[1]]; dup {
				t.Errorf("design.md names %s at two levels", p[1])
			}
			out[p[1]] = n
		}
	}
	if len(out) == 0 {
		t.Fatal("design.md's import table has no rows")
	}
	return out
}

type listed struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
}

// The import arrows point down: every package of the guard is in
// design.md's table, and its code and tests import only packages of a
// lower level (an arrow that points up, or a new package left out of the
// table, fails here); only the wiring imports the supervisor; test-only
// packages are imported by tests alone and import only the standard
// library, goleak and the shared records.
func TestImportsPointDown(t *testing.T) {
	lv := levels(t)
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", "./cmd/...", "./internal/...")
	cmd.Dir = filepath.Join("..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bufio.NewReader(bytes.NewReader(out)))
	// Only the wiring builds and runs the supervisor; everyone else reads
	// its state from internal/status.
	wiring := map[string]bool{"internal/guard": true, "cmd/vllm-guard": true}
	seen := 0
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		seen++
		name := strings.TrimPrefix(p.ImportPath, module)
		from, ok := lv[name]
		if !ok {
			t.Errorf("%s is not in design.md's table of which package may import which: give it a level", name)
			continue
		}
		if from == testOnly {
			// A test-only package imports the standard library, goleak, and
			// of ours only the shared records (up to testKitReach): a test
			// kit reads what the guard says, it never runs the guard's parts.
			for _, imp := range p.Imports {
				dep, ours := strings.CutPrefix(imp, module)
				if ours {
					if level, listed := lv[dep]; !listed || level > testKitReach {
						t.Errorf("%s is for tests only and imports %s: of ours it may import only packages of level %d or lower", name, dep, testKitReach)
					}
					continue
				}
				if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") && imp != "go.uber.org/goleak" {
					t.Errorf("%s is for tests only and imports %s: it may import only the standard library and goleak", name, imp)
				}
			}
		}
		for _, imp := range p.Imports {
			dep, ours := strings.CutPrefix(imp, module)
			if level, listed := lv[dep]; ours && listed && level == testOnly {
				t.Errorf("%s imports %s outside its tests: only _test.go files may", name, dep)
			}
		}
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours || dep == name {
				continue
			}
			to, ok := lv[dep]
			if !ok {
				continue // reported for its own package
			}
			if to == testOnly {
				continue // a test's import, allowed from any level (a non-test one is reported above)
			}
			if from == testOnly {
				continue // checked above against testKitReach
			}
			if dep == "internal/supervisor" && !wiring[name] {
				t.Errorf("%s imports internal/supervisor: only the wiring (internal/guard, cmd/vllm-guard) may; read the state from internal/status", name)
			}
			if to >= from {
				t.Errorf("%s (level %d) imports %s (level %d): an arrow that does not point down", name, from, dep, to)
			}
		}
	}
	if seen < 20 {
		t.Fatalf("go list found %d packages; want the guard's", seen)
	}
}
