package vllmargs

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Group is one member of a vLLM that spans hosts, as the guard's [group]
// says: the guard passes vLLM's multi-node flags itself, so that every
// host's command agrees with every other's.
type Group struct {
	// Rank is this host's place in the group: 0 is the leader (it serves
	// the API), the others are headless followers.
	Rank, Size int
	// Leader is the leader host's address; Port its rendezvous port
	// (--master-port for "tp"/"pp", --data-parallel-rpc-port for "dp").
	Leader string
	Port   int
	// Kind is "tp" or "pp" (--nnodes/--node-rank/--master-addr/
	// --master-port) or "dp" (the --data-parallel-* set).
	Kind string
	// DistributedTimeout and CPUDistributedTimeout shorten torch's process
	// group waits (NCCL's 600 s, gloo's 1800 s); 0 adds no flag.
	DistributedTimeout, CPUDistributedTimeout time.Duration
}

// IsLeader reports whether this member is the group's leader.
func (g Group) IsLeader() bool { return g.Rank == 0 }

// GroupFlags checks the command line against the group and returns the
// flags the guard appends so that it agrees with every other member's:
// those the operator left out. A flag the operator wrote with a value the
// group contradicts is an error that names what to change.
func (a *Args) GroupFlags(g Group) ([]string, error) {
	r := groupReader{a: a, g: g}
	if slices.Contains(a.Argv, "--") {
		return nil, errorf("the command has a bare --, after which vLLM reads every argument as a positional one, the flags the guard appends for the group too: remove it")
	}
	if b, ok := r.value("--distributed-executor-backend"); ok && b != "mp" {
		return nil, errorf("a [group] runs vLLM's mp backend across hosts, and the command has --distributed-executor-backend %s: remove it (Ray is not supervised yet)", b)
	}
	if _, ok := r.a.last["--headless"]; ok && g.IsLeader() {
		return nil, errorf("rank 0 is the group's leader and serves the API, and its command has --headless: remove --headless (the guard adds it on the followers)")
	}
	if g.Kind == "dp" {
		r.dp()
	} else {
		r.tp()
	}
	if !g.IsLeader() {
		r.add("--headless")
	}
	r.seconds("--distributed-timeout-seconds", g.DistributedTimeout)
	r.seconds("--cpu-distributed-timeout-seconds", g.CPUDistributedTimeout)
	if r.err != nil {
		return nil, r.err
	}
	return r.out, nil
}

type groupReader struct {
	a   *Args
	g   Group
	out []string
	err error
}

func (r *groupReader) value(flag string) (string, bool) {
	o, ok := r.a.last[flag]
	if !ok {
		return "", false
	}
	if len(o.values) == 0 {
		return "", true
	}
	return o.values[0], true
}

// int reads a whole-number flag; def when absent. A value that is no
// number is an error.
func (r *groupReader) int(flag string, def int) int {
	v, ok := r.value(flag)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		r.fail("vLLM's %s %q is not a whole number", flag, v)
		return def
	}
	return n
}

func (r *groupReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = errorf(format, args...)
	}
}

func (r *groupReader) add(flag string, value ...string) {
	if _, ok := r.a.last[flag]; ok {
		return
	}
	r.out = append(r.out, flag)
	r.out = append(r.out, value...)
}

// must: the operator's flag, if written, has the group's value; the guard
// adds it when not.
func (r *groupReader) must(flag, want, key string) {
	v, ok := r.value(flag)
	if ok && v != want {
		r.fail("the command has %s %s, and the group (%s) needs %s on rank %d: remove %s from the command (the guard passes it)", flag, v, key, want, r.g.Rank, flag)
		return
	}
	r.add(flag, want)
}

func (r *groupReader) refuse(why string, flags ...string) {
	for _, f := range flags {
		if _, ok := r.a.last[f]; ok {
			r.fail("the command has %s, %s: remove it", f, why)
		}
	}
}

func (r *groupReader) seconds(flag string, d time.Duration) {
	if d > 0 {
		r.add(flag, strconv.Itoa(int((d+time.Second-1)/time.Second)))
	}
}

// tp: tensor or pipeline parallel across hosts: every host runs
// world/size ranks of one torch process group that meets at the leader.
func (r *groupReader) tp() {
	g := r.g
	r.refuse(fmt.Sprintf("which belongs to [group] parallelism = \"dp\", and this group is %q", g.Kind),
		"--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-start-rank", "--data-parallel-size-local", "--data-parallel-rank")
	world := r.int("--tensor-parallel-size", 1) * r.int("--pipeline-parallel-size", 1)
	if r.err == nil && world%g.Size != 0 {
		r.fail("--tensor-parallel-size × --pipeline-parallel-size is %d, not a multiple of the group's size %d: each host runs the same number of ranks; change the sizes or [group] size", world, g.Size)
	}
	r.must("--nnodes", strconv.Itoa(g.Size), "[group] size")
	r.must("--node-rank", strconv.Itoa(g.Rank), "[group] rank")
	r.must("--master-addr", g.Leader, "[group] leader_address")
	r.must("--master-port", strconv.Itoa(g.Port), "[group] rendezvous_port")
}

// dp: data parallel across hosts: each host runs size_local whole engines
// that meet the leader's front end at its RPC port.
func (r *groupReader) dp() {
	g := r.g
	r.refuse("which spreads one engine across hosts (parallelism \"tp\" or \"pp\"), and this group is \"dp\"", "--nnodes", "--node-rank", "--master-addr")
	r.refuse("which is vLLM's external load balancing (one API server per rank), not a group the leader fronts", "--data-parallel-rank")
	size := r.int("--data-parallel-size", 0)
	if r.err != nil {
		return
	}
	if size == 0 {
		r.fail("a \"dp\" group needs --data-parallel-size (all the group's engines): add it to the command, a multiple of the group's size %d", g.Size)
		return
	}
	if size%g.Size != 0 {
		r.fail("--data-parallel-size %d is not a multiple of the group's size %d: each host runs the same number of engines", size, g.Size)
		return
	}
	local := r.int("--data-parallel-size-local", size/g.Size)
	if r.err == nil && local*g.Size != size {
		r.fail("--data-parallel-size-local %d on each of %d hosts is not --data-parallel-size %d: remove --data-parallel-size-local (the guard passes %d)", local, g.Size, size, size/g.Size)
	}
	r.must("--data-parallel-size-local", strconv.Itoa(local), "[group] size")
	r.must("--data-parallel-start-rank", strconv.Itoa(g.Rank*local), "[group] rank")
	r.must("--data-parallel-address", g.Leader, "[group] leader_address")
	r.must("--data-parallel-rpc-port", strconv.Itoa(g.Port), "[group] rendezvous_port")
}

// GroupEnv is what the group adds to vLLM's environment: the leader's wait
// for its engines (VLLM_ENGINE_READY_TIMEOUT_S, 600 s in vLLM) shortened,
// unless env (what vLLM will see) sets it already.
func GroupEnv(readyTimeout time.Duration, env Env) map[string]string {
	if readyTimeout <= 0 {
		return nil
	}
	if env != nil {
		if _, ok := env("VLLM_ENGINE_READY_TIMEOUT_S"); ok {
			return nil
		}
	}
	return map[string]string{"VLLM_ENGINE_READY_TIMEOUT_S": strconv.Itoa(int((readyTimeout + time.Second - 1) / time.Second))}
}
