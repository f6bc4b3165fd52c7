package config

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// Several guards on one host are told apart by an instance name (one per
// vLLM: one per GPU, or one per tensor-parallel group). The name only
// changes defaults; a key the instance's file sets still wins.
const (
	// InstanceEnv names the instance when --instance is not given.
	InstanceEnv = "VLLM_GUARD_INSTANCE"
	// ConfigEnv names the config file when --config is not given.
	ConfigEnv = "VLLM_GUARD_CONFIG"
	// ConfigDir holds /etc/vllm-guard/NAME.toml, one file per instance.
	ConfigDir = "/etc/vllm-guard"
	// RuntimeDir holds the control sockets: guard.sock for the guard with
	// no instance, NAME.sock for each instance.
	RuntimeDir = "/run/vllm-guard"
	// StateRoot is the state folder of the guard with no instance and the
	// parent of each instance's (StateRoot/NAME).
	StateRoot = "/var/lib/vllm-guard"
)

// instanceName is what an instance may be called: it becomes a file name
// in three folders, so no slash, no leading dot, nothing a shell or
// systemd's %i would have to escape.
var instanceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Instance returns the instance name: flagValue, else $VLLM_GUARD_INSTANCE,
// else "" (no instance: the single-guard defaults). A name that cannot be a
// file name is an error that says what is allowed.
func Instance(flagValue string) (string, error) {
	name, from := flagValue, "--instance"
	if name == "" {
		name, from = os.Getenv(InstanceEnv), "$"+InstanceEnv
	}
	if name == "" {
		return "", nil
	}
	if !instanceName.MatchString(name) {
		return "", fmt.Errorf("%s %q: an instance name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit (it names %s/NAME.toml, %s/NAME.sock and %s/NAME)",
			from, name, ConfigDir, RuntimeDir, StateRoot)
	}
	return name, nil
}

// InstanceConfig is an instance's config file: /etc/vllm-guard/NAME.toml.
func InstanceConfig(name string) string { return filepath.Join(ConfigDir, name+".toml") }

// InstanceSocket is an instance's control socket: /run/vllm-guard/NAME.sock.
func InstanceSocket(name string) string { return filepath.Join(RuntimeDir, name+".sock") }

// InstanceStateDir is an instance's state folder: /var/lib/vllm-guard/NAME.
func InstanceStateDir(name string) string { return filepath.Join(StateRoot, name) }

// DefaultFor is Default() with the instance's socket and state folder;
// DefaultFor("") is Default(). [control] http_listen and vLLM's port keep
// their defaults: two instances must set them apart in their files (a port
// taken by another instance stops the guard with exit 78, naming the key).
func DefaultFor(instance string) *Config {
	c := Default()
	if instance != "" {
		c.Control.Socket = InstanceSocket(instance)
		c.Control.StateDir = InstanceStateDir(instance)
	}
	return c
}

// ResolveFor picks the config file for an instance: --config, else the
// instance's /etc/vllm-guard/NAME.toml (returned even when missing, so the
// error names it rather than another instance's file), else Resolve's
// order ($VLLM_GUARD_CONFIG, ./vllm-guard.toml, /etc/vllm-guard/vllm-guard.toml).
func ResolveFor(flagValue, instance string) string {
	if flagValue != "" {
		return flagValue
	}
	if instance != "" {
		return InstanceConfig(instance)
	}
	return Resolve("")
}
