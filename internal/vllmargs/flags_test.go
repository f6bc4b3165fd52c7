package vllmargs

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// vLLM's parser takes any unambiguous prefix of a flag for the flag
// (argparse's allow_abbrev), underscores for dashes (issue 32 item 3).
func TestResolveFlagAsVLLMsParser(t *testing.T) {
	for _, tc := range []struct {
		in, want  string
		ambiguous []string
	}{
		{"--api-key", "--api-key", nil},
		{"--api-ke", "--api-key", nil},
		{"--api-k", "--api-key", nil},
		{"--api_ke", "--api-key", nil},
		{"--api", "--api", []string{"--api-key", "--api-server-count"}},
		{"--hf-tok", "--hf-token", nil},
		{"--hf_t", "--hf-token", nil},
		{"--max-num-se", "--max-num-seqs", nil},
		{"--tensor-parallel", "--tensor-parallel-size", nil},
		{"-tp", "--tensor-parallel-size", nil},
		{"--ssl-keyfile", "--ssl-keyfile", nil},            // exact beats the longer --ssl-keyfile-password
		{"--ssl-keyfile-p", "--ssl-keyfile-password", nil}, // older vLLM's
		{"--no-such-flag", "--no-such-flag", nil},
		{"--compilation-config.level", "--compilation-config.level", nil},
	} {
		got, amb := ResolveFlag(tc.in)
		if got != tc.want || !reflect.DeepEqual(amb, tc.ambiguous) {
			t.Errorf("ResolveFlag(%q) = %q %q, want %q %q", tc.in, got, amb, tc.want, tc.ambiguous)
		}
	}
	if got := ShortestAbbrev("--api-key"); got != "--api-k" {
		t.Errorf("ShortestAbbrev(--api-key) = %q, want --api-k (--api is also --api-server-count)", got)
	}
}

// The key the guard's probes send, and every masking of the command line,
// read an abbreviated --api-key as vLLM does; an ambiguous prefix is not
// the key (vLLM refuses it: "ambiguous option").
func TestAbbreviatedAPIKey(t *testing.T) {
	for _, argv := range [][]string{
		{"vllm", "serve", "m", "--api-ke", "sk-abbrev-0001"},
		{"vllm", "serve", "m", "--api_k=sk-abbrev-0001"},
		{"vllm", "serve", "m", "--port", "8000", "--api-k", "sk-abbrev-0001", "--enforce-eager"},
	} {
		a, err := Parse(argv, nil, "", noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a.APIKeys, []string{"sk-abbrev-0001"}) {
			t.Errorf("%q: keys %q", argv, a.APIKeys)
		}
		if got := strings.Join(a.Masked(a.Argv), " "); strings.Contains(got, "abbrev-0001") {
			t.Errorf("%q: masked %q", argv, got)
		}
		if got := strings.Join(MaskArgv(argv, nil), " "); strings.Contains(got, "abbrev-0001") {
			t.Errorf("%q: MaskArgv without the secrets %q", argv, got)
		}
	}
	a, err := Parse([]string{"vllm", "serve", "m", "--api", "not-a-key"}, nil, "", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.APIKeys) != 0 {
		t.Errorf("--api (ambiguous) read as the key: %q", a.APIKeys)
	}
	if IsSecretFlag("--api") || !IsSecretFlag("--api-ke") || !IsSecretFlag("--api_ke=x") || IsSecretFlag("--api-server-count") {
		t.Error("IsSecretFlag does not read flags as vLLM does")
	}
}

// A --config YAML file's keys become flags, abbreviations included; only
// the exact "--config FILE" makes vLLM read the file.
func TestAbbreviationsInAndOfConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("api_ke: sk-yaml-0001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Parse([]string{"vllm", "serve", "m", "--config", "c.yaml"}, nil, dir, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.APIKeys, []string{"sk-yaml-0001"}) {
		t.Errorf("keys %q from the YAML's api_ke", a.APIKeys)
	}
	a, err = Parse([]string{"vllm", "serve", "m", "--confi", "c.yaml"}, nil, dir, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if a.ConfigFile != "" || len(a.APIKeys) != 0 {
		t.Errorf("--confi read the file (%q, keys %q); vLLM only expands --config", a.ConfigFile, a.APIKeys)
	}
}

// The generated list is vLLM's: sorted, long flags only, and holding the
// flags the guard reads.
func TestVLLMFlagsList(t *testing.T) {
	if !slices.IsSorted(vllmFlags) || len(vllmFlags) < 300 {
		t.Fatalf("vllmFlags: %d flags, sorted %v", len(vllmFlags), slices.IsSorted(vllmFlags))
	}
	for _, f := range []string{"--api-key", "--api-server-count", "--hf-token", "--served-model-name", "--port", "--config", "--kv-cache-memory-bytes"} {
		if _, ok := slices.BinarySearch(vllmFlags, f); !ok {
			t.Errorf("vllmFlags lacks %s", f)
		}
	}
}
