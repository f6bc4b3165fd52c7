package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Resolve picks the config file: the --config flag, else $VLLM_GUARD_CONFIG,
// else ./vllm-guard.toml, else /etc/vllm-guard/vllm-guard.toml. A flag or
// variable that names a missing file is returned as is, so the error names
// what the operator asked for instead of silently reading another file.
// When nothing exists it returns "./vllm-guard.toml".
func Resolve(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if env := os.Getenv(ConfigEnv); env != "" {
		return env
	}
	for _, p := range []string{"./vllm-guard.toml", "/etc/vllm-guard/vllm-guard.toml"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "./vllm-guard.toml"
}

// Load reads path over Default(), strictly: a syntax error, an unknown or
// miscased key, a wrong type, a duration written as a number, or a value out
// of range is an *Error naming file, line and key (Errors when there are
// several, first line first).
func Load(path string) (*Config, error) { return LoadFor(path, "") }

// LoadFor is Load over DefaultFor(instance): a key the file sets wins over
// the instance's default socket and state folder.
func LoadFor(path, instance string) (*Config, error) {
	data, err := readCapped(path)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return nil, &Error{File: path, Msg: fmt.Sprintf("the config file is larger than %d KiB, more than any config: is --config the right file (not a device or a log)?", MaxFileBytes>>10), Err: err}
		}
		return nil, &Error{File: path, Msg: fmt.Sprintf("cannot read the config file: %v; create it (the repository's vllm-guard.toml is a commented example) or pass --config", errors.Unwrap(err)), Err: err}
	}
	return parseFor(path, data, instance)
}

// MaxFileBytes caps what is read of a config file: the commented example
// is under 10 KiB; --config /dev/zero or a log named by mistake must not
// grow the guard without bound.
const MaxFileBytes = 1 << 20

var errTooLarge = errors.New("config file too large")

// readCapped reads path, at most MaxFileBytes of it.
func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, &os.PathError{Op: "read", Path: path, Err: err}
	}
	if len(data) > MaxFileBytes {
		return nil, errTooLarge
	}
	return data, nil
}

func parseFor(path string, data []byte, instance string) (*Config, error) {
	if err := prescan(path, data); err != nil {
		return nil, err
	}
	src := string(data)
	var raw map[string]any
	if _, err := toml.Decode(src, &raw); err != nil {
		return nil, syntaxError(path, src, err)
	}
	pos := scanPositions(src)
	c := &checker{file: path, pos: pos}
	c.checkTable(nil, raw, reflect.TypeFor[Config]())
	if len(c.errs) > 0 {
		// checkTable removed every offending key from raw; decode what is
		// left so range problems are reported in the same pass.
		var buf bytes.Buffer
		if err := toml.NewEncoder(&buf).Encode(raw); err == nil {
			cfg := DefaultFor(instance)
			if _, err := toml.Decode(buf.String(), cfg); err == nil {
				c.validate(cfg)
			}
		}
		return nil, c.result()
	}

	cfg := DefaultFor(instance)
	md, err := toml.Decode(src, cfg)
	if err != nil {
		// The schema pass should have caught every decode error; keep the
		// position BurntSushi gives if one slips through.
		return nil, syntaxError(path, src, err)
	}
	for _, k := range md.Undecoded() {
		c.add(k, "is not a vllm-guard setting; remove it")
	}
	cfg.Path = path
	c.fromLWS(&cfg.Group)
	c.validate(cfg)
	if err := c.result(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func syntaxError(path, src string, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		line := pe.Position.Line
		// Position.Line is the line after an unexpected newline ("[vllm"
		// then Enter reports line 2); the byte offset names the right one.
		if st := pe.Position.Start; pe.Position.Len > 0 && st >= 0 && st <= len(src) {
			line = 1 + strings.Count(src[:st], "\n")
		}
		msg := pe.Message
		if pe.Usage != "" {
			msg += " (" + strings.Join(strings.Fields(pe.Usage), " ") + ")"
		}
		return &Error{File: path, Line: line, Msg: "TOML syntax error: " + msg + "; fix the syntax on this line", Err: err}
	}
	return &Error{File: path, Msg: "cannot decode: " + err.Error(), Err: err}
}

// checker collects every problem of one file with its line.
type checker struct {
	file string
	pos  positions // nil when validating a Config built in code
	errs Errors
}

func (c *checker) add(path []string, format string, args ...any) {
	c.errs = append(c.errs, &Error{File: c.file, Line: c.pos.line(path), Key: keyName(path), Msg: fmt.Sprintf(format, args...)})
}

func (c *checker) result() error {
	if len(c.errs) == 0 {
		return nil
	}
	// File order; problems with no line go last.
	sort.SliceStable(c.errs, func(i, j int) bool {
		li, lj := c.errs[i].Line, c.errs[j].Line
		if li == 0 || lj == 0 {
			return lj == 0 && li != 0
		}
		return li < lj
	})
	if len(c.errs) == 1 {
		return c.errs[0]
	}
	return c.errs
}

var durationType = reflect.TypeFor[Duration]()

// tomlFields lists the toml names of a struct's fields, in declaration order.
func tomlFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		if name := tomlName(f); name != "" {
			out = append(out, name)
		}
	}
	return out
}

func tomlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	if name == "" {
		return f.Name
	}
	return name
}

func fieldByTOML(t reflect.Type, name string) (reflect.StructField, bool) {
	for f := range t.Fields() {
		if tomlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// checkTable walks one TOML table against the struct t: unknown keys, keys
// in the wrong case (BurntSushi would match them silently), and each
// value's type.
func (c *checker) checkTable(path []string, raw map[string]any, t reflect.Type) {
	known := tomlFields(t)
	for _, k := range sortedKeys(raw) {
		p := append(slices.Clip(path), k)
		if f, ok := fieldByTOML(t, k); ok {
			if !c.checkValue(p, raw[k], f.Type) {
				delete(raw, k)
			}
			continue
		}
		delete(raw, k)
		if i := slices.IndexFunc(known, func(n string) bool { return strings.EqualFold(n, k) }); i >= 0 {
			c.add(p, "keys are case-sensitive; write %s", known[i])
			continue
		}
		c.add(p, "%s", unknownKeyHelp(path, k, known))
	}
}

// checkValue reports whether v decodes into t. Inside tables and maps it
// deletes what does not, so the rest can still be decoded and validated.
func (c *checker) checkValue(path []string, v any, t reflect.Type) bool {
	n := len(c.errs)
	if t == durationType {
		var d Duration
		if err := d.UnmarshalTOML(v); err != nil {
			c.add(path, "%s", err.Error())
		}
		return len(c.errs) == n
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			c.add(path, "is %s; write a table: a [%s] header followed by its keys", tomlTypeName(v), path[len(path)-1])
			return false
		}
		c.checkTable(path, m, t)
		return true
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			c.add(path, "is %s; write a table of strings, such as { HF_HOME = \"/models\" }", tomlTypeName(v))
			return false
		}
		for _, k := range sortedKeys(m) {
			if !c.checkValue(append(slices.Clip(path), k), m[k], t.Elem()) {
				delete(m, k)
			}
		}
		return true
	case reflect.Slice:
		a, ok := v.([]any)
		if !ok {
			c.add(path, "is %s; write an array of strings, such as [\"a\", \"b\"]", tomlTypeName(v))
			return false
		}
		for i, e := range a {
			if _, ok := e.(string); !ok {
				c.add(path, "element %d is %s; every element must be a string (quote it)", i+1, tomlTypeName(e))
			}
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			c.add(path, "is %s; write a string in double quotes", tomlTypeName(v))
		}
	case reflect.Int, reflect.Int64:
		switch x := v.(type) {
		case int64:
		case float64:
			c.add(path, "%g is a number with a fraction; write a whole number", x)
		default:
			c.add(path, "is %s; write a whole number without quotes", tomlTypeName(v))
		}
	case reflect.Float64:
		switch v.(type) {
		case int64, float64:
		default:
			c.add(path, "is %s; write a number without quotes, such as 0.85", tomlTypeName(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			c.add(path, "is %s; write true or false", tomlTypeName(v))
		}
	default:
		c.add(path, "has a type vllm-guard cannot decode (%s); this is a bug, please report it", t)
	}
	return len(c.errs) == n
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// unknownKeyHelp says what to write instead of an unknown key: a near key in
// the same table, or the table the key belongs to.
func unknownKeyHelp(table []string, key string, known []string) string {
	where := "at the top level"
	if len(table) > 0 {
		where = "in " + keyName(table)
	}
	msg := fmt.Sprintf("unknown key %s", where)
	if s := nearest(key, known); s != "" {
		return msg + fmt.Sprintf("; did you mean %s?", s)
	}
	if len(table) <= 1 {
		if sec := sectionOf(key); sec != "" && (len(table) == 0 || sec != table[0]) {
			return msg + fmt.Sprintf("; %s belongs in [%s]: move it under that header", key, sec)
		}
	}
	if len(table) == 0 {
		return msg + "; the sections are [" + strings.Join(known, "], [") + "]"
	}
	return msg + "; allowed keys: " + strings.Join(known, ", ")
}

// sectionOf returns the section that has a key named key (any case).
func sectionOf(key string) string {
	t := reflect.TypeFor[Config]()
	for f := range t.Fields() {
		sec := tomlName(f)
		if sec == "" || f.Type.Kind() != reflect.Struct || f.Type == durationType {
			continue
		}
		for _, n := range tomlFields(f.Type) {
			if strings.EqualFold(n, key) {
				return sec
			}
		}
	}
	return ""
}

// nearest returns the candidate within a small edit distance of key.
func nearest(key string, candidates []string) string {
	best, bestD := "", 0
	lk := strings.ToLower(key)
	for _, c := range candidates {
		d := editDistance(lk, c)
		limit := max(1, min(3, len(c)/4))
		if d <= limit && (best == "" || d < bestD) {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30 // no suggestion for absurd keys; keeps the fuzzer fast
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func tomlTypeName(v any) string {
	switch x := v.(type) {
	case string:
		return "a string (" + truncate(tomlQuote(x), 40) + ")"
	case int64:
		return fmt.Sprintf("a whole number (%d)", x)
	case float64:
		return fmt.Sprintf("a number (%g)", x)
	case bool:
		return fmt.Sprintf("a boolean (%t)", x)
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	case time.Time, toml.Primitive:
		return "a date/time"
	case nil:
		return "empty"
	default:
		return fmt.Sprintf("a %T", v)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
