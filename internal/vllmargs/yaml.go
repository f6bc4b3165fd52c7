package vllmargs

import (
	"fmt"
	"strings"
)

// yamlEntry is one top-level key of a --config file.
type yamlEntry struct {
	key     string
	values  []string // a scalar is one value; a list many; true is none
	isFalse bool     // "key: false": vLLM drops the flag
}

// parseYAML reads the YAML that vLLM's --config files use: flat
// "key: value" pairs, flow lists "key: [a, b]", block lists ("key:" then
// "- a" lines), quoted scalars, # comments. Nested maps and multi-line
// scalars are errors naming the line, so a file the guard cannot read is
// never silently half-read.
func parseYAML(data []byte) ([]yamlEntry, error) {
	var out []yamlEntry
	open := -1 // index of a "key:" waiting for block list items
	for n, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimRight(stripComment(raw), " \t\r")
		if strings.TrimSpace(line) == "" || strings.TrimSpace(line) == "---" {
			continue
		}
		trimmed := strings.TrimLeft(line, " \t")
		indented := len(trimmed) < len(line)
		if strings.HasPrefix(trimmed, "- ") || trimmed == "-" {
			if open < 0 {
				return nil, fmt.Errorf("line %d: a list item with no key above it", n+1)
			}
			v, err := scalar(strings.TrimSpace(strings.TrimPrefix(trimmed, "-")))
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", n+1, err)
			}
			out[open].values = append(out[open].values, v)
			continue
		}
		if indented {
			return nil, fmt.Errorf("line %d: nested keys are not supported in vLLM's --config; write flat \"key: value\" lines", n+1)
		}
		key, val, ok := strings.Cut(trimmed, ":")
		key = strings.TrimSpace(key)
		if !ok || key == "" || strings.ContainsAny(key, " \t\"'") {
			return nil, fmt.Errorf("line %d: %q is not a \"key: value\" line", n+1, trimmed)
		}
		val = strings.TrimSpace(val)
		e := yamlEntry{key: key}
		open = -1
		switch {
		case val == "":
			open = len(out)
		case strings.HasPrefix(val, "["):
			if !strings.HasSuffix(val, "]") {
				return nil, fmt.Errorf("line %d: the list of %s has no closing ]", n+1, key)
			}
			inner := strings.TrimSpace(val[1 : len(val)-1])
			if inner != "" {
				for _, part := range splitFlow(inner) {
					v, err := scalar(strings.TrimSpace(part))
					if err != nil {
						return nil, fmt.Errorf("line %d: %v", n+1, err)
					}
					e.values = append(e.values, v)
				}
			}
		case val == "{}" || strings.HasPrefix(val, "{"):
			return nil, fmt.Errorf("line %d: %s is a map; the guard reads only flat keys of vLLM's --config", n+1, key)
		case val == "|" || val == ">" || strings.HasPrefix(val, "|") || strings.HasPrefix(val, ">"):
			return nil, fmt.Errorf("line %d: %s is a multi-line scalar; write it on one line", n+1, key)
		default:
			v, err := scalar(val)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", n+1, err)
			}
			switch strings.ToLower(v) {
			case "true":
				if !isQuoted(val) {
					v = ""
					e.values = nil
					out = append(out, e)
					continue
				}
			case "false":
				if !isQuoted(val) {
					e.isFalse = true
					out = append(out, e)
					continue
				}
			}
			e.values = []string{v}
		}
		out = append(out, e)
	}
	return out, nil
}

func isQuoted(s string) bool { return strings.HasPrefix(s, `"`) || strings.HasPrefix(s, "'") }

// stripComment removes a # comment that is not inside quotes.
func stripComment(s string) string {
	var q byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case q != 0:
			if c == q {
				q = 0
			}
		case c == '"' || c == '\'':
			q = c
		case c == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return s[:i]
		}
	}
	return s
}

// splitFlow splits a flow list's inside on commas outside quotes.
func splitFlow(s string) []string {
	var out []string
	var q byte
	from := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case q != 0:
			if c == q {
				q = 0
			}
		case c == '"' || c == '\'':
			q = c
		case c == ',':
			out = append(out, s[from:i])
			from = i + 1
		}
	}
	return append(out, s[from:])
}

// scalar unquotes a YAML scalar.
func scalar(s string) (string, error) {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') {
		if s[len(s)-1] != s[0] {
			return "", fmt.Errorf("unterminated quote in %s", s)
		}
		inner := s[1 : len(s)-1]
		if s[0] == '\'' {
			return strings.ReplaceAll(inner, "''", "'"), nil
		}
		r := strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\n`, "\n", `\t`, "\t")
		return r.Replace(inner), nil
	}
	if s != "" && (s[0] == '"' || s[0] == '\'') {
		return "", fmt.Errorf("unterminated quote in %s", s)
	}
	return s, nil
}
