package config

import (
	"strings"
	"testing"
)

func TestInstanceName(t *testing.T) {
	t.Setenv(InstanceEnv, "")
	if got, err := Instance(""); got != "" || err != nil {
		t.Errorf("no flag, no variable: %q %v, want no instance", got, err)
	}
	t.Setenv(InstanceEnv, "gpu3")
	if got, err := Instance(""); got != "gpu3" || err != nil {
		t.Errorf("from $%s: %q %v", InstanceEnv, got, err)
	}
	if got, err := Instance("tp0-1"); got != "tp0-1" || err != nil {
		t.Errorf("the flag wins over the variable: %q %v", got, err)
	}
	for _, bad := range []string{"../etc", "a/b", ".hidden", "a b", "x;rm", strings.Repeat("a", 65)} {
		if _, err := Instance(bad); err == nil || !strings.Contains(err.Error(), "--instance") {
			t.Errorf("Instance(%q): %v, want an error naming --instance", bad, err)
		}
	}
	t.Setenv(InstanceEnv, "../x")
	if _, err := Instance(""); err == nil || !strings.Contains(err.Error(), "$"+InstanceEnv) {
		t.Errorf("a bad $%s: %v, want an error naming the variable", InstanceEnv, err)
	}
}

func TestInstanceDefaultsAndPrecedence(t *testing.T) {
	d := DefaultFor("a")
	if d.Control.Socket != "/run/vllm-guard/a.sock" || d.Control.StateDir != "/var/lib/vllm-guard/a" {
		t.Errorf("DefaultFor(a): socket %q state %q", d.Control.Socket, d.Control.StateDir)
	}
	if d := DefaultFor(""); d.Control.Socket != Default().Control.Socket || d.Control.StateDir != Default().Control.StateDir {
		t.Errorf("DefaultFor(\"\") differs from Default()")
	}
	if err := d.Validate(); err != nil {
		t.Errorf("DefaultFor(a) does not validate: %v", err)
	}

	t.Setenv(ConfigEnv, "/from/env.toml")
	for _, c := range []struct{ flag, inst, want string }{
		{"/x.toml", "a", "/x.toml"},         // --config wins
		{"", "a", "/etc/vllm-guard/a.toml"}, // then the instance's file
		{"", "", "/from/env.toml"},          // then $VLLM_GUARD_CONFIG
	} {
		if got := ResolveFor(c.flag, c.inst); got != c.want {
			t.Errorf("ResolveFor(%q, %q) = %q, want %q", c.flag, c.inst, got, c.want)
		}
	}

	// A key the file sets wins over the instance's default; what it leaves
	// out follows the instance.
	p := writeTemp(t, "[control]\nsocket = \"/tmp/mine.sock\"\n")
	cfg, err := LoadFor(p, "b")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Control.Socket != "/tmp/mine.sock" || cfg.Control.StateDir != "/var/lib/vllm-guard/b" {
		t.Errorf("LoadFor: socket %q state %q, want the file's socket and the instance's state", cfg.Control.Socket, cfg.Control.StateDir)
	}
	cfg, err = Load(p)
	if err != nil || cfg.Control.StateDir != "/var/lib/vllm-guard" {
		t.Errorf("Load (no instance): state %q %v", cfg.Control.StateDir, err)
	}
}
