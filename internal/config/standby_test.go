package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// Issue 42: [standby]'s keys load, default as documented, and every
// mistake is refused naming its line.
func TestStandbyKeys(t *testing.T) {
	cfg, err := Load(writeTemp(t, "[vllm]\nport = 9000\n[proxy]\nlisten = \"127.0.0.1:8080\"\n[standby]\nmode = \"process\"\nenv = { CUDA_VISIBLE_DEVICES = \"1\" }\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Standby.Mode != StandbyProcess || cfg.StandbyPort() != 9001 {
		t.Fatalf("mode %q port %d; want process on [vllm] port + 1 = 9001", cfg.Standby.Mode, cfg.StandbyPort())
	}
	cfg.VLLM.Env = map[string]string{"HF_HOME": "/m", "CUDA_VISIBLE_DEVICES": "0"}
	sc := cfg.StandbyConfig()
	if sc.VLLM.Port != 9001 || sc.VLLM.Env["CUDA_VISIBLE_DEVICES"] != "1" || sc.VLLM.Env["HF_HOME"] != "/m" {
		t.Fatalf("the standby's config: port %d env %v; want 9001, its own CUDA_VISIBLE_DEVICES over [vllm] env", sc.VLLM.Port, sc.VLLM.Env)
	}
	if cfg.VLLM.Env["CUDA_VISIBLE_DEVICES"] != "0" || cfg.VLLM.Port != 9000 {
		t.Fatal("StandbyConfig changed vLLM's own config")
	}
	cfg.Standby.Mode = StandbySleep
	if sc := cfg.StandbyConfig(); sc.VLLM.Env["VLLM_SERVER_DEV_MODE"] != "1" || sc.VLLM.Command[len(sc.VLLM.Command)-1] != "--enable-sleep-mode" ||
		slices.Contains(cfg.VLLM.Command, "--enable-sleep-mode") {
		t.Fatalf("a sleep-mode standby: command %v env %v; want sleep mode and its routes, vLLM a's command unchanged", sc.VLLM.Command, sc.VLLM.Env)
	}
	cfg.VLLM.Command = []string{"vllm", "serve", "m", "--port=9000"}
	if _, err := cfg.VLLMArgs(nil); err == nil || !strings.Contains(err.Error(), "each vLLM gets a port of its own") {
		t.Fatalf("a command that sets --port with a standby: %v; want it refused", err)
	}
	cfg.Standby.Mode = StandbyOff
	if _, err := cfg.VLLMArgs(nil); err != nil {
		t.Fatalf("a command that sets --port without a standby: %v", err)
	}
	if d := Default(); d.Standby.Mode != StandbyOff || d.StandbyPort() != d.VLLM.Port+1 {
		t.Fatalf("default [standby]: %+v", d.Standby)
	}

	proxy := "[proxy]\nlisten = \"127.0.0.1:8080\"\n"
	cases := []struct {
		name, body string
		line       int
		key, msg   string
	}{
		{"no proxy", "[standby]\nmode = \"process\"\n", 2, "[standby] mode", "needs [proxy] listen"},
		{"unknown mode", proxy + "[standby]\nmode = \"hot\"\n", 4, "[standby] mode", `"hot" is not a mode`},
		{"vLLM's port", "[vllm]\nport = 9000\n" + proxy + "[standby]\nmode = \"process\"\nport = 9000\n", 7, "[standby] port", "also [vllm] port's"},
		{"the proxy's port", proxy + "[standby]\nmode = \"process\"\nport = 8080\n", 5, "[standby] port", "also [proxy] listen's"},
		{"the control port", "[control]\nhttp_listen = \"127.0.0.1:9555\"\n" + proxy + "[standby]\nmode = \"process\"\nport = 9555\n", 7, "[standby] port", "also [control] http_listen's"},
		{"default port clashes", "[vllm]\nport = 8079\n" + proxy + "[standby]\nmode = \"process\"\n", 4, "[proxy] listen", "port 8080 is also [proxy] listen's"},
		{"port range", proxy + "[standby]\nmode = \"process\"\nport = 70000\n", 5, "[standby] port", "out of range"},
		{"env name", proxy + "[standby]\nmode = \"process\"\nenv = { NOTIFY_SOCKET = \"x\" }\n", 5, "[standby] env", "never passed on"},
		{"unknown key", "[standby]\nports = 1\n", 2, "[standby] ports", "did you mean port?"},
		{"a group", "[group]\nenabled = true\nsize = 2\nleader_address = \"10.0.0.1\"\nsecret_file = \"/run/secret\"\n" + proxy + "[standby]\nmode = \"process\"\n",
			9, "[standby] mode", "with [group] enabled is not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(writeTemp(t, c.body))
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T); want one *Error", err, err)
			}
			if ce.Line != c.line || !strings.Contains(ce.Key, c.key) || !strings.Contains(ce.Error(), c.msg) {
				t.Fatalf("got line %d key %q: %v\nwant line %d key ~%q msg ~%q", ce.Line, ce.Key, ce, c.line, c.key, c.msg)
			}
		})
	}
}
