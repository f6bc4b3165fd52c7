package vllmstats

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFixtures(t *testing.T) {
	cases := []struct {
		file string
		want Stats
	}{
		{"metrics_v1_new.txt", Stats{Running: 17, Waiting: 3, KVUsage: 0.4521, Preemptions: 8, PromptTokens: 1235567, GenerationTokens: 655000, TokensKnown: true}},
		{"metrics_v0_old.txt", Stats{Running: 4, Waiting: 9, KVUsage: 0.9731, Preemptions: 31, PromptTokens: 88000, GenerationTokens: 12000, TokensKnown: true}},
		{"metrics_transition.txt", Stats{Running: 2, Waiting: 1, KVUsage: 0.61}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := Parse(f)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got != c.want {
				t.Errorf("Parse =\n %+v\nwant\n %+v", got, c.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, in, wantErr string
	}{
		{"not vllm", "# TYPE up gauge\nup 1\n", "no vLLM series in 2 lines"},
		{"empty", "", "no vLLM series"},
		{"bad value", "vllm:num_requests_running{engine=\"0\"} abc\n", `line 1: vllm:num_requests_running: value "abc" is not a number`},
		{"nan", "vllm:num_requests_waiting NaN\n", `value "NaN" is not a finite number`},
		{"inf", "x 1\nvllm:kv_cache_usage_perc +Inf\n", `line 2: vllm:kv_cache_usage_perc: value "+Inf" is not a finite number`},
		{"no value", "vllm:num_requests_running{a=\"b\"}\n", "no value after the name"},
		{"open labels", "vllm:num_requests_running{a=\"b} 1\n", "unterminated label value"},
		{"unclosed labels", "vllm:num_requests_running{a=\"b\" 1\n", "no closing '}'"},
		{"extra fields", "vllm:num_requests_running 1 2 3\n", "3 fields after the name"},
		{"overflow", "vllm:num_requests_running{e=\"0\"} 1e308\nvllm:num_requests_running{e=\"1\"} 1e308\n", "sums to +Inf"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Parse error = %v, want it to contain %q", err, c.wantErr)
			}
		})
	}
}

func TestParseIgnoresOtherMalformedLines(t *testing.T) {
	in := "garbage line here\nsome_metric{unterminated 1\nvllm:num_requests_running 2\n"
	got, err := Parse(strings.NewReader(in))
	if err != nil || got.Running != 2 {
		t.Fatalf("Parse = %+v, %v; want running 2 and no error", got, err)
	}
}

func TestParseBounded(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("vllm:num_requests_running 1\n")
	line := "# " + strings.Repeat("x", 1000) + "\n"
	for b.Len() <= MaxBody {
		b.WriteString(line)
	}
	_, err := Parse(&b)
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Parse of %d bytes: error = %v, want a size error", b.Len(), err)
	}
	// One huge line is refused too, without buffering past the bound.
	_, err = Parse(strings.NewReader("vllm:num_requests_running 1\n" + strings.Repeat("y", MaxBody+10)))
	if err == nil {
		t.Fatal("Parse of a 4 MiB line: no error")
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"metrics_v1_new.txt", "metrics_v0_old.txt", "metrics_transition.txt"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("vllm:num_requests_running{a=\"\\\"}\"} 1\n"))
	f.Add([]byte("vllm:kv_cache_usage_perc 1e400\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		flat, _ := Flat(bytes.NewReader(data))
		for name, v := range flat {
			if math.IsNaN(v) || math.IsInf(v, 0) || name == "" {
				t.Fatalf("Flat gave %q = %v", name, v)
			}
		}
		st, err := Parse(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Whatever parses must be encodable in the status document.
		if _, err := json.Marshal(st); err != nil {
			t.Fatalf("Parse gave an unencodable %+v: %v", st, err)
		}
	})
}

// Flat keeps each name's last sample, labels dropped; a label value holding
// '}' or a space and a trailing timestamp do not fool it; junk is skipped.
func TestFlat(t *testing.T) {
	text := "# HELP fakevllm_true_safe_max_num_seqs x\n" +
		"fakevllm_true_safe_max_num_seqs 118\n" +
		`vllm:num_requests_running{model_name="a} b"} 3 1700000000000` + "\n" +
		`vllm:num_requests_running{model_name="c"} 4` + "\n" +
		"not a sample\n" +
		"vllm:kv_cache_usage_perc NaN\n"
	got, err := Flat(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"fakevllm_true_safe_max_num_seqs": 118, "vllm:num_requests_running": 4}
	if len(got) != len(want) {
		t.Fatalf("Flat = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
