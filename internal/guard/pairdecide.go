package guard

import (
	"strconv"

	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// The pair's one decision (pure, so its table is tested without
// processes): which vLLM the proxy routes to, given both statuses and the
// ladder's rung.

// vllmView is one vLLM as the pair's decision reads it.
type vllmView struct {
	State status.State
	Rung  policy.Rung // the rung its run was launched on
}

func (v vllmView) ready() bool { return v.State == status.StateReady }

// stateDying is a vLLM whose status says ready while its engine is dead or
// its API server finished (supervisor.Dying): it serves nothing more.
const stateDying status.State = "dying"

// stateAsleep is a standby that sleeps (mode "sleep"): ready in its
// status, it serves nothing until woken.
const stateAsleep status.State = "asleep"

// pairView is what the decision reads: which one serves, both vLLMs, and
// the rung the ladder is on now (the next start's).
type pairView struct {
	Serving int
	V       [2]vllmView
	Current policy.Rung
}

// pairMove is what the decision says: the vLLM to serve now (Serve ==
// Serving: no change), whether that is a failover (the serving one left
// ready) or a swap (both ready, the standby on the ladder's rung and the
// serving one not), and the vLLM to restart on purpose (a swap's old one,
// -1: none).
type pairMove struct {
	Serve    int
	Failover bool
	Swap     bool
	Restart  int
	Why      string
}

// vllmName is how status, events and logs name the two: "a" on [vllm]
// port, "b" on [standby] port.
func vllmName(i int) string { return string(rune('a' + i)) }

// decide is the pair's decision:
//   - the serving vLLM is not ready (any death, a hang kill, its engine
//     dead, a restart or restore) and the standby is: the standby serves at
//     once (a failover); the other is restarted by its own supervisor and
//     comes back as the standby;
//   - both are ready, the standby runs the ladder's rung and the serving
//     one another (after an OOM stepped the ladder down, or a restore up):
//     the standby serves (a swap) and the old one is restarted on purpose,
//     not as a failure, so that it comes back on the ladder's rung;
//   - both are ready, the serving one on the ladder's rung and the standby
//     on another (it was ready before an OOM of the serving one stepped
//     the ladder): the standby is restarted on purpose, so that a failover
//     lands on the ladder's flags;
//   - otherwise nothing changes.
func decide(v pairView) pairMove {
	s, o := v.Serving, 1-v.Serving
	mv := pairMove{Serve: s, Restart: -1}
	switch {
	case !v.V[s].ready() && v.V[o].ready():
		mv.Serve, mv.Failover = o, true
		mv.Why = "vLLM " + vllmName(s) + " left ready (" + string(v.V[s].State) + "); vLLM " + vllmName(o) + " is ready"
	case v.V[s].ready() && v.V[o].ready() && !sameRung(v.V[s].Rung, v.Current) && sameRung(v.V[o].Rung, v.Current):
		mv.Serve, mv.Swap, mv.Restart = o, true, s
		mv.Why = "vLLM " + vllmName(o) + " is ready on the ladder's rung " + strconv.Itoa(v.Current.Index) + "; vLLM " + vllmName(s) +
			" ran rung " + strconv.Itoa(v.V[s].Rung.Index) + " and restarts on it as the standby"
	case v.V[s].ready() && v.V[o].ready() && sameRung(v.V[s].Rung, v.Current) && !sameRung(v.V[o].Rung, v.Current):
		mv.Restart = o
		mv.Why = "the standby vLLM " + vllmName(o) + " runs rung " + strconv.Itoa(v.V[o].Rung.Index) + ", not the ladder's " +
			strconv.Itoa(v.Current.Index) + ": it restarts on it"
	}
	return mv
}

// sameRung: the flags a vLLM runs with are the rung's.
func sameRung(a, b policy.Rung) bool {
	return a.Index == b.Index && a.MaxNumSeqs == b.MaxNumSeqs && a.GPUMemoryUtilization == b.GPUMemoryUtilization &&
		a.KVCacheMemoryBytes == b.KVCacheMemoryBytes
}

// admitted is the rung the proxy admits for while vLLM serving runs rung
// running: the ladder's bound applies at once to a promoted standby that
// still runs the old flags (max_num_seqs the smaller of the two).
func admitted(running, current policy.Rung) policy.Rung {
	r := running
	r.MaxNumSeqs = min(running.MaxNumSeqs, current.MaxNumSeqs)
	return r
}
