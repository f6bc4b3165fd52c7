package config

import (
	"os"
	"path/filepath"
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
	for _, pattern := range []string{filepath.Join("..", "*.toml"), filepath.Join("testdata", "*.toml"), filepath.Join("..", "examples", "*.toml")} {
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
	yamls, _ := filepath.Glob(filepath.Join("..", "examples", "kubernetes", "*.yaml"))
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
