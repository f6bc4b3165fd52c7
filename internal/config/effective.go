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
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// VLLMArgs reads vLLM's effective command line: [vllm] command, then extra
// (the arguments after `--`), a --config file relative to [vllm] workdir,
// and the environment vLLM will see ([vllm] env over the guard's own). A
// command line the guard cannot read is a configuration error; so is one
// that sets vLLM's port with a standby (each vLLM needs its own).
func (c *Config) VLLMArgs(extra []string) (*vllmargs.Args, error) {
	a, err := vllmargs.Parse(c.VLLM.Command, extra, c.VLLM.Workdir, vllmargs.EnvOf(c.VLLM.Env, vllmargs.OSEnv))
	if err != nil {
		return nil, &Error{File: c.Path, Key: "[vllm] command", Msg: err.Error(), Err: err}
	}
	if c.Standby.Mode != StandbyOff && c.Standby.Mode != "" && a.Port != 0 {
		return nil, &Error{File: c.Path, Key: "[vllm] command", Msg: fmt.Sprintf("sets vLLM's port %d, but with a standby each vLLM gets a port of its own "+
			"([vllm] port, [standby] port): remove --port from the command (the arguments after --, or its --config file) and set [vllm] port = %d", a.Port, a.Port)}
	}
	return a, nil
}

// ServedModelNames are the names /v1/models must list (any one of them
// will do): [vllm] served_model_name when set, else what vLLM's command
// line says (every --served-model-name, else the model).
func (c *Config) ServedModelNames(a *vllmargs.Args) []string {
	if c.VLLM.ServedModelName != "" {
		return []string{c.VLLM.ServedModelName}
	}
	if a == nil {
		return nil
	}
	return append([]string(nil), a.ServedNames...)
}

// ServedModelName is the first of ServedModelNames for the command alone
// ("" when the command line cannot be read).
func (c *Config) ServedModelName() string {
	a, _ := c.VLLMArgs(nil)
	if names := c.ServedModelNames(a); len(names) > 0 {
		return names[0]
	}
	return ""
}

// Thresholds are the used/total fractions that raise gpu_memory_warn and
// gpu_memory_critical for a vLLM whose budget is budget (a fraction of
// total): the fixed warn_fraction/critical_fraction when set, else the
// budget plus warn_over_budget/critical_over_budget, at most 0.995
// (policy.Thresholds holds the rule).
func (g GPU) Thresholds(budget float64) (warn, critical float64) {
	return g.policyThresholds().At(budget)
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
			fmt.Fprintf(&b, "%-*s = %s\n", width, key, tomlValue(redacted(masked(name+"."+key, sv.Field(j)))))
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

// masked hides secrets where check prints the settings: the values of
// --api-key (and other secret flags) in [vllm] command, and the secret
// variables of [vllm] env (VLLM_API_KEY, tokens, passwords) as ***.
func masked(key string, v reflect.Value) reflect.Value {
	switch key {
	case "vllm.command":
		argv := v.Interface().([]string)
		return reflect.ValueOf(vllmargs.MaskArgv(argv, nil))
	case "vllm.env":
		env := v.Interface().(map[string]string)
		out := make(map[string]string, len(env))
		for k, val := range env {
			if vllmargs.SecretEnvName(k) {
				val = vllmargs.Mask
			}
			out[k] = val
		}
		return reflect.ValueOf(out)
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
