package config

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Validate checks the ranges and relations of a Config built in code (tests,
// Default() with changes). Load runs the same checks with line numbers.
func (c *Config) Validate() error {
	ch := &checker{file: c.Path}
	ch.validate(c)
	return ch.result()
}

// k is a key path: k("restart", "max_delay").
func k(p ...string) []string { return p }

// at returns the first of paths written in the file, so a clash between a
// written value and a default points at the line the operator wrote.
func (c *checker) at(paths ...[]string) []string {
	for _, p := range paths {
		if c.pos.has(p) {
			return p
		}
	}
	return paths[0]
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// The predicates are written so that NaN fails them ("nan" is valid TOML).
func (c *checker) fraction(p []string, v float64, lowOpen bool, hi float64, hiOpen bool, what string) bool {
	ok := finite(v) && (v > 0 || !lowOpen && v >= 0) && (v < hi || !hiOpen && v <= hi)
	if ok {
		return true
	}
	lo := "0 or more"
	if lowOpen {
		lo = "more than 0"
	}
	up := fmt.Sprintf("at most %g", hi)
	if hiOpen {
		up = fmt.Sprintf("less than %g", hi)
	}
	c.add(p, "%g is out of range; allowed: %s and %s (%s)", v, lo, up, what)
	return false
}

// durationRange bounds one duration key. Every duration has a floor (a
// "1ns" interval made the guard spin at 87 % of a core) and a ceiling (no
// wait worth configuring is longer, and the guard adds and multiplies these
// values: a ceiling keeps that arithmetic far from overflow).
type durationRange struct {
	min, max time.Duration
	off      bool   // "0s" is allowed and turns the feature off
	what     string // what the key does, in the operator's words
	example  string
}

// durationRanges is every duration key's bounds; TestEveryDurationIsBounded
// checks that none is missing.
var durationRanges = map[string]durationRange{
	"vllm.stop_timeout":        {100 * time.Millisecond, time.Hour, false, "the wait between SIGTERM and SIGKILL when vLLM stops", "30s"},
	"vllm.port_wait":           {0, time.Hour, false, "at the first start, how long vLLM's port may be held by another process before exit 78", "30s"},
	"profile.restore_after":    {10 * time.Second, 30 * 24 * time.Hour, true, "ready this long on a lower rung before trying one rung up", "2h"},
	"readiness.poll_interval":  {10 * time.Millisecond, time.Minute, false, "how often the guard probes vLLM while it loads", "250ms"},
	"readiness.probe_timeout":  {10 * time.Millisecond, 10 * time.Minute, false, "the bound of one readiness probe", "2s"},
	"readiness.stall_timeout":  {time.Second, 24 * time.Hour, false, "no load progress this long while starting is a hang", "10m"},
	"readiness.max_start_time": {time.Second, 7 * 24 * time.Hour, true, "the hard cap on a start", "1h"},
	"liveness.interval":        {100 * time.Millisecond, time.Hour, false, "how often the guard checks /health while vLLM is ready", "10s"},
	"liveness.timeout":         {10 * time.Millisecond, 10 * time.Minute, false, "the bound of one /health check", "5s"},
	"liveness.stuck_timeout":   {time.Second, 24 * time.Hour, true, "running requests with no token counter advancing this long is a hang", "60s"},
	"gpu.sample_interval":      {10 * time.Millisecond, 15 * time.Second, false, "how often GPU memory is sampled; the trend fits the last minute of samples and needs several", "1s"},
	"gpu.predict_horizon":      {time.Second, 24 * time.Hour, false, "alert when the trend reaches critical within this", "10m"},
	"gpu.release_timeout":      {0, time.Hour, false, "the wait for an exited vLLM's GPU memory to come back", "60s"},
	"restart.initial_delay":    {10 * time.Millisecond, time.Hour, false, "the first backoff delay", "5s"},
	"restart.max_delay":        {10 * time.Millisecond, 24 * time.Hour, false, "the longest backoff delay", "5m"},
	"restart.reset_after":      {time.Second, 30 * 24 * time.Hour, false, "ready this long resets the backoff and crash-loop counts", "10m"},
	"restart.give_up_window":   {time.Second, 30 * 24 * time.Hour, false, "the window in which give_up_after failed starts give up", "1h"},
	"proxy.queue_timeout":      {0, time.Hour, false, "how long a request may wait for a slot; 0 answers at once", "30s"},
	"proxy.write_timeout":      {time.Second, time.Hour, false, "a client that reads none of its answer this long loses its request and slot", "30s"},
	"proxy.hold_timeout":       {0, 24 * time.Hour, false, "how long a request is held while vLLM restarts; 0 learns it from the restarts seen", "10m"},
	// [group]
	"group.heartbeat_interval":      {100 * time.Millisecond, 10 * time.Second, false, "how often the group's guards tell each other they are alive", "1s"},
	"group.loss_timeout":            {200 * time.Millisecond, 5 * time.Minute, false, "a member not heard from this long is lost and the group restarts", "5s"},
	"group.distributed_timeout":     {10 * time.Second, time.Hour, true, "vLLM's --distributed-timeout-seconds (torch's process groups; NCCL's own is 10 min)", "2m"},
	"group.cpu_distributed_timeout": {10 * time.Second, time.Hour, true, "vLLM's --cpu-distributed-timeout-seconds (gloo's own is 30 min)", "2m"},
	"group.engine_ready_timeout":    {10 * time.Second, time.Hour, true, "VLLM_ENGINE_READY_TIMEOUT_S, the leader's wait for its engines (vLLM's own is 10 min)", "3m"},
}

// checkDurations applies durationRanges to every duration of cfg.
func (c *checker) checkDurations(path []string, v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := tomlName(f)
		if name == "" {
			continue
		}
		p := append(slices.Clip(path), name)
		switch {
		case f.Type == durationType:
			d := v.Field(i).Interface().(Duration)
			if d.Duration < 0 {
				c.add(p, "%s is negative; write a duration of \"0s\" or more", tomlQuote(d.String()))
				continue
			}
			r, ok := durationRanges[strings.Join(p, ".")]
			if !ok {
				c.add(p, "has no allowed range; this is a bug, please report it")
				continue
			}
			if (r.off && d.Duration == 0) || (d.Duration >= r.min && d.Duration <= r.max) {
				continue
			}
			allowed := fmt.Sprintf("%s to %s", formatDuration(r.min), formatDuration(r.max))
			if r.off {
				allowed = fmt.Sprintf("\"0s\" (off) or %s", allowed)
			}
			c.add(p, "%s is out of range; allowed: %s (%s), such as %s", tomlQuote(d.String()), allowed, r.what, tomlQuote(r.example))
		case f.Type.Kind() == reflect.Struct:
			c.checkDurations(p, v.Field(i))
		}
	}
}

// Size limits.
const (
	// MaxChildLines caps [log] child_lines: the ring of vLLM's last lines
	// holds lines of up to 16 KiB (longer ones are cut), so 4096 lines
	// bound it, and the tail of an incident record, at 64 MiB. 100 000
	// lines allowed a 1.6 GB ring.
	MaxChildLines = 4096
	// MaxMaxNumSeqs is far above any vLLM deployment, and keeps
	// max_num_seqs × inflight_factor a small integer.
	MaxMaxNumSeqs     = 1 << 20
	MaxInflightFactor = 64
	MaxQueueSize      = 1 << 20
	MaxBodyBytes      = 1 << 30
	MaxConnections    = 1 << 20
	MaxBufferedBytes  = 1 << 40
	MaxResumeLimit    = 100
)

func (c *checker) validate(cfg *Config) {
	c.checkDurations(nil, reflect.ValueOf(cfg).Elem())

	v := cfg.VLLM
	if len(v.Command) == 0 || strings.TrimSpace(v.Command[0]) == "" {
		c.add(k("vllm", "command"), "is empty; write the argv that starts vLLM, such as [\"vllm\", \"serve\", \"Qwen/Qwen2.5-7B-Instruct\"]")
	}
	for _, a := range v.Command {
		for _, flag := range []string{"--max-num-seqs", "--gpu-memory-utilization"} {
			if a == flag || strings.HasPrefix(a, flag+"=") {
				c.add(k("vllm", "command"), "contains %s; the guard sets it from [profile] and steps it down after an OOM: remove it from the command and set [profile] %s", flag, strings.ReplaceAll(strings.TrimPrefix(flag, "--"), "-", "_"))
			}
		}
	}
	if strings.TrimSpace(v.Host) == "" {
		c.add(k("vllm", "host"), "is empty; write the address where the guard reaches vLLM, such as \"127.0.0.1\"")
	}
	if v.Port < 1 || v.Port > 65535 {
		c.add(k("vllm", "port"), "%d is out of range; allowed: 1 to 65535", v.Port)
	}
	for name := range v.Env {
		p := k("vllm", "env", name)
		switch {
		case name == "NOTIFY_SOCKET" || strings.HasPrefix(name, "WATCHDOG_"):
			c.add(p, "is never passed on to vLLM: it belongs to the guard's own systemd notification; remove it")
		case name == "" || strings.ContainsAny(name, "=\x00"):
			c.add(p, "is not a valid environment variable name; names cannot be empty or contain '=' or NUL")
		}
		if strings.ContainsRune(v.Env[name], 0) {
			c.add(p, "the value contains a NUL byte, which an environment variable cannot hold")
		}
	}

	pr := cfg.Profile
	if pr.MaxNumSeqs < 1 || pr.MaxNumSeqs > MaxMaxNumSeqs {
		c.add(k("profile", "max_num_seqs"), "%d is out of range; allowed: 1 to %d (the most sequences vLLM runs at once on rung 0)", pr.MaxNumSeqs, MaxMaxNumSeqs)
	}
	okUtil := c.fraction(k("profile", "gpu_memory_utilization"), pr.GPUMemoryUtilization, true, 1, false, "the share of each GPU's memory vLLM may use, such as 0.85")
	c.fraction(k("profile", "max_num_seqs_factor"), pr.MaxNumSeqsFactor, true, 1, true, "each OOM multiplies max_num_seqs by this, such as 0.5")
	if pr.MinMaxNumSeqs < 1 {
		c.add(k("profile", "min_max_num_seqs"), "%d is out of range; allowed: 1 or more, and at most max_num_seqs (%d)", pr.MinMaxNumSeqs, pr.MaxNumSeqs)
	} else if pr.MaxNumSeqs >= 1 && pr.MinMaxNumSeqs > pr.MaxNumSeqs {
		p := c.at(k("profile", "min_max_num_seqs"), k("profile", "max_num_seqs"))
		c.add(p, "min_max_num_seqs (%d) is above max_num_seqs (%d); the floor of the ladder must be at most rung 0: lower min_max_num_seqs or raise max_num_seqs", pr.MinMaxNumSeqs, pr.MaxNumSeqs)
	}
	c.fraction(k("profile", "gpu_memory_utilization_step"), pr.GPUMemoryUtilizationStep, false, 1, true, "each OOM lowers gpu_memory_utilization by this, such as 0.05; 0 keeps it")
	okMin := c.fraction(k("profile", "min_gpu_memory_utilization"), pr.MinGPUMemoryUtilization, true, 1, false, "the floor of gpu_memory_utilization, such as 0.70")
	if okUtil && okMin && pr.MinGPUMemoryUtilization > pr.GPUMemoryUtilization {
		p := c.at(k("profile", "min_gpu_memory_utilization"), k("profile", "gpu_memory_utilization"))
		c.add(p, "min_gpu_memory_utilization (%g) is above gpu_memory_utilization (%g); the floor must be at most rung 0's value", pr.MinGPUMemoryUtilization, pr.GPUMemoryUtilization)
	}
	c.fraction(k("profile", "headroom"), pr.Headroom, false, 1, true, "the share of GPU memory computed rungs keep free, such as 0.15")

	r := cfg.Readiness
	switch r.Probe {
	case "auto", "health", "models", "completion":
	default:
		c.add(k("readiness", "probe"), "%s is not a probe; allowed: \"auto\" (the deepest request the model serves), \"completion\", \"models\" or \"health\"", tomlQuote(r.Probe))
	}

	l := cfg.Liveness
	if l.Failures < 1 {
		c.add(k("liveness", "failures"), "%d is out of range; allowed: 1 or more (consecutive failed checks that mean a hang)", l.Failures)
	}

	g := cfg.GPU
	for i, d := range g.Devices {
		if strings.TrimSpace(d) == "" {
			c.add(k("gpu", "devices"), "element %d is empty; write a GPU index such as \"0\" or a UUID such as \"GPU-…\"", i+1)
		}
	}
	okWO := c.fraction(k("gpu", "warn_over_budget"), g.WarnOverBudget, true, 0.5, false, "memory beyond vLLM's budget, as a share of total, that raises gpu_memory_warn, such as 0.03")
	okCO := c.fraction(k("gpu", "critical_over_budget"), g.CriticalOverBudget, true, 0.5, false, "memory beyond vLLM's budget, as a share of total, that raises gpu_memory_critical, such as 0.05")
	if okWO && okCO && g.WarnOverBudget >= g.CriticalOverBudget {
		p := c.at(k("gpu", "warn_over_budget"), k("gpu", "critical_over_budget"))
		c.add(p, "warn_over_budget (%g) must be below critical_over_budget (%g): the warning comes first", g.WarnOverBudget, g.CriticalOverBudget)
	}
	// The fixed thresholds of older configs still work, but one at or below
	// vLLM's budget would fire for the whole run: vLLM holds utilization ×
	// total from the end of its load on.
	okWarn := g.WarnFraction == 0 || c.fraction(k("gpu", "warn_fraction"), g.WarnFraction, true, 1, true, "fixed used/total that raises gpu_memory_warn; 0 (the default) follows warn_over_budget")
	okCrit := g.CriticalFraction == 0 || c.fraction(k("gpu", "critical_fraction"), g.CriticalFraction, true, 1, false, "fixed used/total that raises gpu_memory_critical; 0 (the default) follows critical_over_budget")
	for _, t := range []struct {
		key, instead string
		v            float64
		ok           bool
	}{{"warn_fraction", "warn_over_budget", g.WarnFraction, okWarn}, {"critical_fraction", "critical_over_budget", g.CriticalFraction, okCrit}} {
		if t.v > 0 && t.ok && okUtil && t.v <= pr.GPUMemoryUtilization {
			p := c.at(k("gpu", t.key), k("profile", "gpu_memory_utilization"))
			c.add(p, "%s (%g) is at or below gpu_memory_utilization (%g): vLLM holds that share of the GPU for its whole run, so the alert would always fire; "+
				"remove %s and set %s (memory beyond vLLM's budget, such as 0.03)", t.key, t.v, pr.GPUMemoryUtilization, t.key, t.instead)
		}
	}
	if g.WarnFraction > 0 && g.CriticalFraction > 0 && okWarn && okCrit && g.WarnFraction >= g.CriticalFraction {
		p := c.at(k("gpu", "warn_fraction"), k("gpu", "critical_fraction"))
		c.add(p, "warn_fraction (%g) must be below critical_fraction (%g): the warning comes first", g.WarnFraction, g.CriticalFraction)
	}

	rs := cfg.Restart
	if rs.MaxDelay.Duration < rs.InitialDelay.Duration {
		p := c.at(k("restart", "max_delay"), k("restart", "initial_delay"))
		c.add(p, "max_delay (%s) is below initial_delay (%s); the backoff grows from initial_delay up to max_delay", rs.MaxDelay, rs.InitialDelay)
	}
	if !finite(rs.Multiplier) || rs.Multiplier < 1 {
		c.add(k("restart", "multiplier"), "%g is out of range; allowed: 1 or more (each failed start multiplies the delay by this, such as 2.0)", rs.Multiplier)
	}
	c.fraction(k("restart", "jitter"), rs.Jitter, false, 1, true, "each delay varies randomly by up to this share, such as 0.2")
	if rs.GiveUpAfter < 1 {
		c.add(k("restart", "give_up_after"), "%d is out of range; allowed: 1 or more (failed starts within give_up_window before giving up)", rs.GiveUpAfter)
	}
	switch cfg.GPU.OnGPUFault {
	case "exit", "stay":
	default:
		c.add(k("gpu", "on_gpu_fault"), "%s is not allowed; write \"exit\" (exit 69 after a GPU fault that needs a reset: systemd does not restart it, Kubernetes restarts the container and its guard waits on the GPU, not ready) or \"stay\" (keep serving status, state failed, naming the GPU)", tomlQuote(cfg.GPU.OnGPUFault))
	}
	switch rs.OnGiveUp {
	case "exit", "stay":
	default:
		c.add(k("restart", "on_give_up"), "%s is not allowed; write \"exit\" (exit 1 and let systemd or Kubernetes decide) or \"stay\" (keep serving status, state failed)", tomlQuote(rs.OnGiveUp))
	}

	ct := cfg.Control
	switch {
	case strings.TrimSpace(ct.Socket) == "":
		c.add(k("control", "socket"), "is empty; write the path of the control socket, such as \"/run/vllm-guard/guard.sock\"")
	case len(ct.Socket) > 107:
		c.add(k("control", "socket"), "is %d bytes long; a unix socket path holds at most 107: choose a shorter path", len(ct.Socket))
	}
	c.listenAddr(k("control", "http_listen"), ct.HTTPListen, "127.0.0.1:9461")
	if strings.TrimSpace(ct.StateDir) == "" {
		c.add(k("control", "state_dir"), "is empty; write a directory the guard can write, such as \"/var/lib/vllm-guard\"")
	}

	a := cfg.Alerts
	if len(a.Command) > 0 && strings.TrimSpace(a.Command[0]) == "" {
		c.add(k("alerts", "command"), "starts with an empty program name; write an argv such as [\"/usr/local/bin/page-oncall\"] or [] for none")
	}
	if a.Webhook != "" {
		u, err := url.Parse(a.Webhook)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			c.add(k("alerts", "webhook"), "%s is not an http(s) URL; write one such as \"https://hooks.example.com/vllm\" or \"\" for none", tomlQuote(a.Webhook))
		}
	}

	px := cfg.Proxy
	c.listenAddr(k("proxy", "listen"), px.Listen, "0.0.0.0:8080")
	if px.Listen != "" && px.Listen == ct.HTTPListen {
		p := c.at(k("proxy", "listen"), k("control", "http_listen"))
		c.add(p, "%s is used by both [proxy] listen and [control] http_listen; give them different ports", tomlQuote(px.Listen))
	}
	if !finite(px.InflightFactor) || px.InflightFactor <= 0 || px.InflightFactor > MaxInflightFactor {
		c.add(k("proxy", "inflight_factor"), "%g is out of range; allowed: more than 0 and at most %d (requests in flight = max_num_seqs × this, such as 1.0)", px.InflightFactor, MaxInflightFactor)
	}
	if px.QueueSize < 0 || px.QueueSize > MaxQueueSize {
		c.add(k("proxy", "queue_size"), "%d is out of range; allowed: 0 to %d (requests that may wait; 0 rejects at once)", px.QueueSize, MaxQueueSize)
	}
	if px.MaxBodyBytes <= 0 || px.MaxBodyBytes > MaxBodyBytes {
		c.add(k("proxy", "max_body_bytes"), "%d is out of range; allowed: 1 to %d (1 GiB; the largest request body, such as 16777216)", px.MaxBodyBytes, MaxBodyBytes)
	}
	if px.MaxConnections < 1 || px.MaxConnections > MaxConnections {
		c.add(k("proxy", "max_connections"), "%d is out of range; allowed: 1 to %d (open client connections; more are closed at accept, such as 1024)", px.MaxConnections, MaxConnections)
	}
	if px.MaxConnectionsPerClient < 0 || px.MaxConnectionsPerClient > MaxConnections {
		c.add(k("proxy", "max_connections_per_client"), "%d is out of range; allowed: 0 (a quarter of max_connections) or 1 to %d (connections of one client address with a request in progress, such as 256; behind a load balancer, list it in trusted_proxies)",
			px.MaxConnectionsPerClient, MaxConnections)
	}
	bodyOK := px.MaxBodyBytes > 0 && px.MaxBodyBytes <= MaxBodyBytes
	if px.MaxBufferedBytes < 1 || px.MaxBufferedBytes > MaxBufferedBytes || (bodyOK && px.MaxBufferedBytes < px.MaxBodyBytes) {
		c.add(k("proxy", "max_buffered_bytes"), "%d is out of range; allowed: max_body_bytes (%d) to %d (request bodies held in memory at once, all requests together, such as 536870912)",
			px.MaxBufferedBytes, px.MaxBodyBytes, int64(MaxBufferedBytes))
	}
	if pc := px.MaxBufferedBytesPerClient; pc != 0 && (pc < 0 || pc > px.MaxBufferedBytes || (bodyOK && pc < px.MaxBodyBytes)) {
		c.add(k("proxy", "max_buffered_bytes_per_client"), "%d is out of range; allowed: 0 (a quarter of max_buffered_bytes) or max_body_bytes (%d) to max_buffered_bytes (%d); behind a load balancer, max_buffered_bytes",
			pc, px.MaxBodyBytes, px.MaxBufferedBytes)
	}
	if _, err := TrustedPrefixes(px.TrustedProxies); err != nil {
		c.add(k("proxy", "trusted_proxies"), "%s; list the addresses of your load balancers, or [] to trust no client's X-Forwarded-For", err.Error())
	}
	if px.ResumeLimit < 1 || px.ResumeLimit > MaxResumeLimit {
		c.add(k("proxy", "resume_limit"), "%d is out of range; allowed: 1 to %d (a request in flight at this many deaths of vLLM is not sent again, such as 2)", px.ResumeLimit, MaxResumeLimit)
	}

	c.validateWeights(cfg)
	c.checkStandby(cfg)

	lg := cfg.Log
	switch lg.Level {
	case "debug", "info", "warn", "error":
	default:
		c.add(k("log", "level"), "%s is not a level; allowed: \"debug\", \"info\", \"warn\" or \"error\"", tomlQuote(lg.Level))
	}
	switch lg.Format {
	case "auto", "json", "console":
	default:
		c.add(k("log", "format"), "%s is not a format; allowed: \"auto\", \"json\" or \"console\"", tomlQuote(lg.Format))
	}
	if lg.ChildLines < 1 || lg.ChildLines > MaxChildLines {
		c.add(k("log", "child_lines"), "%d is out of range; allowed: 1 to %d (lines of up to 16 KiB each: at most 64 MiB of vLLM output kept)", lg.ChildLines, MaxChildLines)
	}
	c.validateGroup(cfg)
}

// listenAddr accepts "" (disabled) or host:port with a numeric port.
func (c *checker) listenAddr(p []string, addr, example string) {
	if addr == "" {
		return
	}
	_, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n < 0 || n > 65535 {
		c.add(p, "%s is not host:port; write one such as %s, or \"\" to disable", tomlQuote(addr), tomlQuote(example))
	}
}

// validateWeights checks [weights]: the weight cache daemon.
func (c *checker) validateWeights(cfg *Config) {
	w := cfg.Weights
	switch w.Cache {
	case "auto", "daemon", "off":
	default:
		c.add(k("weights", "cache"), "%s is not a choice; allowed: \"auto\" (the weight cache daemon when vLLM's command has --load-format ipc_cache), \"daemon\" (always, adding that flag) or \"off\"", tomlQuote(w.Cache))
	}
	if w.HealthPort < 0 || w.HealthPort > 65535 {
		c.add(k("weights", "health_port"), "%d is out of range; allowed: 0 (a free port at each start of the daemon) or 1 to 65535", w.HealthPort)
	} else if w.HealthPort != 0 && w.HealthPort == cfg.VLLM.Port {
		p := c.at(k("weights", "health_port"), k("vllm", "port"))
		c.add(p, "%d is vLLM's port too; give the weight cache daemon's /health another port, or 0 for a free one", w.HealthPort)
	}
}

// checkStandby checks [standby]: its mode, a port of its own, its env, and
// the proxy it is reached through.
func (c *checker) checkStandby(cfg *Config) {
	sb := cfg.Standby
	switch sb.Mode {
	case StandbyOff:
		return
	case StandbyProcess, StandbySleep:
	default:
		c.add(k("standby", "mode"), "%s is not a mode; allowed: \"off\" (no standby), \"process\" (a second vLLM on its own devices and port, serving at once when the first dies) or \"sleep\" (a second vLLM asleep on the same GPUs, woken when the first dies)", tomlQuote(sb.Mode))
		return
	}
	if cfg.Group.Enabled {
		p := c.at(k("standby", "mode"), k("group", "enabled"))
		c.add(p, "%s with [group] enabled is not supported yet: a vLLM across hosts has no standby; set mode = \"off\" or disable the group", tomlQuote(sb.Mode))
	}
	if cfg.Proxy.Listen == "" {
		p := c.at(k("standby", "mode"), k("proxy", "listen"))
		c.add(p, "%s needs [proxy] listen: clients reach a standby only through the guard's proxy, which routes to whichever vLLM serves; set [proxy] listen (such as \"0.0.0.0:8080\") and point clients at it, or set mode = \"off\"", tomlQuote(sb.Mode))
	}
	if sb.Port < 0 || sb.Port > 65535 {
		c.add(k("standby", "port"), "%d is out of range; allowed: 0 ([vllm] port + 1) or 1 to 65535", sb.Port)
		return
	}
	port := cfg.StandbyPort()
	for _, other := range []struct {
		key  []string
		name string
		port int
	}{{k("vllm", "port"), "[vllm] port", cfg.VLLM.Port}, {k("proxy", "listen"), "[proxy] listen", listenPort(cfg.Proxy.Listen)},
		{k("control", "http_listen"), "[control] http_listen", listenPort(cfg.Control.HTTPListen)}} {
		if other.port == port {
			p := c.at(k("standby", "port"), other.key)
			c.add(p, "the standby vLLM's port %d is also %s's; give the standby a port of its own with [standby] port", port, other.name)
		}
	}
	if port > 65535 {
		c.add(c.at(k("standby", "port"), k("vllm", "port")), "the standby vLLM's port would be [vllm] port + 1 = %d, out of range; set [standby] port", port)
	}
	for name := range sb.Env {
		p := k("standby", "env", name)
		switch {
		case name == "NOTIFY_SOCKET" || strings.HasPrefix(name, "WATCHDOG_"):
			c.add(p, "is never passed on to vLLM: it belongs to the guard's own systemd notification; remove it")
		case name == "" || strings.ContainsAny(name, "=\x00"):
			c.add(p, "is not a valid environment variable name; names cannot be empty or contain '=' or NUL")
		}
		if strings.ContainsRune(sb.Env[name], 0) {
			c.add(p, "the value contains a NUL byte, which an environment variable cannot hold")
		}
	}
}

// listenPort is the port of a host:port listen address (-1: none).
func listenPort(addr string) int {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(port)
	if err != nil || n == 0 {
		return -1
	}
	return n
}
