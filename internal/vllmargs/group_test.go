package vllmargs

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func tpGroup(rank int) Group {
	return Group{Rank: rank, Size: 2, Leader: "10.0.0.1", Port: 29501, Kind: "tp"}
}

func dpGroup(rank int) Group {
	return Group{Rank: rank, Size: 2, Leader: "10.0.0.1", Port: 13345, Kind: "dp"}
}

// The guard adds the multi-node flags each member needs, keeps those the
// operator wrote when they agree, and refuses a command that contradicts
// the group, naming the flag to change.
func TestGroupFlags(t *testing.T) {
	serve := func(flags ...string) []string { return append([]string{"vllm", "serve", "org/m"}, flags...) }
	cases := []struct {
		name    string
		command []string
		g       Group
		want    []string // the flags appended
		err     string   // a part of the refusal
	}{
		{"tp leader", serve("-tp", "2"), tpGroup(0), []string{"--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501"}, ""},
		{"tp follower is headless", serve("-tp", "2"), tpGroup(1), []string{"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501", "--headless"}, ""},
		{"agreeing flags are kept, not repeated", serve("-tp", "2", "--nnodes", "2", "--node_rank=1", "--headless"), tpGroup(1), []string{"--master-addr", "10.0.0.1", "--master-port", "29501"}, ""},
		{"short aliases read", serve("-tp", "4", "-n", "2", "-r", "1"), tpGroup(1), []string{"--master-addr", "10.0.0.1", "--master-port", "29501", "--headless"}, ""},
		{"pp across hosts", serve("-pp", "2"), Group{Rank: 0, Size: 2, Leader: "h", Port: 1, Kind: "pp"}, []string{"--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "1"}, ""},
		{"shortened waits", serve("-tp", "2"), Group{Rank: 0, Size: 2, Leader: "h", Port: 1, Kind: "tp", DistributedTimeout: 2 * time.Minute, CPUDistributedTimeout: 90500 * time.Millisecond},
			[]string{"--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "1", "--distributed-timeout-seconds", "120", "--cpu-distributed-timeout-seconds", "91"}, ""},
		{"the operator's own wait wins", serve("-tp", "2", "--distributed-timeout-seconds", "60"), Group{Rank: 0, Size: 2, Leader: "h", Port: 1, Kind: "tp", DistributedTimeout: time.Minute},
			[]string{"--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "1"}, ""},
		{"node rank 1 on rank 0", serve("-tp", "2", "--node-rank", "1"), tpGroup(0), nil, "--node-rank 1, and the group ([group] rank) needs 0"},
		{"nnodes 3 in a group of 2", serve("-tp", "6", "--nnodes", "3"), tpGroup(0), nil, "--nnodes 3, and the group ([group] size) needs 2"},
		{"headless on the leader", serve("-tp", "2", "--headless"), tpGroup(0), nil, "remove --headless"},
		{"another master", serve("-tp", "2", "--master-addr", "10.9.9.9"), tpGroup(1), nil, "[group] leader_address"},
		{"another master port", serve("-tp", "2", "--master-port=29600"), tpGroup(1), nil, "[group] rendezvous_port"},
		{"world not a multiple", serve("-tp", "3"), tpGroup(0), nil, "is 3, not a multiple of the group's size 2"},
		{"a single rank", serve(), tpGroup(0), nil, "is 1, not a multiple"},
		{"ray", serve("-tp", "2", "--distributed-executor-backend", "ray"), tpGroup(0), nil, "Ray is not supervised"},
		{"dp flag in a tp group", serve("-tp", "2", "--data-parallel-address", "h"), tpGroup(0), nil, "parallelism = \"dp\""},

		{"dp leader", serve("-dp", "4"), dpGroup(0), []string{"--data-parallel-size-local", "2", "--data-parallel-start-rank", "0", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"}, ""},
		{"dp follower", serve("--data-parallel-size", "4"), dpGroup(1), []string{"--data-parallel-size-local", "2", "--data-parallel-start-rank", "2", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345", "--headless"}, ""},
		{"dp agreeing", serve("-dp", "4", "-dpl", "2", "-dpr", "2", "-dpa", "10.0.0.1", "-dpp", "13345", "--headless"), dpGroup(1), nil, ""},
		{"dp start rank wrong", serve("-dp", "4", "--data-parallel-start-rank", "1"), dpGroup(1), nil, "--data-parallel-start-rank 1, and the group ([group] rank) needs 2"},
		{"dp local wrong", serve("-dp", "4", "-dpl", "1"), dpGroup(1), nil, "--data-parallel-size-local 1 on each of 2 hosts"},
		{"dp size missing", serve(), dpGroup(0), nil, "needs --data-parallel-size"},
		{"dp size odd", serve("-dp", "3"), dpGroup(0), nil, "--data-parallel-size 3 is not a multiple"},
		{"dp with nnodes", serve("-dp", "4", "--nnodes", "2"), dpGroup(0), nil, "this group is \"dp\""},
		{"dp external lb", serve("-dp", "4", "--data-parallel-rank", "1"), dpGroup(1), nil, "external load balancing"},
		{"dp headless leader", serve("-dp", "4", "--headless"), dpGroup(0), nil, "remove --headless"},
		{"a bare --", serve("-tp", "2", "--"), tpGroup(0), nil, "bare --"},
		{"not a number", serve("-pp", "two"), tpGroup(0), nil, "not a whole number"},
	}
	for _, tc := range cases {
		a, err := Parse(tc.command, nil, "", noEnv)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := a.GroupFlags(tc.g)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// A --config file's multi-node keys are read like the command line's.
func TestGroupFlagsReadTheConfigFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "v.yaml"), []byte("node-rank: 1\ntensor-parallel-size: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Parse([]string{"vllm", "serve", "m", "--config", "v.yaml"}, nil, dir, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.GroupFlags(tpGroup(0)); err == nil || !strings.Contains(err.Error(), "--node-rank 1") {
		t.Errorf("a --config file's node-rank 1 on rank 0: %v, want a refusal", err)
	}
}

func TestGroupEnv(t *testing.T) {
	if got := GroupEnv(3*time.Minute, noEnv); !reflect.DeepEqual(got, map[string]string{"VLLM_ENGINE_READY_TIMEOUT_S": "180"}) {
		t.Errorf("GroupEnv: %v", got)
	}
	own := EnvOf(map[string]string{"VLLM_ENGINE_READY_TIMEOUT_S": "900"}, nil)
	if got := GroupEnv(3*time.Minute, own); got != nil {
		t.Errorf("the operator's own VLLM_ENGINE_READY_TIMEOUT_S must win, got %v", got)
	}
	if got := GroupEnv(0, noEnv); got != nil {
		t.Errorf("0 adds nothing, got %v", got)
	}
}

// Any command line: GroupFlags answers flags or an error, never panics, and
// what it adds, appended, leaves a command it accepts again as is.
func FuzzGroupFlags(f *testing.F) {
	for _, s := range []string{"-tp 2", "-tp 2 --nnodes 2 --headless", "-dp 4 -dpl 2", "--node-rank=x", "-n 0", "-dp 0", "-tp 4 -pp 2 --master-port 1"} {
		f.Add(s, 1, 2, false)
	}
	f.Fuzz(func(t *testing.T, flags string, rank, size int, dp bool) {
		if size < 2 || size > 64 || rank < 0 || rank >= size {
			return
		}
		g := Group{Rank: rank, Size: size, Leader: "h", Port: 7, Kind: "tp"}
		if dp {
			g.Kind = "dp"
		}
		cmd := append([]string{"vllm", "serve", "m"}, strings.Fields(flags)...)
		a, err := Parse(cmd, nil, "", noEnv)
		if err != nil {
			return
		}
		add, err := a.GroupFlags(g)
		if err != nil {
			return
		}
		b, err := Parse(append(cmd, add...), nil, "", noEnv)
		if err != nil {
			t.Fatalf("%q plus %q does not parse: %v", cmd, add, err)
		}
		again, err := b.GroupFlags(g)
		if err != nil || len(again) != 0 {
			t.Fatalf("%q plus %q: the group adds %q again (%v)", cmd, add, again, err)
		}
	})
}
