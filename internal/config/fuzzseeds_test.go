package config

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// tomlFixtures is every TOML the repository ships or tests with: the
// reference file, config/testdata, the examples, and the config embedded in
// the Kubernetes example (the block under "vllm-guard.toml: |").
func tomlFixtures(tb testing.TB) map[string][]byte {
	tb.Helper()
	out := map[string][]byte{}
	var paths []string
	for _, pattern := range []string{filepath.Join("..", "..", "*.toml"), filepath.Join("testdata", "*.toml"), filepath.Join("..", "..", "examples", "*.toml")} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			tb.Fatal(err)
		}
		paths = append(paths, m...)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		out[p] = b
	}
	yamls, _ := filepath.Glob(filepath.Join("..", "..", "examples", "kubernetes", "*.yaml"))
	for _, p := range yamls {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		if block := embeddedTOML(string(b)); block != "" {
			out[p] = []byte(block)
		}
	}
	if len(out) < 4 {
		tb.Fatalf("found only %d TOML fixtures: the globs are out of date", len(out))
	}
	return out
}

// embeddedTOML returns the literal block under a "vllm-guard.toml: |" key,
// de-indented.
func embeddedTOML(yaml string) string {
	lines := strings.Split(yaml, "\n")
	for i, l := range lines {
		if !strings.HasSuffix(strings.TrimSpace(l), "vllm-guard.toml: |") {
			continue
		}
		keyIndent := len(l) - len(strings.TrimLeft(l, " "))
		var b strings.Builder
		indent := -1
		for _, body := range lines[i+1:] {
			n := len(body) - len(strings.TrimLeft(body, " "))
			if strings.TrimSpace(body) != "" && n <= keyIndent {
				break
			}
			if indent < 0 && strings.TrimSpace(body) != "" {
				indent = n
			}
			if len(body) >= indent && indent >= 0 {
				body = body[indent:]
			}
			b.WriteString(body + "\n")
		}
		return b.String()
	}
	return ""
}

// Every shipped example loads: a fixture that stops loading is a broken
// example, not just a weaker seed.
func TestTOMLFixturesLoad(t *testing.T) {
	dir := t.TempDir()
	for name, b := range tomlFixtures(t) {
		p := filepath.Join(dir, filepath.Base(name)+".toml")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// maxSeedBytes bounds one FuzzLoad seed. Go's fuzzer minimizes each input
// that finds new coverage by trying to delete every byte range of it:
// quadratic in its length. Inputs grow from the seeds, so a seed of a few
// KB (the commented reference file is 6.7 KB) made every new input spend
// the whole minimization budget (60 s) and the target ran ~0.4 executions
// a second.
const maxSeedBytes = 512

// fuzzLoadSeeds is the fixtures cut into small seeds: comment-only and
// blank lines dropped (the reference file is mostly prose), then one seed
// per table (its header and keys), plus hand-written inputs for the
// syntax the fixtures do not use.
func fuzzLoadSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	seen := map[string]bool{}
	var out [][]byte
	add := func(s string) {
		if strings.TrimSpace(s) != "" && !seen[s] {
			seen[s] = true
			out = append(out, []byte(s))
		}
	}
	names := make([]string, 0)
	fixtures := tomlFixtures(tb)
	for name := range fixtures {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, piece := range tablePieces(string(fixtures[name])) {
			add(piece)
		}
	}
	add("[vllm]\nport = \"8000\"\nstop_timeout = 5\n[profile]\nMax_Num_Seqs = 4\n")
	add("a.\"b\\u0041\".'c' = [1, {x = \"\"\"\n\"\"\"}]\n[[t]]\n")
	add("# a comment\n[log] # trailing\nchild_lines = 10 # ten\n")
	add("[readiness]\npoll_interval = \"1ns\"\n[gpu]\nsample_interval = \"1h\"\n")
	// Secrets check prints as *** (the round trip accounts for the mask):
	// an env name with KEY in it, --api-key, a webhook's credentials.
	add("[vllm]\nenv = { MY_KEY = \"x\" }\n")
	add("[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"--api-key\", \"s\"]\n")
	add("[alerts]\nwebhook = \"https://u:p@hooks.example/x\"\n")
	// Just past prescan's bounds (nesting, dotted parts), and brackets it
	// must skip inside strings and comments.
	add("[vllm]\nenv = " + strings.Repeat("{a = ", maxNesting+1) + "1" + strings.Repeat("}", maxNesting+1) + "\n")
	add("[vllm]\nenv." + strings.Repeat("a.", maxKeyParts) + "b = \"x\"\n")
	add(`[vllm]
command = ["{[\"", '{[', """{[""""", '''[{'''''] # {[
`)
	return out
}

// tablePieces splits a TOML text before each table header, without
// comment-only or blank lines. A multi-line string is kept whole.
func tablePieces(src string) []string {
	var pieces []string
	var b strings.Builder
	inMulti := false
	for _, line := range strings.SplitAfter(src, "\n") {
		trim := strings.TrimSpace(line)
		if !inMulti {
			if trim == "" || strings.HasPrefix(trim, "#") {
				continue
			}
			if strings.HasPrefix(trim, "[") && b.Len() > 0 {
				pieces = append(pieces, b.String())
				b.Reset()
			}
		}
		b.WriteString(line)
		if n := strings.Count(line, `"""`) + strings.Count(line, "'''"); n%2 == 1 {
			inMulti = !inMulti
		}
	}
	if b.Len() > 0 {
		pieces = append(pieces, b.String())
	}
	return pieces
}

// The seeds stay small, and together they still write every key the
// fixtures write: cutting them up lost no coverage of the schema.
func TestFuzzLoadSeedsAreSmallAndCoverTheFixtures(t *testing.T) {
	seeds := fuzzLoadSeeds(t)
	covered := map[string]bool{}
	for _, s := range seeds {
		if len(s) > maxSeedBytes {
			t.Errorf("a FuzzLoad seed is %d bytes, over %d: the fuzzer's minimizer is quadratic in an input's length; cut it up in fuzzLoadSeeds:\n%s", len(s), maxSeedBytes, s)
		}
		for k := range scanPositions(string(s)) {
			covered[k] = true
		}
	}
	for name, b := range tomlFixtures(t) {
		for k := range scanPositions(string(b)) {
			if !covered[k] {
				t.Errorf("%s writes %s, which no FuzzLoad seed writes", name, strings.ReplaceAll(k, keySep, "."))
			}
		}
	}
}
