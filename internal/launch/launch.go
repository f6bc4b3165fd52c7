// Package launch owns what one start of vLLM is run with: its command line
// (the operator's command and extra arguments, the rung's profile flags in
// place of the operator's, --host/--port), where vLLM will listen, and its
// environment without the guard's own. The supervisor launches with it; the
// proxy's gate and `vllm-guard check` read where vLLM listens from it.
package launch

import (
	"net"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// profileFlags are the flags the guard owns: whatever the operator wrote for
// them is replaced by the rung in force. --kv-cache-memory-bytes is one of
// them when the rung carries bytes (the operator's value is rung 0's).
var profileFlags = []string{"--max-num-seqs", "--gpu-memory-utilization"}

const kvFlag = "--kv-cache-memory-bytes"

// Endpoint is where the guard reaches vLLM.
type Endpoint struct {
	Host string
	Port int
}

// URL is the endpoint's base URL, http://host:port.
func (e Endpoint) URL() string { return "http://" + net.JoinHostPort(e.Host, strconv.Itoa(e.Port)) }

// BuildArgv returns vLLM's argv for one start: the configured command and
// the extra arguments with any profile flag removed, then the rung's profile
// flags (--kv-cache-memory-bytes too when the rung sizes the KV cache in
// bytes), then --host/--port unless the operator already set them. It also
// returns where vLLM will listen, as the guard must probe it. The rung's
// flags come on the command line, so they override a --config file's.
func BuildArgv(command, extra []string, r policy.Rung, host string, port int) ([]string, Endpoint) {
	ep := Endpoint{Host: host, Port: port}
	var argv []string
	hasHost, hasPort := false, false
	for _, part := range [][]string{command, extra} {
		for i := 0; i < len(part); i++ {
			a := part[i]
			name, val, inline := strings.Cut(a, "=")
			if !strings.HasPrefix(name, "--") {
				argv = append(argv, a)
				continue
			}
			takesValue := !inline && i+1 < len(part) && !strings.HasPrefix(part[i+1], "--")
			if !inline && takesValue {
				val = part[i+1]
			}
			// Any spelling vLLM reads as the flag: --max_num_seqs, --por (an
			// unambiguous abbreviation of --port), --max_num_se.
			name, _ = vllmargs.ResolveFlag(name)
			switch {
			case isProfileFlag(name) || (r.KVCacheMemoryBytes > 0 && isFlagName(name, kvFlag)):
				if takesValue {
					i++
				}
				continue
			case name == "--host":
				hasHost, ep.Host = true, val
			case name == "--port":
				if p, err := strconv.Atoi(val); err == nil {
					hasPort, ep.Port = true, p
				}
			}
			argv = append(argv, a)
			if takesValue && (name == "--host" || name == "--port") {
				argv = append(argv, part[i+1])
				i++
			}
		}
	}
	argv = append(argv,
		"--max-num-seqs", strconv.Itoa(r.MaxNumSeqs),
		"--gpu-memory-utilization", strconv.FormatFloat(r.GPUMemoryUtilization, 'f', -1, 64))
	if r.KVCacheMemoryBytes > 0 {
		argv = append(argv, kvFlag, strconv.FormatUint(r.KVCacheMemoryBytes, 10))
	}
	if !hasHost {
		argv = append(argv, "--host", host)
	}
	if !hasPort {
		argv = append(argv, "--port", strconv.Itoa(port))
	}
	if ep.Host == "" || ep.Host == "0.0.0.0" || ep.Host == "::" {
		ep.Host = "127.0.0.1"
	}
	return argv, ep
}

func isProfileFlag(name string) bool {
	for _, f := range profileFlags {
		if isFlagName(name, f) {
			return true
		}
	}
	return false
}

// isFlagName: name is flag, with any of its dashes written as underscores.
func isFlagName(name, flag string) bool {
	return strings.HasPrefix(name, "--") && strings.ReplaceAll(name[2:], "_", "-") == flag[2:]
}

// ChildEnv is the guard's environment plus [vllm] env, without the systemd
// variables that belong to the guard alone: a child that saw NOTIFY_SOCKET
// could claim readiness or feed the watchdog in the guard's name.
func ChildEnv(base []string, extra map[string]string) []string {
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, over := extra[k]; over || guardOnlyEnv(k) {
			continue
		}
		out = append(out, kv)
	}
	for k, v := range extra {
		if !guardOnlyEnv(k) {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// StartupPlanEnv is vLLM 0.32.0's startup plan switch: with it at 1 a GPU
// boot that profiled memory saves the KV cache size it found under
// {VLLM_CACHE_ROOT}/startup_plan (VLLM_CACHE_ROOT follows XDG_CACHE_HOME,
// the guard's cache folder in its units), and the next boot with the same
// fingerprint skips the memory profiling (docs/standby-facts.md).
const StartupPlanEnv = "VLLM_ENABLE_STARTUP_PLAN"

// VLLMEnv is vLLM's environment for one start: ChildEnv, with the startup
// plan on unless the operator set VLLM_ENABLE_STARTUP_PLAN (in [vllm] env
// or the guard's own environment; "0" turns it off).
func VLLMEnv(base []string, extra map[string]string) []string {
	out := ChildEnv(base, extra)
	for _, kv := range out {
		if strings.HasPrefix(kv, StartupPlanEnv+"=") {
			return out
		}
	}
	return append(out, StartupPlanEnv+"=1")
}

func guardOnlyEnv(k string) bool {
	return k == "NOTIFY_SOCKET" || strings.HasPrefix(k, "WATCHDOG_")
}
