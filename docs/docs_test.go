// Package docs holds the tests that keep the README and docs/ honest: every
// relative link resolves (the file, and the heading of an #anchor), every
// `make` target they name exists, and docs/configuration.md covers every key
// of the example vllm-guard.toml; every Go name and repository path they
// write exists (names_test.go); design.md's import levels hold
// (layers_test.go); no waiting test sleeps (nosleep_test.go).
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// pages are the README and every page in docs/, relative to the repository.
func pages(t *testing.T) []string {
	t.Helper()
	ps, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join("..", "README.md")}, ps...)
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	fenceRE    = regexp.MustCompile("(?ms)^```.*?^```[^\n]*$")
	codeSpanRE = regexp.MustCompile("`+[^`\n]*`+")
	linkRE     = regexp.MustCompile(`\[[^\]\n]*\]\(([^)\s]+)\)`)
	headingRE  = regexp.MustCompile(`(?m)^#{1,6} (.+?)\s*$`)
	slugDropRE = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// prose is text without its code: fenced blocks and code spans.
func prose(text string) string {
	return codeSpanRE.ReplaceAllString(fenceRE.ReplaceAllString(text, ""), "")
}

// anchors are the ids GitHub gives the headings of a Markdown text:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range headingRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(text, ""), -1) {
		s := strings.ToLower(strings.ReplaceAll(m[1], "`", ""))
		s = strings.ReplaceAll(slugDropRE.ReplaceAllString(s, ""), " ", "-")
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func TestRelativeLinksResolve(t *testing.T) {
	for _, page := range pages(t) {
		text := read(t, page)
		links := linkRE.FindAllStringSubmatch(prose(text), -1)
		if len(links) == 0 {
			t.Errorf("%s links to nothing: a page of the docs links back at least to the README", page)
		}
		for _, m := range links {
			target := m[1]
			if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
				continue // http:, https:, mailto:
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q: %s does not exist; fix the link or restore the file", page, target, file)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			if !anchors(read(t, file))[anchor] {
				t.Errorf("%s: link %q: %s has no heading whose anchor is #%s", page, target, file, anchor)
			}
		}
	}
}

func TestMakeTargetsExist(t *testing.T) {
	makefile := read(t, filepath.Join("..", "Makefile"))
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+):([^=]|$)`).FindAllStringSubmatch(makefile, -1) {
		targets[m[1]] = true
	}
	makeRE := regexp.MustCompile("(?:^|[\\s;&|(`])make ([a-z][a-z0-9-]*)")
	named := 0
	for _, page := range pages(t) {
		text := read(t, page)
		code := strings.Join(append(fenceRE.FindAllString(text, -1), codeSpanRE.FindAllString(text, -1)...), "\n")
		for _, m := range makeRE.FindAllStringSubmatch(code, -1) {
			named++
			if !targets[m[1]] {
				t.Errorf("%s names `make %s`, but the Makefile has no target %s", page, m[1], m[1])
			}
		}
	}
	if named == 0 {
		t.Error("no page names a make target: the README's quick start names make demo and make test")
	}
}

// TestConfigurationCoversTheExample: every key the example writes is in its
// table's section of docs/configuration.md, as `key = default`.
func TestConfigurationCoversTheExample(t *testing.T) {
	var v map[string]any
	md, err := toml.DecodeFile(filepath.Join("..", "vllm-guard.toml"), &v)
	if err != nil {
		t.Fatal(err)
	}
	doc := read(t, "configuration.md")
	sections := map[string]string{}
	parts := regexp.MustCompile("(?m)^## `\\[([^\\]]+)\\]`$").FindAllStringSubmatchIndex(doc, -1)
	for i, p := range parts {
		end := len(doc)
		if i+1 < len(parts) {
			end = parts[i+1][0]
		}
		sections[doc[p[2]:p[3]]] = doc[p[1]:end]
	}
	var missing []string
	for _, k := range md.Keys() {
		if len(k) < 2 {
			continue // a table
		}
		table, key := strings.Join(k[:len(k)-1], "."), k[len(k)-1]
		if len(k) > 2 { // a key of an inline table: its table's key
			table, key = k[0], k[1]
		}
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + ` = `).MatchString(sections[table]) {
			missing = append(missing, "["+table+"] "+key)
		}
	}
	slices.Sort(missing)
	for _, m := range slices.Compact(missing) {
		t.Errorf("docs/configuration.md has no %s under ## `[%s]`: add the key with its default and what it does", m, strings.Trim(strings.Fields(m)[0], "[]"))
	}
	if len(sections) == 0 {
		t.Error("docs/configuration.md has no ## `[table]` sections")
	}
}
