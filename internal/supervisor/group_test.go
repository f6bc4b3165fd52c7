package supervisor

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// fakeGroup counts what the supervisor tells the group.
type fakeGroup struct {
	mu                           sync.Mutex
	launched, ready, ended, gone int
	follower, groupReady         bool
	causes                       []cause.Cause // said with each Gone
	gaveUp                       int
}

func (g *fakeGroup) Launched(policy.Rung) { g.mu.Lock(); g.launched++; g.mu.Unlock() }
func (g *fakeGroup) Ready()               { g.mu.Lock(); g.ready++; g.mu.Unlock() }
func (g *fakeGroup) Ended()               { g.mu.Lock(); g.ended++; g.mu.Unlock() }
func (g *fakeGroup) Gone(c cause.Cause) {
	g.mu.Lock()
	g.gone++
	g.causes = append(g.causes, c)
	g.mu.Unlock()
}
func (g *fakeGroup) GaveUp()          { g.mu.Lock(); g.gaveUp++; g.mu.Unlock() }
func (g *fakeGroup) Follower() bool   { return g.follower }
func (g *fakeGroup) GroupReady() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.groupReady }

func (g *fakeGroup) counts() [4]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return [4]int{g.launched, g.ready, g.ended, g.gone}
}

func groupOn(c *config.Config) { c.Group.Enabled = true }

// A member starts only on the group's go; the epoch's end kills its tree
// (a failure the policy decides on), and its next start waits for the go
// again; a go that comes before the start (during the backoff) is kept.
func TestAGroupMemberStartsOnTheGroupsGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, groupOn)
		g := &fakeGroup{}
		s.group = g
		s.start()
		synctest.Wait()
		if n := s.l.n(); n != 0 {
			t.Fatalf("%d launches before the group's go", n)
		}
		s.wantState(StateStarting)
		if c := g.counts(); c != [4]int{0, 0, 0, 1} {
			t.Fatalf("before the go: launched, ready, ended, gone %v, want the tree said gone once", c)
		}
		s.sup.GroupGo(0)
		synctest.Wait()
		if n := s.l.n(); n != 1 {
			t.Fatalf("%d launches after the go, want 1", n)
		}
		s.ready()
		if c := g.counts(); c != [4]int{1, 1, 0, 1} {
			t.Fatalf("ready: %v, want launched and ready once", c)
		}

		s.sup.GroupEnd(cause.GroupEnd{Epoch: 1, Rank: 1, Why: "member 1 not heard for the loss timeout"})
		synctest.Wait()
		if k := s.l.last().kills.Load(); k == 0 {
			t.Fatal("the epoch's end did not kill the tree")
		}
		if st := s.sup.Status(); st.LastFailure == nil || !strings.Contains(fmt.Sprint(st.LastFailure.Verdict), "the group's epoch 1 ended on another host: member 1 not heard") {
			t.Fatalf("the group's end is a failure with its reason: %+v", st.LastFailure)
		}
		s.advance(s.cfg.Restart.InitialDelay.Duration)
		if n := s.l.n(); n != 1 {
			t.Fatalf("%d launches after the epoch's end without a go, want still 1", n)
		}
		if c := g.counts(); c[2] == 0 || c[3] < 2 {
			t.Fatalf("after the end: %v, want the run said ended and the tree gone again", c)
		}
		s.wantState(StateStarting)
		s.sup.GroupGo(0)
		synctest.Wait()
		if n := s.l.n(); n != 2 {
			t.Fatalf("%d launches after the second go, want 2", n)
		}

		// The go during the backoff is kept for the start.
		s.ready()
		s.sup.GroupEnd(cause.GroupEnd{Epoch: 2, Why: "this host's vLLM ended"})
		synctest.Wait()
		s.sup.GroupGo(0)
		s.advance(2 * s.cfg.Restart.InitialDelay.Duration * 2)
		if n := s.l.n(); n != 3 {
			t.Fatalf("%d launches: a go during the backoff must start the next run, want 3", n)
		}
	})
}

// The epoch's end takes back a go not used yet.
func TestTheEpochsEndTakesTheGoBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, groupOn)
		s.group = &fakeGroup{}
		s.gpu.free = false // the start waits for GPU memory
		s.start()
		synctest.Wait()
		s.sup.GroupGo(0)
		s.sup.GroupEnd(cause.GroupEnd{Epoch: 1, Why: "the leader ended the epoch", Said: "end"})
		synctest.Wait()
		s.gpu.mu.Lock()
		s.gpu.free = true
		s.gpu.mu.Unlock()
		s.advance(10 * time.Second)
		if n := s.l.n(); n != 0 {
			t.Fatalf("%d launches on a go the epoch's end took back", n)
		}
	})
}

// A member tells the group the cause of its own vLLM's end with the tree's
// end, once known; a run the group's end killed names none.
func TestAMemberSaysItsOwnCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, func(c *config.Config) { groupOn(c); c.Group.Rank, c.Group.Size = 1, 2 })
		g := &fakeGroup{follower: true}
		s.group = g
		s.start()
		synctest.Wait()
		s.sup.GroupGo(0)
		synctest.Wait()
		p := s.l.last()
		p.print("ERROR 10-14 12:01:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
		p.end(exitInfo{Code: 0}) // a headless follower exits 0
		synctest.Wait()
		s.sup.GroupGo(0)
		s.advance(time.Second)
		s.wantLaunches(2, "the follower's next go")
		s.sup.GroupEnd(cause.GroupEnd{Epoch: 2, Rank: 0, Said: "end", Why: "the leader ended the epoch"})
		synctest.Wait()
		g.mu.Lock()
		got := append([]cause.Cause(nil), g.causes...)
		g.mu.Unlock()
		// Gone before the first go (no run), after the OOM, then after the
		// group's kill (the cause is not this host's), each with the wait.
		want := []cause.Cause{"", cause.CauseOOM, "", "", ""}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("the causes said with the tree's end: %q, want %q", got, want)
		}
		if f := s.failure(1); f.Verdict.Cause != cause.CauseOOM || f.Decision.Rung.Index != 0 {
			t.Fatalf("the follower's own failure: %+v, want an OOM on the same rung (the leader decides)", f)
		}
	})
}

// The leader's go may bring a member's cause: its ladder reacts before
// the start (an OOM on a follower steps the group down, said in a
// decision), and a member's configuration error gives up.
func TestTheLeaderReactsToAMembersCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, groupOn)
		g := &fakeGroup{}
		s.group = g
		s.start()
		synctest.Wait()
		s.sup.GroupGo(0)
		synctest.Wait()
		s.ready()
		s.sup.GroupEnd(cause.GroupEnd{Epoch: 1, Rank: 1, Said: "ended", Why: "member 1's guard says its vLLM ended"})
		synctest.Wait()
		s.sup.GroupGoAfter(1, cause.CauseOOM)
		s.advance(2 * s.cfg.Restart.InitialDelay.Duration)
		s.wantLaunches(2, "after the go")
		if argv := s.l.last().spec.Argv; !argvHas(argv, "--max-num-seqs", "128") {
			t.Fatalf("after a member's OOM: %v, want rung 1", argv)
		}
		var said bool
		for _, e := range s.kinds(events.KindDecision) {
			said = said || strings.Contains(e.Reason, "member 1's vLLM ended: GPU out of memory: rung 0→1")
		}
		if !said {
			t.Fatalf("no decision names the member's OOM: %+v", s.kinds(events.KindDecision))
		}
		s.ready()
		s.sup.GroupEnd(cause.GroupEnd{Epoch: 2, Rank: 1, Said: "ended", Why: "member 1's guard says its vLLM ended"})
		synctest.Wait()
		s.sup.GroupGoAfter(1, cause.CauseConfigError)
		s.advance(4 * s.cfg.Restart.InitialDelay.Duration)
		s.wantLaunches(2, "after a member's configuration error")
		if code := s.exited(); code != 78 {
			t.Fatalf("exit %d, want 78 (a configuration error, not retried)", code)
		}
		if g.gaveUp != 1 {
			t.Fatalf("the group was told of %d give-ups, want 1", g.gaveUp)
		}
	})
}

// A follower's vLLM is headless: its readiness is the group's.
func TestAFollowersReadinessIsTheGroups(t *testing.T) {
	g := &fakeGroup{follower: true}
	c := groupChecker{g}
	if r := c.Ready(context.Background(), "auto", time.Second); r.OK || !r.Refused {
		t.Errorf("before the leader is ready: %+v, want refused", r)
	}
	g.groupReady = true
	if r := c.Ready(context.Background(), "auto", time.Second); !r.OK || !r.Own {
		t.Errorf("the leader ready: %+v, want ok", r)
	}
}
