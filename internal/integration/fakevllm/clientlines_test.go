package main

import "testing"

// pyRepr writes a str as Python's repr does: the guard's tests rely on a
// newline in a model name staying inside the ERROR line that quotes it.
func TestPyRepr(t *testing.T) {
	for in, want := range map[string]string{
		"abc":            `'abc'`,
		"a\nb":           `'a\nb'`,
		"it's":           `"it's"`,
		`it's "x"`:       `'it\'s "x"'`,
		"back\\slash":    `'back\\slash'`,
		"tab\tcr\r\x00":  `'tab\tcr\r\x00'`,
		"café \u2028 ok": `'café \u2028 ok'`,
	} {
		if got := pyRepr(in); got != want {
			t.Errorf("pyRepr(%q) = %s, want %s", in, got, want)
		}
	}
}
