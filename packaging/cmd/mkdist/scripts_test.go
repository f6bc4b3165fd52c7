package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runScript runs a maintainer script with args on a system where systemd
// runs (a private mount namespace with /run/systemd/system made in a
// tmpfs over /run) and a systemctl that records its arguments; it returns
// the systemctl calls, one a line.
func runScript(t *testing.T, script string, env []string, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	fake := "#!/bin/sh\necho \"$*\" >>" + calls + "\n"
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(script)
	sh := `mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && exec sh "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", sh, "sh", abs}, args...)...)
	cmd.Env = append([]string{"PATH=" + bin + ":/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %q: %v\n%s", script, args, err, out)
	}
	data, err := os.ReadFile(calls)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(data)
}

// Removing the package stops and disables the guards (before their binary
// goes) and reloads systemd (after the units went); an upgrade stops
// nothing; a root filled without a running system (DPKG_ROOT) is left
// alone. Each with the .deb's arguments and the .rpm's.
func TestRemoveScripts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("a private mount namespace needs root; run the tests as root (CI does)")
	}
	stop := "--no-reload disable --now vllm-guard.service\nstop vllm-guard@*.service\n"
	for _, tc := range []struct {
		script string
		env    []string
		args   []string
		want   string
	}{
		{"preremove.sh", nil, []string{"remove"}, stop},
		{"preremove.sh", nil, []string{"0"}, stop},
		{"preremove.sh", nil, []string{"upgrade", "1.2.4"}, ""},
		{"preremove.sh", nil, []string{"1"}, ""},
		{"preremove.sh", []string{"DPKG_ROOT=/srv/image"}, []string{"remove"}, ""},
		{"postremove.sh", nil, []string{"remove"}, "daemon-reload\n"},
		{"postremove.sh", nil, []string{"purge"}, "daemon-reload\n"},
		{"postremove.sh", nil, []string{"0"}, "daemon-reload\n"},
		{"postremove.sh", nil, []string{"upgrade", "1.2.4"}, "daemon-reload\n"},
		{"postremove.sh", []string{"DPKG_ROOT=/srv/image"}, []string{"remove"}, ""},
	} {
		if got := runScript(t, tc.script, tc.env, tc.args...); got != tc.want {
			t.Errorf("%s %s (%s): systemctl called %q; want %q", tc.script, strings.Join(tc.args, " "), strings.Join(tc.env, " "), got, tc.want)
		}
	}
}
