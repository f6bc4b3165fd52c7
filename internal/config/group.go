package config

import (
	"os"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// Group is [group]: one vLLM that spans hosts, one guard per host. Off by
// default. The guard passes vLLM's multi-node flags itself (so every
// host's command agrees), and the guards keep the group alive or restart
// it whole by the group epoch (internal/group).
type Group struct {
	Enabled bool `toml:"enabled"`
	// Rank is this guard's place in the group: 0 is the leader (its vLLM
	// serves the API; its guard decides restarts), 1..size-1 followers.
	Rank int `toml:"rank"`
	Size int `toml:"size"`
	// LeaderAddress is the leader host's address (no port): vLLM's
	// rendezvous and the leader guard's port are reached there.
	LeaderAddress string `toml:"leader_address"`
	// Port is the guard-to-guard port, on the leader.
	Port int `toml:"port"`
	// RendezvousPort is vLLM's own: --master-port ("tp", "pp") or
	// --data-parallel-rpc-port ("dp").
	RendezvousPort int    `toml:"rendezvous_port"`
	Parallelism    string `toml:"parallelism"` // "tp" | "pp" | "dp"
	// SecretFile holds the group's shared secret (a Kubernetes Secret
	// mounted as a file): every message between guards is signed with it.
	SecretFile        string   `toml:"secret_file"`
	HeartbeatInterval Duration `toml:"heartbeat_interval"`
	// LossTimeout: a member not heard from this long is lost, and the
	// epoch ends.
	LossTimeout Duration `toml:"loss_timeout"`
	// vLLM's own waits, shortened so that a missing peer fails in minutes:
	// --distributed-timeout-seconds, --cpu-distributed-timeout-seconds,
	// VLLM_ENGINE_READY_TIMEOUT_S.
	DistributedTimeout    Duration `toml:"distributed_timeout"`
	CPUDistributedTimeout Duration `toml:"cpu_distributed_timeout"`
	EngineReadyTimeout    Duration `toml:"engine_ready_timeout"`

	// fromEnv names, for each key taken from LeaderWorkerSet's variables,
	// the variable: errors name it instead of a line.
	fromEnv map[string]string
}

// LeaderWorkerSet's variables (its pod webhook sets them): the worker's
// index (the leader is 0), the group's size and the leader's address.
const (
	LWSWorkerIndex   = "LWS_WORKER_INDEX"
	LWSGroupSize     = "LWS_GROUP_SIZE"
	LWSLeaderAddress = "LWS_LEADER_ADDRESS"
)

// MaxGroupSize bounds [group] size: far above any vLLM deployment, and it
// bounds the leader guard's connections.
const MaxGroupSize = 256

func defaultGroup() Group {
	return Group{
		Size:                  1,
		Port:                  9462,
		RendezvousPort:        29501,
		Parallelism:           "tp",
		HeartbeatInterval:     d("1s"),
		LossTimeout:           d("5s"),
		DistributedTimeout:    d("2m"),
		CPUDistributedTimeout: d("2m"),
		EngineReadyTimeout:    d("3m"),
	}
}

// lookupEnv reads the guard's environment (tests replace it).
var lookupEnv = os.LookupEnv

// fromLWS fills rank, size and leader_address from LeaderWorkerSet's
// variables where the file does not write them, for an enabled group.
func (c *checker) fromLWS(g *Group) {
	if !g.Enabled {
		return
	}
	for _, v := range []struct {
		key, env string
		set      func(string) bool
	}{
		{"rank", LWSWorkerIndex, func(s string) bool { n, err := strconv.Atoi(s); g.Rank = n; return err == nil }},
		{"size", LWSGroupSize, func(s string) bool { n, err := strconv.Atoi(s); g.Size = n; return err == nil }},
		{"leader_address", LWSLeaderAddress, func(s string) bool { g.LeaderAddress = s; return true }},
	} {
		val, ok := lookupEnv(v.env)
		if !ok || c.pos.has(k("group", v.key)) {
			continue
		}
		if g.fromEnv == nil {
			g.fromEnv = map[string]string{}
		}
		g.fromEnv[v.key] = v.env
		if !v.set(strings.TrimSpace(val)) {
			c.add(k("group"), "$%s is %q, not a whole number: it comes from LeaderWorkerSet; set [group] %s in the file instead", v.env, val, v.key)
		}
	}
}

// VLLM is the group as vLLM's command line sees it.
func (g Group) VLLM() vllmargs.Group {
	return vllmargs.Group{
		Rank: g.Rank, Size: g.Size, Leader: g.LeaderAddress, Port: g.RendezvousPort, Kind: g.Parallelism,
		DistributedTimeout: g.DistributedTimeout.Duration, CPUDistributedTimeout: g.CPUDistributedTimeout.Duration,
	}
}

// groupKey is where an error about key points: the line that writes it,
// or the LeaderWorkerSet variable it came from.
func (c *checker) groupAdd(g Group, key, format string, args ...any) {
	if env, ok := g.fromEnv[key]; ok {
		format += " (" + key + " is $" + env + ", from LeaderWorkerSet)"
	}
	c.add(k("group", key), format, args...)
}

func (c *checker) validateGroup(cfg *Config) {
	g := cfg.Group
	switch g.Parallelism {
	case "tp", "pp", "dp":
	default:
		c.add(k("group", "parallelism"), "%s is not allowed; write \"tp\" or \"pp\" (one engine across hosts: --nnodes, --node-rank, --master-addr, --master-port, followers --headless) or \"dp\" (whole engines on each host: the --data-parallel-* flags, followers --headless)", tomlQuote(g.Parallelism))
	}
	for _, p := range []struct {
		key string
		v   int
	}{{"port", g.Port}, {"rendezvous_port", g.RendezvousPort}} {
		if p.v < 1 || p.v > 65535 {
			c.add(k("group", p.key), "%d is out of range; allowed: 1 to 65535", p.v)
		}
	}
	if g.Size < 1 || g.Size > MaxGroupSize {
		c.groupAdd(g, "size", "%d is out of range; allowed: 1 to %d (the group's hosts, the leader included)", g.Size, MaxGroupSize)
	}
	if g.LossTimeout.Duration < 2*g.HeartbeatInterval.Duration {
		p := c.at(k("group", "loss_timeout"), k("group", "heartbeat_interval"))
		c.add(p, "loss_timeout (%s) is under twice heartbeat_interval (%s): one late heartbeat would end the epoch; raise loss_timeout or lower heartbeat_interval", g.LossTimeout, g.HeartbeatInterval)
	}
	if !g.Enabled {
		return
	}
	c.validateEnabledGroup(cfg)
}

func (c *checker) validateEnabledGroup(cfg *Config) {
	g, n := cfg.Group, len(c.errs)
	if g.Size == 1 {
		c.groupAdd(g, "size", "is 1: a group of one host is a single guard; set the number of hosts (2 or more), or enabled = false")
	}
	if g.Rank < 0 || (g.Size >= 1 && g.Rank >= g.Size) {
		c.groupAdd(g, "rank", "%d is out of range; allowed: 0 (the leader) to size-1 (%d)", g.Rank, g.Size-1)
	}
	if strings.TrimSpace(g.LeaderAddress) == "" || strings.ContainsAny(g.LeaderAddress, " /") || strings.Count(g.LeaderAddress, ":") == 1 {
		c.groupAdd(g, "leader_address", "%s is not a host; write the leader's address without a port, such as \"10.0.0.1\" or \"vllm-0.vllm.default\" (under LeaderWorkerSet leave it out: $%s)", tomlQuote(g.LeaderAddress), LWSLeaderAddress)
	}
	if strings.TrimSpace(g.SecretFile) == "" {
		c.add(k("group", "secret_file"), "is empty; the guards sign every message with a shared secret: write the path of a file holding it (at least 16 bytes; a mounted Kubernetes Secret)")
	}
	if g.Port == g.RendezvousPort {
		p := c.at(k("group", "port"), k("group", "rendezvous_port"))
		c.add(p, "port and rendezvous_port are both %d: the guards' port and vLLM's rendezvous must differ", g.Port)
	}
	if g.Rank == 0 && g.Port == cfg.VLLM.Port {
		p := c.at(k("group", "port"), k("vllm", "port"))
		c.add(p, "[group] port and [vllm] port are both %d on the leader: give the guards' port another", g.Port)
	}
	if len(c.errs) > n {
		return // the command is checked against a group that holds together
	}
	a, err := cfg.VLLMArgs(nil)
	if err != nil {
		return // reported by whoever reads the command line
	}
	if _, err := a.GroupFlags(g.VLLM()); err != nil {
		c.add(c.at(k("vllm", "command")), "%s (this host is [group] rank %d of %d)", err.Error(), g.Rank, g.Size)
	}
}
