package config

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// 80 KB of nested inline tables took BurntSushi/toml over a minute and
// 11 GB, a 40 KB dotted key 35 s and 5 GB (issue 32 item 5): Load refuses
// both before decoding, naming the line. The inputs are sized so the
// decoder alone would take many seconds, and the test would hang there.
func TestLoadRefusesDeepNestingBeforeDecoding(t *testing.T) {
	const deep = 13000 // 80 KB
	for _, tc := range []struct {
		name, body string
		line       int
		want       string
	}{
		{"inline tables", "[vllm]\nport = 8000\nenv = " + strings.Repeat("{a = ", deep) + "1" + strings.Repeat("}", deep) + "\n", 3, "inline tables and arrays nest more than 32 deep here"},
		{"arrays of inline tables", "[vllm]\n\ncommand = " + strings.Repeat("[{a = ", deep/2) + "1" + strings.Repeat("}]", deep/2) + "\n", 3, "inline tables and arrays nest more than 32 deep here"},
		{"dotted key", "[log]\nlevel = \"info\"\n\n[vllm]\nenv." + strings.Repeat("a.", 20000) + "b = \"x\"\n", 5, "a key here has more than 32 dotted parts"},
		{"dotted header", "# comment\n[" + strings.Repeat("a.", 20000) + "b]\n", 2, "a key here has more than 32 dotted parts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeTemp(t, tc.body)
			_, err := Load(p)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("Load = %v; want a *config.Error", err)
			}
			if ce.Line != tc.line || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %q (line %d); want line %d and %q", err, ce.Line, tc.line, tc.want)
			}
			if !strings.HasPrefix(err.Error(), p+":"+strconv.Itoa(tc.line)+": ") {
				t.Errorf("error %q does not start with file:line", err)
			}
		})
	}
}

// Brackets, dots and quotes inside strings and comments are not nesting:
// a vLLM argument such as a JSON override or a regex must load.
func TestPrescanSkipsStringsAndComments(t *testing.T) {
	many := strings.Repeat("{[", 40) + strings.Repeat("a.", 40)
	for _, body := range []string{
		"[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"--override-generation-config\", \"" + many + "\"]\n",
		"[vllm]\ncommand = ['vllm', 'serve', 'm', '" + many + "']\n",
		"[vllm]\ncommand = [\"\"\"\n" + many + `\" """""` + ", \"x\"]\n",
		"[vllm]\ncommand = ['''\n" + many + "\n''''', \"x\"]\n",
		"# " + many + "\n[vllm] # " + many + "\nport = 8000 # " + many + "\n",
		"[vllm]\ncommand = [\"a\\\"" + many + "\", \"b\"]\nenv = { \"" + many + "\" = \"x\" }\n",
		"[profile]\ngpu_memory_utilization = 0.5\nheadroom = 0.1\n[gpu]\ndevices = [\"0\", \"1\"]\n",
	} {
		if _, err := toml.Decode(body, new(map[string]any)); err != nil {
			t.Fatalf("the sample is not TOML: %v\n%s", err, body)
		}
		if err := prescan("t.toml", []byte(body)); err != nil {
			t.Errorf("prescan refused a file with its brackets in strings or comments:\n%s\n%v", body, err)
		}
	}
	// Just past the bounds, outside strings, is refused.
	for _, body := range []string{
		"a = " + strings.Repeat("[", maxNesting+1) + strings.Repeat("]", maxNesting+1) + "\n",
		strings.Repeat("a.", maxKeyParts) + "b = 1\n",
	} {
		if err := prescan("t.toml", []byte(body)); err == nil {
			t.Errorf("prescan accepted %q", body)
		}
	}
	// At the bounds is left to the decoder.
	for _, body := range []string{
		"a = " + strings.Repeat("[", maxNesting) + strings.Repeat("]", maxNesting) + "\n",
		strings.Repeat("a.", maxKeyParts-1) + "b = 1\n",
	} {
		if err := prescan("t.toml", []byte(body)); err != nil {
			t.Errorf("prescan refused %q: %v", body, err)
		}
	}
}
