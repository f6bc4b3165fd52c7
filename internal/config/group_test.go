package config

import (
	"errors"
	"strings"
	"testing"
)

// a group of two over a command that agrees with it.
const groupOK = "[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"-tp\", \"2\"]\n" +
	"[group]\nenabled = true\nrank = 1\nsize = 2\nleader_address = \"10.0.0.1\"\nsecret_file = \"/run/secrets/group\"\n"

func TestGroupLoads(t *testing.T) {
	cfg, err := Load(writeTemp(t, groupOK))
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Group
	if !g.Enabled || g.Rank != 1 || g.Size != 2 || g.LeaderAddress != "10.0.0.1" || g.Port != 9462 || g.RendezvousPort != 29501 || g.Parallelism != "tp" {
		t.Errorf("group %+v", g)
	}
	v := g.VLLM()
	if v.Rank != 1 || v.Size != 2 || v.Leader != "10.0.0.1" || v.Port != 29501 || v.Kind != "tp" || v.DistributedTimeout.Minutes() != 2 {
		t.Errorf("vLLM's view %+v", v)
	}
}

// Each contradiction names its line and key, and what to change.
func TestGroupErrors(t *testing.T) {
	cases := []struct {
		name, body string
		line       int
		key, msg   string
	}{
		{"rank past size", strings.Replace(groupOK, "rank = 1", "rank = 2", 1), 5, "[group] rank", "allowed: 0 (the leader) to size-1 (1)"},
		{"a group of one", strings.Replace(strings.Replace(groupOK, "size = 2", "size = 1", 1), "rank = 1", "rank = 0", 1), 6, "[group] size", "a group of one host is a single guard"},
		{"no leader", strings.Replace(groupOK, "leader_address = \"10.0.0.1\"", "leader_address = \"\"", 1), 7, "[group] leader_address", "is not a host"},
		{"leader with a port", strings.Replace(groupOK, "10.0.0.1", "10.0.0.1:29501", 1), 7, "[group] leader_address", "without a port"},
		{"no secret", strings.Replace(groupOK, "secret_file = \"/run/secrets/group\"", "secret_file = \"\"", 1), 8, "[group] secret_file", "shared secret"},
		{"bad kind", groupOK + "parallelism = \"ep\"\n", 9, "[group] parallelism", "write \"tp\" or \"pp\""},
		{"same ports", groupOK + "port = 29501\n", 9, "[group] port", "both 29501"},
		{"loss under two beats", groupOK + "heartbeat_interval = \"1s\"\nloss_timeout = \"1500ms\"\n", 10, "[group] loss_timeout", "under twice heartbeat_interval"},
		{"beat too fast", groupOK + "heartbeat_interval = \"1ms\"\n", 9, "[group] heartbeat_interval", "allowed: 100ms to 10s"},
		{"node rank contradicts", strings.Replace(groupOK, "\"2\"]", "\"2\", \"--node-rank\", \"0\"]", 1), 2, "[vllm] command", "--node-rank 0, and the group ([group] rank) needs 1"},
		{"nnodes contradicts", strings.Replace(groupOK, "\"2\"]", "\"2\", \"--nnodes\", \"3\"]", 1), 2, "[vllm] command", "--nnodes 3"},
		{"headless leader", strings.Replace(strings.Replace(groupOK, "rank = 1", "rank = 0", 1), "\"2\"]", "\"2\", \"--headless\"]", 1), 2, "[vllm] command", "remove --headless"},
		{"leader port clash", strings.Replace(strings.Replace(groupOK, "rank = 1", "rank = 0", 1), "[group]", "port = 9462\n[group]", 1), 3, "[vllm] port", "both 9462 on the leader"},
	}
	for _, tc := range cases {
		_, err := Load(writeTemp(t, tc.body))
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a config error", tc.name, err)
			continue
		}
		if ce.Line != tc.line || !strings.Contains(ce.Key, tc.key) || !strings.Contains(ce.Msg, tc.msg) {
			t.Errorf("%s: line %d key %q msg %q; want line %d key %q msg with %q", tc.name, ce.Line, ce.Key, ce.Msg, tc.line, tc.key, tc.msg)
		}
	}
}

// Off, the group is not checked against the command (no guard of a
// single host is refused for a --headless it may mean).
func TestGroupOffChecksNothing(t *testing.T) {
	body := "[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"--node-rank\", \"3\"]\n[group]\nrank = 7\n"
	if _, err := Load(writeTemp(t, body)); err != nil {
		t.Errorf("a disabled group refused: %v", err)
	}
}

// Under LeaderWorkerSet its variables fill the keys the file leaves out; a
// key written wins; a bad variable is named.
func TestGroupFromLeaderWorkerSet(t *testing.T) {
	env := map[string]string{LWSWorkerIndex: "1", LWSGroupSize: "2", LWSLeaderAddress: "vllm-0.vllm.default"}
	old := lookupEnv
	lookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	t.Cleanup(func() { lookupEnv = old })
	body := "[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"-tp\", \"2\"]\n[group]\nenabled = true\nsecret_file = \"/s\"\n"
	cfg, err := Load(writeTemp(t, body))
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Group; g.Rank != 1 || g.Size != 2 || g.LeaderAddress != "vllm-0.vllm.default" {
		t.Errorf("from LWS: %+v", g)
	}
	cfg, err = Load(writeTemp(t, body+"rank = 0\n"))
	if err != nil || cfg.Group.Rank != 0 {
		t.Errorf("a written rank must win over $LWS_WORKER_INDEX: %v, rank %d", err, cfg.Group.Rank)
	}
	env[LWSWorkerIndex] = "leader"
	if _, err := Load(writeTemp(t, body)); err == nil || !strings.Contains(err.Error(), "$LWS_WORKER_INDEX is \"leader\"") {
		t.Errorf("a bad LWS_WORKER_INDEX: %v", err)
	}
	env[LWSWorkerIndex] = "5"
	if _, err := Load(writeTemp(t, body)); err == nil || !strings.Contains(err.Error(), "rank is $LWS_WORKER_INDEX") {
		t.Errorf("a rank from LWS past the size must name the variable: %v", err)
	}
	// Off, the variables are not read.
	cfg, err = Load(writeTemp(t, "[group]\nenabled = false\n"))
	if err != nil || cfg.Group.Rank != 0 || cfg.Group.Size != 1 {
		t.Errorf("a disabled group read LWS: %v %+v", err, cfg.Group)
	}
}
