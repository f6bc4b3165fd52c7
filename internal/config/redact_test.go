package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `vllm-guard check` prints the effective settings, and config errors
// quote values: neither may carry an API key or a webhook's credentials.
func TestSecretsMaskedInEffectiveAndErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte(`[vllm]
command = ["vllm", "serve", "m", "--api-key", "sk-cmd-secret-0123456789abcdef"]
env = { VLLM_API_KEY = "env-secret", HF_TOKEN = "hf_envsecretenvsecretenvsecret", CUDA_VISIBLE_DEVICES = "0" }

[alerts]
webhook = "https://alice:hook-secret@hooks.example.com/vllm?token=query-secret"
`), 0o644)
	cfg, err := Load(good)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := cfg.WriteEffective(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{"sk-cmd-secret", "env-secret", "envsecret", "hook-secret", "alice", "query-secret"} {
		if strings.Contains(out, s) {
			t.Errorf("check output carries %q:\n%s", s, out)
		}
	}
	for _, want := range []string{`"--api-key", "***"`, `VLLM_API_KEY = "***"`, `CUDA_VISIBLE_DEVICES = "0"`, `"https://***@hooks.example.com/vllm?token=***"`} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %s:\n%s", want, out)
		}
	}

	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[alerts]\nwebhook = \"ftp://bob:ftp-secret@files.example.com/x\"\n"), 0o644)
	_, err = Load(bad)
	if err == nil || !strings.Contains(err.Error(), "webhook") || strings.Contains(err.Error(), "ftp-secret") || strings.Contains(err.Error(), "bob") {
		t.Errorf("config error: %v; want the webhook named, its credentials masked", err)
	}
}
