// Package redact removes secrets from text before it leaves the guard: API
// keys given to vLLM (--api-key X Y, api_key='X' in vLLM's `non-default
// args` line, VLLM_API_KEY=X), tokens (Authorization: Bearer X, HF_TOKEN=X),
// and the credentials of URLs (https://user:pass@host), found by their
// names; and, whatever their name, values shaped like keys (shape.go): hf_…,
// sk-…, JWTs, and long random-looking strings. Each secret becomes "***";
// the text around it is kept so a line stays readable.
//
// The guard applies it to everything it writes or serves outside the
// supervisor: its own log (every message and string field), incident
// records, status documents and views, `vllm-guard check` and config errors.
package redact

import (
	"regexp"
	"slices"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// Mask replaces a secret.
const Mask = "***"

// secretName is a key whose value is a secret: api_key, api-key, apikey,
// secret_key, access_key, private_key, *token, *secret, *password. It must
// end the name: max_tokens or tokenizer are not secrets.
const secretName = `(?:api[-_]?key|(?:secret|access|private)[-_]?key|token|secret|password|passwd)`

var (
	// A command-line flag and its value: --api-key X, --hf-token=X, and
	// argv rendered as a Python or JSON list: '--api-key', 'X'. A quoted
	// value starting with two dashes is the next flag: '--api-key',
	// '--hf-tok', 'X' is two flags.
	flagRE = regexp.MustCompile(`(?i)(--[\w-]*?` + secretName + `)(=|\s+|["']\s*,\s*["'])("(?:-?[^"-][^"]*|-)?"|'(?:-?[^'-][^']*|-)?'|[^\s"',\]-][^\s"',\]]*)`)
	// Any long flag and its value, for the flags vLLM reads as secret ones
	// under another spelling: --api-ke X is vLLM's --api-key X.
	anyFlagRE = regexp.MustCompile(`(--[A-Za-z][\w-]*)(=|\s+|["']\s*,\s*["'])("(?:-?[^"-][^"]*|-)?"|'(?:-?[^'-][^']*|-)?'|[^\s"',\]-][^\s"',\]]*)`)
	// An assignment or a dict entry: api_key='X', "api_key": "X",
	// 'api_key': ['X'], VLLM_API_KEY=X, HF_TOKEN: X.
	assignRE = regexp.MustCompile(`(?i)(\b[\w.-]*?` + secretName + `["']?\s*[:=]\s*)(\[[^\]]*\]|"[^"]*"|'[^']*'|[^\s"',;\]\})&-][^\s"',;\]\})&]*)`)
	// Authorization: Bearer X, Authorization: Basic X, and a bare Bearer X.
	authRE   = regexp.MustCompile(`(?i)(\bauthorization["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token|digest)\s+)?)([^\s"',;-][^\s"',;]*)`)
	bearerRE = regexp.MustCompile(`(?i)(\bbearer\s+)([A-Za-z0-9._~+/][A-Za-z0-9\-._~+/]*=*)`)
	// The user information of a URL: scheme://user:pass@host. Greedy up to
	// the last @ before the path, so an unescaped @ in a password is covered.
	userinfoRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^/\s"'?#<>]+)@`)
)

// triggers are lower-case fragments without which no pattern can match: a
// line without any of them (most of vLLM's) skips the regular expressions.
// The names (key, token, secret) count only followed by what a pattern
// needs after them (a quote, = or :, a space): vLLM's stats lines say
// "tokens/s" many times a second, and must stay cheap.
var (
	triggers     = append(append([]string{"passw", "bearer", "authorization", "@"}, prefixTriggers...), abbrevTriggers()...)
	nameTriggers = []string{"key", "token", "secret"}
)

// abbrevTriggers are the first words of vLLM's secret flags ("--api",
// "--hf", "--ssl"): an abbreviation (--api-k) holds none of the names.
func abbrevTriggers() []string {
	var out []string
	for _, f := range vllmargs.SecretFlags() {
		w, _, _ := strings.Cut(f[2:], "-")
		for _, t := range []string{"--" + w + "-", "--" + w + "_"} {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return out
}

// String returns s with every secret it recognises replaced by Mask.
func String(s string) string {
	if !mayHoldSecret(s) {
		return s
	}
	s = userinfoRE.ReplaceAllString(s, "${1}"+Mask+"@")
	// Named secrets first, assignments before flags: a value masked first
	// may be the name of the next secret (--api-key 'api_key': 'X'), and
	// masking it would hide X's name.
	s = maskAssignments(s)
	s = maskFlags(s, flagRE, func(string) bool { return true })
	s = maskFlags(s, anyFlagRE, func(flag string) bool { return vllmargs.IsSecretFlag(strings.ToLower(flag)) })
	s = authRE.ReplaceAllString(s, "${1}"+Mask)
	s = bearerRE.ReplaceAllString(s, "${1}"+Mask)
	return maskShapes(s)
}

// moreValueRE is one more value after a flag's value: " Y" of --api-key X
// Y, ", 'Y'" of a rendered argv list '--api-key', 'X', 'Y'. A value
// starting with a dash is the next flag.
var moreValueRE = regexp.MustCompile(`^(\s+|["']\s*,\s*["'])("(?:-?[^"-][^"]*|-)?"|'(?:-?[^'-][^']*|-)?'|[^\s"',\]-][^\s"',\]]*)`)

// maskFlags masks the values of the flags re finds that secret accepts:
// the first value, and every further one where the flag takes several
// (valuesAfter).
func maskFlags(s string, re *regexp.Regexp, secret func(flag string) bool) string {
	var b strings.Builder
	done, from := 0, 0
	for from < len(s) {
		loc := re.FindStringSubmatchIndex(s[from:])
		if loc == nil {
			break
		}
		flag := s[from+loc[2] : from+loc[3]]
		valStart, valEnd := from+loc[6], from+loc[7]
		if !secret(flag) {
			from += loc[1]
			continue
		}
		b.WriteString(s[done:valStart])
		b.WriteString(maskValue(s[valStart:valEnd]))
		done, from = valEnd, valEnd
		for {
			m := moreValueRE.FindStringSubmatchIndex(s[from:])
			if m == nil {
				break
			}
			inList := strings.Contains(s[from+m[2]:from+m[3]], ",")
			if valuesAfter(flag, inList) == 1 {
				break
			}
			b.WriteString(s[done : from+m[4]])
			b.WriteString(maskValue(s[from+m[4] : from+m[5]]))
			done = from + m[5]
			from = done
		}
	}
	if done == 0 {
		return s
	}
	b.WriteString(s[done:])
	return b.String()
}

// valuesAfter is how many of the arguments after a secret flag are its
// values: 1 for a flag of vLLM's that takes one (--hf-token X model), -1
// (all up to the next flag) for one that takes several (--api-key X Y). A
// flag vLLM does not know (an alert command's --token) is taken to take
// several in an argument list, where every word is an argument; in text,
// where the words after its value are more likely prose, one.
func valuesAfter(flag string, argv bool) int {
	flag = strings.ToLower(flag)
	switch {
	case vllmargs.TakesSeveral(flag):
		return -1
	case vllmargs.Known(flag) || !argv:
		return 1
	}
	return -1
}

// maskAssignments masks the value of each assignment. A "value" that is a
// secret's name followed by = or : is the next assignment (api_key=
// 'api_key': 'X'): it is left, and the search goes on from it.
func maskAssignments(s string) string {
	var b strings.Builder
	done, from := 0, 0
	for from < len(s) {
		loc := assignRE.FindStringSubmatchIndex(s[from:])
		if loc == nil {
			break
		}
		nameEnd, valStart, valEnd := from+loc[3], from+loc[4], from+loc[5]
		if v := s[valStart:valEnd]; nameRE.MatchString(strings.Trim(v, `'"`)) && nextIsAssignment(s[valEnd:]) ||
			len(v) > 2 && (v[0] == '\'' || v[0] == '"') && strings.HasPrefix(v[1:], "--") {
			// The next flag of a rendered argv list ('--hf-tok', 'X') is no
			// value either: the flags' pass masks what follows it.
			from = valStart
			continue
		}
		b.WriteString(s[done:nameEnd])
		b.WriteString(maskValue(s[valStart:valEnd]))
		done, from = valEnd, valEnd
	}
	if done == 0 {
		return s
	}
	b.WriteString(s[done:])
	return b.String()
}

var nameRE = regexp.MustCompile(`(?i)` + secretName + `$`)

// nextIsAssignment: rest starts with = or : (after an optional quote and
// blanks).
func nextIsAssignment(rest string) bool {
	rest = strings.TrimLeft(rest, " \t")
	if rest != "" && (rest[0] == '\'' || rest[0] == '"') {
		rest = strings.TrimLeft(rest[1:], " \t")
	}
	return rest != "" && (rest[0] == ':' || rest[0] == '=')
}

// maskValue keeps the quotes or brackets around a value, so a redacted
// Python dict or JSON text keeps its shape. Values that hold nothing (None,
// null, "") are kept: they say no key was set.
func maskValue(v string) string {
	switch v {
	case "None", "null", "nil", `""`, `''`, "[]", Mask, "'" + Mask + "'", `"` + Mask + `"`, "['" + Mask + "']", `["` + Mask + `"]`:
		return v
	}
	switch {
	case len(v) >= 3 && v[0] == '[' && (v[1] == '"' || v[1] == '\''):
		return "[" + v[1:2] + Mask + v[1:2] + "]"
	case len(v) >= 2 && v[0] == '[':
		return "[" + Mask + "]"
	case len(v) >= 2 && (v[0] == '"' || v[0] == '\''):
		return v[:1] + Mask + v[:1]
	}
	return Mask
}

// Args redacts an argument vector: every value after a secret flag
// (--api-key X Y as three arguments) as well as everything String finds in
// each argument.
func Args(args []string) []string {
	out := make([]string, len(args))
	var m ArgMasker
	for i, a := range args {
		out[i] = m.Next(a)
	}
	return out
}

// ArgMasker redacts an argument vector one argument at a time, for a
// caller that is handed them one by one (a log encoder).
type ArgMasker struct {
	flag string // the secret flag whose values follow ("" for none)
	left int    // how many more values it takes (-1: up to the next flag)
}

// Next is arg redacted: masked whole when it is a value of the secret flag
// before it, else what String finds in it.
func (m *ArgMasker) Next(arg string) string {
	if m.flag != "" && !isFlagArg(arg) && m.left != 0 {
		if m.left > 0 {
			m.left--
		}
		return Mask
	}
	m.flag, m.left = "", 0
	if IsSecretFlag(arg) {
		m.flag, m.left = arg, valuesAfter(arg, true)
	}
	return String(arg)
}

// isFlagArg: a flag ends a secret flag's values ("-" alone and negative
// numbers are values, as argparse reads them).
func isFlagArg(a string) bool {
	if len(a) < 2 || a[0] != '-' {
		return false
	}
	return a[1] < '0' || a[1] > '9'
}

var secretFlagRE = regexp.MustCompile(`(?i)^--[\w-]*?` + secretName + `$`)

// IsSecretFlag reports whether arg is a flag whose next argument is a
// secret: --api-key, --hf-token, any flag named like them, and every
// spelling vLLM reads as one of vLLM's (--api-ke, --api_k).
func IsSecretFlag(arg string) bool {
	return strings.HasPrefix(arg, "--") && !strings.Contains(arg, "=") &&
		(secretFlagRE.MatchString(arg) || vllmargs.IsSecretFlag(strings.ToLower(arg)))
}

func mayHoldSecret(s string) bool {
	if hasRandomRun(s) {
		return true
	}
	for _, t := range triggers {
		if indexFold(s, t, 0) >= 0 {
			return true
		}
	}
	for _, t := range nameTriggers {
		for i := indexFold(s, t, 0); i >= 0; i = indexFold(s, t, i+1) {
			if end := i + len(t); end == len(s) || strings.IndexByte("=:'\" \t\n\v\f\r", s[end]) >= 0 {
				return true
			}
		}
	}
	return false
}

// indexFold is the index of needle in s at or after from, ignoring ASCII
// case (needle is lower case), or -1. It does not allocate, unlike
// lower-casing every log line.
func indexFold(s, needle string, from int) int {
	n := len(needle)
	first := needle[0]
	upper := first
	if first >= 'a' && first <= 'z' {
		upper = first - 'a' + 'A'
	}
	for i := from; i+n <= len(s); i++ {
		if c := s[i]; c != first && c != upper {
			continue
		}
		match := true
		for j := 1; j < n; j++ {
			c := s[i+j]
			if c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != needle[j] {
				match = false
				break
			}
		}
		if match {
			return i
		}
	}
	return -1
}
