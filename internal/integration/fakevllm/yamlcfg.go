package main

import (
	"fmt"
	"os"
	"strings"
)

// The subset of YAML that vLLM's --config files use in practice: flat
// "key: value" pairs, flow lists "key: [a, b]", block lists ("key:" then
// "  - a" lines), quoted scalars and # comments. Anything else (nested
// maps, anchors, multi-line scalars) is an error naming the line.

type yamlEntry struct {
	key    string
	values []string
	list   bool
}

func readConfigFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return data, nil
}

func parseYAMLSubset(data []byte) ([]yamlEntry, error) {
	var out []yamlEntry
	var open *yamlEntry // a "key:" waiting for block list items
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimRight(stripYAMLComment(raw), " \t\r")
		if strings.TrimSpace(line) == "" || strings.TrimSpace(line) == "---" {
			continue
		}
		trimmed := strings.TrimSpace(line)
		if item, ok := strings.CutPrefix(trimmed, "- "); ok || trimmed == "-" {
			if open == nil {
				return nil, fmt.Errorf("line %d: a list item without a key above it", i+1)
			}
			open.values = append(open.values, yamlScalar(item))
			continue
		}
		if line != trimmed {
			return nil, fmt.Errorf("line %d: %q: nested mappings are not supported; write flat keys", i+1, trimmed)
		}
		key, value, ok := strings.Cut(line, ":")
		key = strings.TrimSpace(key)
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			return nil, fmt.Errorf("line %d: %q is not \"key: value\"", i+1, trimmed)
		}
		value = strings.TrimSpace(value)
		if open != nil && open.list && len(open.values) == 0 {
			return nil, fmt.Errorf("key %q has no value", open.key)
		}
		out = append(out, yamlEntry{key: key})
		e := &out[len(out)-1]
		open = nil
		switch {
		case value == "":
			e.list = true
			open = e
		case strings.HasPrefix(value, "["):
			if !strings.HasSuffix(value, "]") {
				return nil, fmt.Errorf("line %d: flow list %q does not end with ]", i+1, value)
			}
			e.list = true
			inner := strings.TrimSpace(value[1 : len(value)-1])
			if inner != "" {
				for _, item := range strings.Split(inner, ",") {
					e.values = append(e.values, yamlScalar(strings.TrimSpace(item)))
				}
			}
		default:
			e.values = []string{yamlScalar(value)}
		}
	}
	if open != nil && len(open.values) == 0 {
		return nil, fmt.Errorf("key %q has no value", open.key)
	}
	return out, nil
}

// stripYAMLComment drops a " #" comment outside quotes.
func stripYAMLComment(s string) string {
	var quote rune
	for i, c := range s {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return s[:i]
		}
	}
	return s
}

func yamlScalar(s string) string {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && (s[0] == '"' && s[len(s)-1] == '"' || s[0] == '\'' && s[len(s)-1] == '\'') {
		return s[1 : len(s)-1]
	}
	return s
}
