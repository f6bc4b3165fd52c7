package vllmargs

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func noEnv(string) (string, bool) { return "", false }

func TestParseNamesAndModel(t *testing.T) {
	cases := []struct {
		name    string
		command []string
		extra   []string
		model   string
		names   []string
	}{
		{"positional", []string{"vllm", "serve", "org/m"}, nil, "org/m", []string{"org/m"}},
		{"model after flags", []string{"vllm", "serve", "--enforce-eager", "--port", "9", "org/m"}, nil, "org/m", []string{"org/m"}},
		{"deprecated --model", []string{"vllm", "serve", "--model", "org/m"}, nil, "org/m", []string{"org/m"}},
		{"several names", []string{"vllm", "serve", "org/m", "--served-model-name", "a", "b"}, nil, "org/m", []string{"a", "b"}},
		{"inline name", []string{"vllm", "serve", "org/m", "--served_model_name=x"}, nil, "org/m", []string{"x"}},
		{"repeated: last wins", []string{"vllm", "serve", "org/m", "--served-model-name", "a", "--served-model-name", "b"}, nil, "org/m", []string{"b"}},
		{"extra args override", []string{"vllm", "serve", "org/m", "--served-model-name", "a"}, []string{"--served-model-name", "c"}, "org/m", []string{"c"}},
		{"api_server module", []string{"python", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/m"}, nil, "org/m", []string{"org/m"}},
	}
	for _, tc := range cases {
		a, err := Parse(tc.command, tc.extra, "", noEnv)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if a.Model != tc.model || !reflect.DeepEqual(a.ServedNames, tc.names) {
			t.Errorf("%s: model %q names %q, want %q %q", tc.name, a.Model, a.ServedNames, tc.model, tc.names)
		}
	}
}

func TestParseConfigYAML(t *testing.T) {
	dir := t.TempDir()
	yaml := `# vLLM config
model: org/from-yaml
served-model-name: [alpha, "beta"]
api_key:
  - 'k1'
  - k2
tensor-parallel-size: 2
kv-cache-memory-bytes: 20G
enforce-eager: true
disable-log-stats: false
task: embed
`
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := Parse([]string{"vllm", "serve", "--config", "c.yaml"}, []string{"--tensor_parallel_size", "4"}, dir, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if a.Model != "org/from-yaml" || !reflect.DeepEqual(a.ServedNames, []string{"alpha", "beta"}) {
		t.Errorf("model %q names %q", a.Model, a.ServedNames)
	}
	if !reflect.DeepEqual(a.APIKeys, []string{"k1", "k2"}) {
		t.Errorf("keys %q", a.APIKeys)
	}
	if a.TensorParallelSize != 4 { // the command line overrides the file
		t.Errorf("tp %d, want 4", a.TensorParallelSize)
	}
	if a.KVCacheMemoryBytes != 20<<30 || a.Task != "embed" {
		t.Errorf("kv %d task %q", a.KVCacheMemoryBytes, a.Task)
	}
	if a.ConfigFile != filepath.Join(dir, "c.yaml") {
		t.Errorf("config file %q", a.ConfigFile)
	}
	// A positional model on the command line beats the file's.
	a, err = Parse([]string{"vllm", "serve", "org/cli", "--config", "c.yaml"}, nil, dir, noEnv)
	if err != nil || a.Model != "org/cli" {
		t.Fatalf("model %q err %v", a.Model, err)
	}
	if _, err := Parse([]string{"vllm", "serve", "m", "--config", "missing.yaml"}, nil, dir, noEnv); err == nil ||
		!strings.Contains(err.Error(), "workdir") {
		t.Errorf("missing file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("a: [1\n"), 0o644)
	if _, err := Parse([]string{"vllm", "serve", "m", "--config", "bad.yaml"}, nil, dir, noEnv); err == nil ||
		!strings.Contains(err.Error(), "bad.yaml") {
		t.Errorf("broken YAML: %v", err)
	}
}

// TestParseConfigYAMLAsVLLMReadsIt: a nested map is one JSON-valued
// argument, false is the --no- flag, a list the flag and its items; only
// .yaml/.yml files, and only "--config PATH" is expanded (issue 23 item 2:
// a compilation config made check and run exit 78).
func TestParseConfigYAMLAsVLLMReadsIt(t *testing.T) {
	dir := t.TempDir()
	yaml := `model: org/m
compilation-config:
  level: 3
  cudagraph_capture_sizes: [1, 2, 4]
speculative_config: {method: ngram, num_speculative_tokens: 5, enabled: true}
served-model-name:
  - a
  - b
enable-prefix-caching: false
shutdown_timeout: 45
`
	os.WriteFile(filepath.Join(dir, "c.yml"), []byte(yaml), 0o644)
	a, err := Parse([]string{"vllm", "serve", "--config", "c.yml"}, nil, dir, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.ServedNames, []string{"a", "b"}) || a.ShutdownTimeout != 45*time.Second {
		t.Errorf("names %q shutdown %s", a.ServedNames, a.ShutdownTimeout)
	}
	entries, err := parseYAML([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, e := range entries {
		got[e.key] = e.values
	}
	want := map[string][]string{
		"model":                    {"org/m"},
		"compilation-config":       {`{"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}`},
		"speculative_config":       {`{"method": "ngram", "num_speculative_tokens": 5, "enabled": true}`},
		"served-model-name":        {"a", "b"},
		"no-enable-prefix-caching": nil,
		"shutdown_timeout":         {"45"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries %q\nwant    %q", got, want)
	}

	// Only .yaml and .yml, as vLLM.
	os.WriteFile(filepath.Join(dir, "c.json"), []byte("{}"), 0o644)
	if _, err := Parse([]string{"vllm", "serve", "m", "--config", "c.json"}, nil, dir, noEnv); err == nil ||
		!strings.Contains(err.Error(), ".yaml") {
		t.Errorf("a .json config: %v", err)
	}
	// --config=PATH is not expanded by vLLM: its keys do not count.
	a, err = Parse([]string{"vllm", "serve", "m", "--config=c.yml"}, nil, dir, noEnv)
	if err != nil || a.ConfigFile != "" || a.ShutdownTimeout != 0 || !reflect.DeepEqual(a.ServedNames, []string{"m"}) {
		t.Errorf("--config=PATH: %+v %v", a, err)
	}
}

// TestShutdownTimeoutSpellings: every spelling vLLM's parser takes, from
// the command, the extra arguments or the --config file; the last wins.
func TestShutdownTimeoutSpellings(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("shutdown-timeout: 50\n"), 0o644)
	for _, tc := range []struct {
		command, extra []string
		want           time.Duration
	}{
		{[]string{"vllm", "serve", "m", "--shutdown-timeout", "120"}, nil, 120 * time.Second},
		{[]string{"vllm", "serve", "m", "--shutdown-timeout=120"}, nil, 120 * time.Second},
		{[]string{"vllm", "serve", "m", "--shutdown_timeout=120"}, nil, 120 * time.Second},
		{[]string{"vllm", "serve", "m"}, []string{"--shutdown_timeout", "120"}, 120 * time.Second},
		{[]string{"vllm", "serve", "m", "--config", "c.yaml"}, nil, 50 * time.Second},
		{[]string{"vllm", "serve", "m", "--config", "c.yaml"}, []string{"--shutdown-timeout=7"}, 7 * time.Second},
		{[]string{"vllm", "serve", "m"}, nil, 0},
	} {
		a, err := Parse(tc.command, tc.extra, dir, noEnv)
		if err != nil || a.ShutdownTimeout != tc.want {
			t.Errorf("%q -- %q: %v %v, want %s", tc.command, tc.extra, a.ShutdownTimeout, err, tc.want)
		}
	}
	// vLLM takes an integer number of seconds.
	if _, err := Parse([]string{"vllm", "serve", "m", "--shutdown-timeout", "2.5"}, nil, "", noEnv); err == nil {
		t.Error("--shutdown-timeout 2.5: no error (vLLM's argparse refuses it)")
	}
}

func TestAPIKeysAndMasking(t *testing.T) {
	env := EnvOf(map[string]string{"VLLM_API_KEY": "from-env"}, noEnv)
	a, err := Parse([]string{"vllm", "serve", "m", "--api-key", "s3cret", "other"}, nil, "", env)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.APIKeys, []string{"s3cret", "other"}) {
		t.Errorf("keys %q (the flag wins over the environment)", a.APIKeys)
	}
	got := strings.Join(a.Masked(append(a.Argv, "--api-key=s3cret", "--port", "8000")), " ")
	if strings.Contains(got, "s3cret") || strings.Contains(got, "other") || strings.Contains(got, "from-env") {
		t.Errorf("masked %q", got)
	}
	if want := "vllm serve m --api-key *** *** --api-key=*** --port 8000"; got != want {
		t.Errorf("masked %q, want %q", got, want)
	}
	a, _ = Parse([]string{"vllm", "serve", "m"}, nil, "", env)
	if !reflect.DeepEqual(a.APIKeys, []string{"from-env"}) {
		t.Errorf("env key %q", a.APIKeys)
	}
	if got := MaskText("'api_key': ['from-env']", a.Secrets()); got != "'api_key': ['***']" {
		t.Errorf("MaskText %q", got)
	}
}

func TestScalars(t *testing.T) {
	a, err := Parse([]string{"vllm", "serve", "m", "-tp", "2", "--shutdown-timeout=30", "--task", "embed", "--runner", "pooling",
		"--kv_cache_memory_bytes", "1.5g"}, nil, "", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if a.TensorParallelSize != 2 || a.ShutdownTimeout != 30*time.Second || a.Task != "embed" || a.Runner != "pooling" ||
		a.KVCacheMemoryBytes != 1_500_000_000 {
		t.Errorf("%+v", a)
	}
	for _, bad := range [][]string{{"--kv-cache-memory-bytes", "1.5G"}, {"--shutdown-timeout", "x"}, {"-tp", "0"}, {"--port", "http"}} {
		if _, err := Parse(append([]string{"vllm", "serve", "m"}, bad...), nil, "", noEnv); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestHumanInt(t *testing.T) {
	for in, want := range map[string]int64{"123": 123, "25.6k": 25600, "2G": 2 << 30, "1K": 1024, "3m": 3_000_000, "1T": 1 << 40} {
		if got, err := HumanInt(in); err != nil || got != want {
			t.Errorf("HumanInt(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"1.5G", "x", "", "9999999999T"} {
		if _, err := HumanInt(bad); err == nil {
			t.Errorf("HumanInt(%q): no error", bad)
		}
	}
}

// FuzzParse: any command line and any --config file parse without
// panicking, and no API key survives masking.
func FuzzParse(f *testing.F) {
	f.Add("vllm serve m --api-key k --served-model-name a b", "model: x\nport: 8000\n")
	f.Add("vllm serve --config c.yaml -tp 2", "served-model-name: [a, 'b']\napi-key:\n  - k\n")
	f.Add("python -m vllm.entrypoints.openai.api_server --model=m --kv-cache-memory-bytes 2G", "# empty\n")
	f.Add("vllm serve m --api-key=a=b --no-enable-prefix-caching", "x: \"unterminated\n")
	f.Add("vllm serve m", "compilation-config:\n  level: 3\n  sizes: [1, {a: b}]\nx: &a [1]\ny: *a\n")
	f.Fuzz(func(t *testing.T, cmdline, yaml string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		argv := append(strings.Fields(cmdline), "--config", "c.yaml")
		a, err := Parse(argv, nil, dir, noEnv)
		if err != nil {
			return
		}
		masked := strings.Join(a.Masked(a.Argv), "\x00")
		for _, k := range a.APIKeys {
			if strings.Contains(k, Mask) || strings.Contains(Mask, k) {
				continue // a key that is (part of) the mask itself
			}
			if strings.Contains(masked, k) {
				t.Fatalf("key %q survives masking: %q", k, masked)
			}
		}
	})
}
