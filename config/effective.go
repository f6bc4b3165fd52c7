package config

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ServedModelName is the name /v1/models must list: served_model_name, else
// the first value of --served-model-name in the command, else the model
// (the argument after "serve", or --model).
func (c *Config) ServedModelName() string {
	if c.VLLM.ServedModelName != "" {
		return c.VLLM.ServedModelName
	}
	args := c.VLLM.Command
	if v := flagValue(args, "--served-model-name"); v != "" {
		return v
	}
	for i := 1; i < len(args)-1; i++ {
		if args[i] == "serve" && !strings.HasPrefix(args[i+1], "-") {
			return args[i+1]
		}
	}
	return flagValue(args, "--model")
}

func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// WriteEffective writes every setting, defaults included, as TOML that Load
// reads back to the same Config: what `vllm-guard check` prints.
func (c *Config) WriteEffective(w io.Writer) error {
	var b strings.Builder
	from := "built-in defaults"
	if c.Path != "" {
		from = c.Path
		if abs, err := filepath.Abs(c.Path); err == nil {
			from = abs
		}
	}
	fmt.Fprintf(&b, "# effective configuration (from %s; defaults included)\n", from)
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name := tomlName(t.Field(i))
		if name == "" || t.Field(i).Type.Kind() != reflect.Struct {
			continue
		}
		fmt.Fprintf(&b, "\n[%s]\n", name)
		sv := v.Field(i)
		st := sv.Type()
		width := 0
		for _, n := range tomlFields(st) {
			width = max(width, len(n))
		}
		for j := range st.NumField() {
			key := tomlName(st.Field(j))
			if key == "" {
				continue
			}
			fmt.Fprintf(&b, "%-*s = %s\n", width, key, tomlValue(sv.Field(j)))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func tomlValue(v reflect.Value) string {
	if v.Type() == durationType {
		return tomlQuote(v.Interface().(Duration).String())
	}
	switch v.Kind() {
	case reflect.String:
		return tomlQuote(v.String())
	case reflect.Int, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Float64:
		return tomlFloat(v.Float())
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = tomlValue(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map:
		keys := make([]string, 0, v.Len())
		for _, k := range v.MapKeys() {
			keys = append(keys, k.String())
		}
		sort.Strings(keys)
		if len(keys) == 0 {
			return "{}"
		}
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = quoteKeyPiece(k) + " = " + tomlValue(v.MapIndex(reflect.ValueOf(k)))
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	}
	return tomlQuote(fmt.Sprint(v.Interface()))
}

func tomlFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0"
	}
	return s
}

// tomlQuote writes a TOML basic string. strconv.Quote is close but emits
// \x escapes, which TOML 1.0 readers refuse.
func tomlQuote(s string) string {
	s = strings.ToValidUTF8(s, string(utf8.RuneError))
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 || r == 0x7f {
				fmt.Fprintf(&b, `\u%04X`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
