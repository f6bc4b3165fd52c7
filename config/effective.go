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

	"github.com/vllm-guard/vllm-guard/internal/redact"
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
// reads back to the same Config: what `vllm-guard check` prints. Secrets
// (an API key in the command or env, a webhook URL's credentials) are
// written masked ("***"): that output lands in terminals and CI logs.
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
			fmt.Fprintf(&b, "%-*s = %s\n", width, key, tomlValue(redacted(sv.Field(j))))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// redacted is v with the secrets of its strings masked: strings through
// redact.String, string lists through redact.Args (--api-key X), string
// maps by value and by key=value (VLLM_API_KEY = "X").
func redacted(v reflect.Value) reflect.Value {
	switch {
	case v.Kind() == reflect.String:
		return reflect.ValueOf(redact.String(v.String())).Convert(v.Type())
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		in := make([]string, v.Len())
		for i := range in {
			in[i] = v.Index(i).String()
		}
		return reflect.ValueOf(redact.Args(in))
	case v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String && v.Type().Elem().Kind() == reflect.String:
		out := reflect.MakeMap(v.Type())
		for _, k := range v.MapKeys() {
			val := redact.String(v.MapIndex(k).String())
			if masked := redact.String(k.String() + "=" + val); masked != k.String()+"="+val {
				val = redact.Mask
			}
			out.SetMapIndex(k, reflect.ValueOf(val))
		}
		return out
	}
	return v
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
