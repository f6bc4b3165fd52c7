package vllmargs

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yamlEntry is one top-level key of a --config file, turned into the
// arguments vLLM inserts for it.
type yamlEntry struct {
	key    string   // the flag's name without dashes ("no-" prefixed for false)
	values []string // a scalar is one value; a list its items; true or false none
}

// maxConfigBytes bounds a --config file the guard reads: vLLM's configs
// are a few hundred bytes, and a YAML bomb must not grow the guard.
const maxConfigBytes = 1 << 20

// parseYAML reads a --config file the way vLLM's FlexibleArgumentParser
// turns it into arguments (its load_config_file): every top-level key is a
// flag, in the file's order; true is the bare flag, false its --no- form,
// a list the flag then each item, a nested map (a compilation or
// speculative config) the flag then the map as JSON, anything else the
// flag then the value as Python's str() prints it.
func parseYAML(data []byte) ([]yamlEntry, error) {
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("the file is larger than %d bytes; vLLM's configs are a few lines", maxConfigBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("not YAML vLLM can read: %v", err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil // an empty file: no arguments
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the file must be a map of \"key: value\" lines, as vLLM's --config is", root.Line)
	}
	var out []yamlEntry
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			return nil, fmt.Errorf("line %d: a key must be a flag's name", k.Line)
		}
		if v.Kind == yaml.AliasNode {
			v = v.Alias
		}
		e := yamlEntry{key: k.Value}
		switch v.Kind {
		case yaml.ScalarNode:
			switch {
			case v.Tag == "!!bool":
				if b, _ := strconv.ParseBool(strings.ToLower(v.Value)); !b {
					e.key = "no-" + k.Value
				}
			default:
				e.values = []string{pyStr(v)}
			}
		case yaml.SequenceNode:
			for _, it := range v.Content {
				if it.Kind == yaml.AliasNode {
					it = it.Alias
				}
				if it.Kind == yaml.ScalarNode {
					e.values = append(e.values, pyStr(it))
					continue
				}
				s, err := nodeJSON(it, 0)
				if err != nil {
					return nil, err
				}
				e.values = append(e.values, s)
			}
		case yaml.MappingNode:
			s, err := nodeJSON(v, 0)
			if err != nil {
				return nil, err
			}
			e.values = []string{s}
		default:
			return nil, fmt.Errorf("line %d: %s has a value vLLM cannot read", v.Line, k.Value)
		}
		out = append(out, e)
	}
	return out, nil
}

// pyStr is a scalar as Python's str() prints what yaml.safe_load made of it.
func pyStr(n *yaml.Node) string {
	switch n.Tag {
	case "!!null":
		return "None"
	case "!!bool":
		if b, _ := strconv.ParseBool(strings.ToLower(n.Value)); b {
			return "True"
		}
		return "False"
	}
	return n.Value
}

// maxDepth bounds the nesting of a map in a --config file.
const maxDepth = 32

// nodeJSON renders a YAML value as json.dumps does (", " and ": "
// separators, the file's key order).
func nodeJSON(n *yaml.Node, depth int) (string, error) {
	if depth > maxDepth {
		return "", fmt.Errorf("line %d: nested more than %d deep", n.Line, maxDepth)
	}
	if n.Kind == yaml.AliasNode {
		// Aliases could expand without bound (a YAML bomb): vLLM's
		// configs have none.
		return "", fmt.Errorf("line %d: YAML aliases are not read in a --config file; write the value out", n.Line)
	}
	var b strings.Builder
	switch n.Kind {
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "null", nil
		case "!!bool":
			if b, _ := strconv.ParseBool(strings.ToLower(n.Value)); b {
				return "true", nil
			}
			return "false", nil
		case "!!int":
			if i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err == nil {
				return strconv.FormatInt(i, 10), nil
			}
		case "!!float":
			if f, err := strconv.ParseFloat(n.Value, 64); err == nil {
				return strconv.FormatFloat(f, 'g', -1, 64), nil
			}
		}
		return strconv.Quote(n.Value), nil
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, it := range n.Content {
			if i > 0 {
				b.WriteString(", ")
			}
			s, err := nodeJSON(it, depth+1)
			if err != nil {
				return "", err
			}
			b.WriteString(s)
		}
		b.WriteByte(']')
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Quote(n.Content[i].Value))
			b.WriteString(": ")
			s, err := nodeJSON(n.Content[i+1], depth+1)
			if err != nil {
				return "", err
			}
			b.WriteString(s)
		}
		b.WriteByte('}')
	default:
		return "", fmt.Errorf("line %d: a value vLLM cannot read", n.Line)
	}
	return b.String(), nil
}
