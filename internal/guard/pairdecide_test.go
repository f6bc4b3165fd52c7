package guard

import (
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// The pair's decision, as a table: which vLLM serves after each change of
// either one's state or of the ladder's rung.
func TestPairDecides(t *testing.T) {
	r0 := policy.Rung{Index: 0, MaxNumSeqs: 64, GPUMemoryUtilization: 0.9}
	r1 := policy.Rung{Index: 1, MaxNumSeqs: 32, GPUMemoryUtilization: 0.85}
	v := func(st status.State, r policy.Rung) vllmView { return vllmView{State: st, Rung: r} }
	ready, starting, stopping := status.StateReady, status.StateStarting, status.StateStopping
	cases := []struct {
		name     string
		view     pairView
		serve    int
		failover bool
		swap     bool
		restart  int
	}{
		{"both ready on the rung: a serves on", pairView{0, [2]vllmView{v(ready, r0), v(ready, r0)}, r0}, 0, false, false, -1},
		{"a leaves ready, b ready: b serves at once", pairView{0, [2]vllmView{v(stopping, r0), v(ready, r0)}, r0}, 1, true, false, -1},
		{"a's engine dead (its status still ready), b ready: b serves", pairView{0, [2]vllmView{v(stateDying, r0), v(ready, r0)}, r0}, 1, true, false, -1},
		{"b serving leaves ready, a ready: a serves", pairView{1, [2]vllmView{v(ready, r0), v(status.StateBackoff, r0)}, r0}, 0, true, false, -1},
		{"a dies, b still loading: a stays (the proxy holds)", pairView{0, [2]vllmView{v(stopping, r0), v(starting, r0)}, r0}, 0, false, false, -1},
		{"the standby dies: the serving one is untouched", pairView{0, [2]vllmView{v(ready, r0), v(stopping, r0)}, r0}, 0, false, false, -1},
		{"both down: nothing to switch to", pairView{0, [2]vllmView{v(status.StateBackoff, r0), v(status.StateFailed, r0)}, r1}, 0, false, false, -1},
		{"a failed (gave up), b ready: b serves", pairView{0, [2]vllmView{v(status.StateFailed, r1), v(ready, r0)}, r1}, 1, true, false, -1},
		{"after an OOM: b on the old rung serves, a still loading rung 1", pairView{1, [2]vllmView{v(starting, r1), v(ready, r0)}, r1}, 1, false, false, -1},
		{"a ready on the ladder's rung, b on the old: swap, b restarts", pairView{1, [2]vllmView{v(ready, r1), v(ready, r0)}, r1}, 0, false, true, 1},
		{"a restore: b ready on the higher rung, a on the lower: swap", pairView{0, [2]vllmView{v(ready, r1), v(ready, r0)}, r0}, 1, false, true, 0},
		{"both on old rungs: no swap (neither is the ladder's)", pairView{0, [2]vllmView{v(ready, r0), v(ready, r0)}, r1}, 0, false, false, -1},
		{"serving on the rung, standby not: the standby restarts on it", pairView{0, [2]vllmView{v(ready, r1), v(ready, r0)}, r1}, 0, false, false, 1},
		{"the standby off the rung but still loading: wait for it", pairView{0, [2]vllmView{v(ready, r1), v(starting, r0)}, r1}, 0, false, false, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mv := decide(c.view)
			if mv.Serve != c.serve || mv.Failover != c.failover || mv.Swap != c.swap || mv.Restart != c.restart {
				t.Fatalf("decide(%+v) = %+v; want serve %d failover %v swap %v restart %d", c.view, mv, c.serve, c.failover, c.swap, c.restart)
			}
			if (mv.Failover || mv.Swap) && mv.Why == "" {
				t.Fatal("a change without a why")
			}
		})
	}
}

// After an OOM the promoted standby still runs the old flags: the proxy
// admits for the ladder's rung until the standby on that rung serves.
func TestPromotedStandbyAdmitsForTheLaddersRung(t *testing.T) {
	old := policy.Rung{Index: 0, MaxNumSeqs: 64, GPUMemoryUtilization: 0.9}
	cur := policy.Rung{Index: 1, MaxNumSeqs: 32, GPUMemoryUtilization: 0.85}
	if got := admitted(old, cur); got.MaxNumSeqs != 32 || got.Index != 0 || got.GPUMemoryUtilization != 0.9 {
		t.Fatalf("admitted(rung 0 running, rung 1 in force) = %+v; want max_num_seqs 32 on the running flags", got)
	}
	if got := admitted(cur, old); got.MaxNumSeqs != 32 {
		t.Fatalf("a restore in force does not raise the bound of a vLLM on the lower rung: %+v", got)
	}
}
