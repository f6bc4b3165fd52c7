// Package config owns vllm-guard.toml: its schema, its defaults,
// strict decoding (file:line:key errors) and validation.
package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Duration is a TOML string such as "5s" or "10m". A bare number is an error:
// it would otherwise silently become nanoseconds.
type Duration struct{ time.Duration }

// Config is the whole vllm-guard.toml.
type Config struct {
	VLLM      VLLM      `toml:"vllm"`
	Profile   Profile   `toml:"profile"`
	Readiness Readiness `toml:"readiness"`
	Liveness  Liveness  `toml:"liveness"`
	GPU       GPU       `toml:"gpu"`
	Restart   Restart   `toml:"restart"`
	Control   Control   `toml:"control"`
	Alerts    Alerts    `toml:"alerts"`
	Proxy     Proxy     `toml:"proxy"`
	Standby   Standby   `toml:"standby"`
	Log       Log       `toml:"log"`
	Weights   Weights   `toml:"weights"`
	Group     Group     `toml:"group"`

	// Path is the file the config was read from ("" for defaults only).
	Path string `toml:"-"`
}

type VLLM struct {
	Command         []string          `toml:"command"`
	Host            string            `toml:"host"`
	Port            int               `toml:"port"`
	ServedModelName string            `toml:"served_model_name"`
	Env             map[string]string `toml:"env"`
	Workdir         string            `toml:"workdir"`
	StopTimeout     Duration          `toml:"stop_timeout"`
	// PortWait: at the guard's first start, how long another process may
	// hold vLLM's port before the guard stops with exit 78 (at a restart
	// it waits as long as it takes).
	PortWait Duration `toml:"port_wait"`
}

// Profile is rung 0 of the degrade ladder and the rules that compute the others.
type Profile struct {
	MaxNumSeqs               int      `toml:"max_num_seqs"`
	GPUMemoryUtilization     float64  `toml:"gpu_memory_utilization"`
	MaxNumSeqsFactor         float64  `toml:"max_num_seqs_factor"`
	MinMaxNumSeqs            int      `toml:"min_max_num_seqs"`
	GPUMemoryUtilizationStep float64  `toml:"gpu_memory_utilization_step"`
	MinGPUMemoryUtilization  float64  `toml:"min_gpu_memory_utilization"`
	RestoreAfter             Duration `toml:"restore_after"`
	Headroom                 float64  `toml:"headroom"`
}

type Readiness struct {
	Probe        string   `toml:"probe"` // "auto" | "completion" | "models" | "health"
	PollInterval Duration `toml:"poll_interval"`
	ProbeTimeout Duration `toml:"probe_timeout"`
	StallTimeout Duration `toml:"stall_timeout"`
	MaxStartTime Duration `toml:"max_start_time"`
}

type Liveness struct {
	Interval Duration `toml:"interval"`
	Timeout  Duration `toml:"timeout"`
	Failures int      `toml:"failures"`
	// StuckTimeout: vLLM reports running requests and none of its token
	// counters advances this long => hang. 0 disables.
	StuckTimeout Duration `toml:"stuck_timeout"`
}

type GPU struct {
	Devices        []string `toml:"devices"`
	SampleInterval Duration `toml:"sample_interval"`
	// WarnOverBudget and CriticalOverBudget: memory beyond vLLM's own
	// budget (utilization × total, or what it held once loaded), as a
	// fraction of total, that raises gpu_memory_warn and gpu_memory_critical.
	WarnOverBudget     float64 `toml:"warn_over_budget"`
	CriticalOverBudget float64 `toml:"critical_over_budget"`
	// WarnFraction and CriticalFraction are fixed used/total thresholds
	// (the keys before the budget-relative ones); 0 = follow the budget.
	WarnFraction     float64  `toml:"warn_fraction"`
	CriticalFraction float64  `toml:"critical_fraction"`
	PredictHorizon   Duration `toml:"predict_horizon"`
	ReleaseTimeout   Duration `toml:"release_timeout"`
	// OnGPUFault: after a GPU fault that needs a reset, "exit" (exit code
	// 69: systemd does not restart it; Kubernetes restarts the container,
	// whose guard waits on the GPU still lost, not ready) or
	// "stay" (state failed, the GPU and what to do in the reason).
	OnGPUFault string `toml:"on_gpu_fault"`
}

type Restart struct {
	InitialDelay Duration `toml:"initial_delay"`
	MaxDelay     Duration `toml:"max_delay"`
	Multiplier   float64  `toml:"multiplier"`
	Jitter       float64  `toml:"jitter"`
	ResetAfter   Duration `toml:"reset_after"`
	GiveUpAfter  int      `toml:"give_up_after"`
	GiveUpWindow Duration `toml:"give_up_window"`
	OnGiveUp     string   `toml:"on_give_up"` // "exit" | "stay"
}

type Control struct {
	Socket     string `toml:"socket"`
	HTTPListen string `toml:"http_listen"`
	StateDir   string `toml:"state_dir"`
}

// Standby is a second vLLM kept warm beside the serving one (issue 42):
// on a death of the serving vLLM the proxy routes to it at once.
type Standby struct {
	// Mode: "off" (no standby), "process" (a second vLLM with the same
	// command on its own devices and port, started once the first is
	// ready) or "sleep" (a second vLLM on the same GPUs, started first and
	// put to sleep, woken when the first dies).
	Mode string `toml:"mode"`
	// Port is the standby vLLM's port; 0: [vllm] port + 1.
	Port int `toml:"port"`
	// Env is merged over [vllm] env for the standby only (its own
	// CUDA_VISIBLE_DEVICES, or on the CPU build its own cores).
	Env map[string]string `toml:"env"`
}

// Standby modes.
const (
	StandbyOff     = "off"
	StandbyProcess = "process"
	StandbySleep   = "sleep"
)

// StandbyPort is the standby vLLM's port: [standby] port, or [vllm] port + 1.
func (c *Config) StandbyPort() int {
	if c.Standby.Port != 0 {
		return c.Standby.Port
	}
	return c.VLLM.Port + 1
}

// StandbyConfig is the configuration the standby vLLM runs with: the same
// as vLLM's but for its port and its environment ([standby] env merged
// over [vllm] env); with mode "sleep" also vLLM's sleep mode
// (--enable-sleep-mode) and its routes (VLLM_SERVER_DEV_MODE=1), unless
// already set. The result shares nothing mutable with c.
func (c *Config) StandbyConfig() *Config {
	sc := *c
	sc.VLLM.Port = c.StandbyPort()
	env := make(map[string]string, len(c.VLLM.Env)+len(c.Standby.Env)+1)
	for k, v := range c.VLLM.Env {
		env[k] = v
	}
	for k, v := range c.Standby.Env {
		env[k] = v
	}
	sc.VLLM.Command = append([]string(nil), c.VLLM.Command...)
	if c.Standby.Mode == StandbySleep {
		if _, set := env["VLLM_SERVER_DEV_MODE"]; !set {
			env["VLLM_SERVER_DEV_MODE"] = "1"
		}
		if !slices.Contains(sc.VLLM.Command, "--enable-sleep-mode") {
			sc.VLLM.Command = append(sc.VLLM.Command, "--enable-sleep-mode")
		}
	}
	sc.VLLM.Env = env
	return &sc
}

type Alerts struct {
	Command []string `toml:"command"`
	Webhook string   `toml:"webhook"`
}

type Proxy struct {
	Listen         string   `toml:"listen"`
	InflightFactor float64  `toml:"inflight_factor"`
	QueueSize      int      `toml:"queue_size"`
	QueueTimeout   Duration `toml:"queue_timeout"`
	MaxBodyBytes   int64    `toml:"max_body_bytes"`
	// WriteTimeout: a client that accepts none of its answer for this long
	// (a write to it makes no progress) loses its request and its slot.
	WriteTimeout Duration `toml:"write_timeout"`
	// MaxConnections caps the proxy's open client connections; those over
	// it are closed at accept.
	MaxConnections int `toml:"max_connections"`
	// MaxConnectionsPerClient caps the connections of one client address
	// that have a request in progress; idle ones, and those still
	// receiving their request's body, give way to newcomers. 0: a quarter
	// of the connection cap (at least 4). Behind a peer in TrustedProxies
	// it is the share of each client that peer forwards.
	MaxConnectionsPerClient int `toml:"max_connections_per_client"`
	// MaxBufferedBytes bounds the request bodies the proxy holds in memory
	// at once, all requests together (read before admission, sent to vLLM
	// and again after a planned restart from the one copy).
	MaxBufferedBytes int64 `toml:"max_buffered_bytes"`
	// Resume: requests are held while vLLM restarts and what a death cut
	// is sent again (or continued); false is the proxy before issue 30.
	Resume bool `toml:"resume"`
	// HoldTimeout bounds how long a request is held while vLLM restarts;
	// 0: learned (the longest time to ready seen × 1.5, at least 2 min).
	HoldTimeout Duration `toml:"hold_timeout"`
	// ResumeLimit: a request in flight at this many deaths of vLLM is not
	// sent again (it may be what kills vLLM).
	ResumeLimit int `toml:"resume_limit"`
	// MaxBufferedBytesPerClient is one client address's share of
	// MaxBufferedBytes; 0: a quarter of it (at least MaxBodyBytes).
	MaxBufferedBytesPerClient int64 `toml:"max_buffered_bytes_per_client"`
	// TrustedProxies are the addresses (CIDRs or IPs) of load balancers
	// whose X-Forwarded-* and Forwarded headers the proxy passes on, its
	// peer appended; anyone else's are dropped (vLLM's uvicorn prints
	// X-Forwarded-For as the client in its access lines).
	TrustedProxies []string `toml:"trusted_proxies"`
}

// Warnings says what in cfg is allowed but likely a mistake that weakens
// the guard: `check` prints each and `run` logs each at start.
func (cfg *Config) Warnings() []string {
	var out []string
	ps, _ := TrustedPrefixes(cfg.Proxy.TrustedProxies)
	for i, p := range ps {
		if p.Bits() == 0 {
			out = append(out, fmt.Sprintf("[proxy] trusted_proxies: %q trusts every address: any client can name itself in X-Forwarded-For, which then reaches vLLM's access lines as the client, and each name it makes up gets its own share of max_connections_per_client; list only your load balancers' addresses",
				strings.TrimSpace(cfg.Proxy.TrustedProxies[i])))
		}
	}
	return out
}

// TrustedPrefixes parses [proxy] trusted_proxies: each entry a CIDR
// ("10.0.0.0/8") or one address ("10.0.0.5", "::1"). IPv4-mapped IPv6
// addresses are read as IPv4.
func TrustedPrefixes(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR (such as \"10.0.0.0/8\") nor an IP address (such as \"10.0.0.5\")", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Weights is the weight cache daemon (`vllm preload`): it holds vLLM's
// weights on the GPU so that a restarted vLLM maps them instead of reading
// the disk (internal/weightcache).
type Weights struct {
	// Cache: "auto" runs the daemon when vLLM's command has --load-format
	// ipc_cache; "daemon" runs it and adds that flag; "off" never runs one
	// (the operator runs their own, or none).
	Cache string `toml:"cache"`
	// HealthPort is the daemon's /health port on 127.0.0.1; 0: a free port
	// chosen at each start of the daemon.
	HealthPort int `toml:"health_port"`
}

type Log struct {
	Level      string `toml:"level"`  // debug | info | warn | error
	Format     string `toml:"format"` // auto | json | console
	ChildLines int    `toml:"child_lines"`
}

func d(s string) Duration {
	v, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return Duration{v}
}

// Default returns the configuration with every default filled in.
func Default() *Config {
	return &Config{
		VLLM: VLLM{
			Command:     []string{"vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"},
			Host:        "127.0.0.1",
			Port:        8000,
			Env:         map[string]string{},
			StopTimeout: d("30s"),
			PortWait:    d("30s"),
		},
		Profile: Profile{
			MaxNumSeqs:               256,
			GPUMemoryUtilization:     0.85,
			MaxNumSeqsFactor:         0.5,
			MinMaxNumSeqs:            16,
			GPUMemoryUtilizationStep: 0.05,
			MinGPUMemoryUtilization:  0.70,
			RestoreAfter:             d("0s"),
			Headroom:                 0.15,
		},
		Readiness: Readiness{
			Probe:        "auto",
			PollInterval: d("250ms"),
			ProbeTimeout: d("2s"),
			StallTimeout: d("10m"),
			MaxStartTime: d("0s"),
		},
		Liveness: Liveness{Interval: d("10s"), Timeout: d("5s"), Failures: 3, StuckTimeout: d("60s")},
		GPU: GPU{
			Devices:            []string{},
			SampleInterval:     d("1s"),
			WarnOverBudget:     0.03,
			CriticalOverBudget: 0.05,
			PredictHorizon:     d("10m"),
			ReleaseTimeout:     d("60s"),
			OnGPUFault:         "exit",
		},
		Restart: Restart{
			InitialDelay: d("5s"),
			MaxDelay:     d("5m"),
			Multiplier:   2.0,
			Jitter:       0.2,
			ResetAfter:   d("10m"),
			GiveUpAfter:  10,
			GiveUpWindow: d("1h"),
			OnGiveUp:     "exit",
		},
		Control: Control{
			Socket:     "/run/vllm-guard/guard.sock",
			HTTPListen: "127.0.0.1:9461",
			StateDir:   "/var/lib/vllm-guard",
		},
		Alerts: Alerts{Command: []string{}},
		Proxy: Proxy{
			Listen:         "",
			InflightFactor: 1.0,
			QueueSize:      512,
			QueueTimeout:   d("30s"),
			MaxBodyBytes:   16 << 20,
			WriteTimeout:   d("30s"),
			MaxConnections: 1024,
			// 0: a quarter, so that a few addresses cannot take
			// every place (issue 41: with half, two did). A load balancer
			// in front is listed in trusted_proxies: each client it
			// forwards then gets a share.
			MaxConnectionsPerClient: 0,
			MaxBufferedBytes:        512 << 20,
			TrustedProxies:          []string{},
			Resume:                  true,
			HoldTimeout:             d("0s"),
			ResumeLimit:             2,
		},
		Log:     Log{Level: "info", Format: "auto", ChildLines: 200},
		Weights: Weights{Cache: "auto"},
		Standby: Standby{Mode: StandbyOff, Port: 0, Env: map[string]string{}},
		Group:   defaultGroup(),
	}
}
