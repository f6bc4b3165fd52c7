package integration

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// rungFlags are a start's rung flags, as its command line has them.
func rungFlags(e events.Event) []string {
	return []string{fmt.Sprintf("--max-num-seqs %d", e.Rung.MaxNumSeqs),
		"--gpu-memory-utilization " + strconv.FormatFloat(e.Rung.GPUMemoryUtilization, 'f', -1, 64)}
}

// The leader decides once for the group: an OOM of the leader's vLLM
// steps the leader one rung down, and the follower's next vLLM runs on the
// leader's rung (its command line has the leader's rung flags), not on the
// rung its own policy would keep after a kill (the group's end).
func TestAGroupStartsOnTheLeadersRung(t *testing.T) {
	leader, follower := groupScenes(t)
	oneShot(leader, "oom_on_start")
	leader.start()
	follower.start()
	le := leader.WaitEvent("the leader's vLLM runs out of memory", 1, 60*time.Second, isExited)
	if le.Failure == nil || string(le.Failure.Verdict.Cause) != "oom" {
		t.Fatalf("the leader's exit %+v, want oom", le.Failure)
	}
	ls := leader.WaitEvent("the leader starts again", 2, 60*time.Second, isStarting)
	fs := follower.WaitEvent("the follower starts again", 2, 60*time.Second, isStarting)
	if ls.Rung == nil || ls.Rung.Index != 1 {
		t.Fatalf("the leader's second start on rung %+v, want 1 (one down after the OOM)", ls.Rung)
	}
	if fs.Rung == nil || fs.Rung.Index != ls.Rung.Index {
		t.Errorf("the follower's second start on rung %+v, the leader's %d", fs.Rung, ls.Rung.Index)
	}
	testkit.ArgvHas(t, "the follower", fs.Argv, rungFlags(ls)...)
	fe := follower.WaitEvent("the follower's vLLM ended by the group", 1, 30*time.Second, isExited)
	if d := fe.Failure; d == nil || d.Decision.Delay != 0 || !strings.Contains(d.Decision.Reason, "the group's leader decides") {
		t.Errorf("the follower decided on its own: %+v", d)
	}
	groupCause(t, "the follower's end", fe, 0, "end")
	leader.WaitEvent("the leader ready", 1, 60*time.Second, isReady)
	follower.WaitEvent("the follower ready", 1, 60*time.Second, isReady)
	stopGroup(leader, follower)
}

// An OOM on a follower steps the whole group down: the follower's guard
// reads its own vLLM's log (a worker's torch.OutOfMemoryError, then exit
// 0) and says the cause with its tree's end; the leader's ladder, which
// counted the group's end once, steps one rung down before the next
// epoch, and both vLLMs start on rung 1. The follower's guard decides
// nothing of its own.
func TestAnOOMOnAFollowerStepsTheGroupDown(t *testing.T) {
	leader, follower := groupScenes(t)
	oneShot(follower, "oom_on_start")
	leader.start()
	follower.start()
	fe := follower.WaitEvent("the follower's vLLM runs out of memory", 1, 60*time.Second, isExited)
	if f := fe.Failure; f == nil || string(f.Verdict.Cause) != "oom" || f.ExitCode != 0 || f.Decision.Rung.Index != 0 {
		t.Fatalf("the follower's exit %+v, want an OOM (exit 0) and no rung of its own", fe.Failure)
	}
	le := leader.WaitEvent("the leader's vLLM ended by the group", 1, 60*time.Second, isExited)
	groupCause(t, "the leader's end", le, 1, "ended")
	ls := leader.WaitEvent("the leader starts again", 2, 60*time.Second, isStarting)
	fs := follower.WaitEvent("the follower starts again", 2, 60*time.Second, isStarting)
	if ls.Rung == nil || ls.Rung.Index != 1 {
		t.Fatalf("the leader's second start on rung %+v, want 1: the follower's OOM steps the group down", ls.Rung)
	}
	testkit.ArgvHas(t, "the follower", fs.Argv, rungFlags(ls)...)
	said := false
	for _, e := range leader.Events() {
		said = said || e.Kind == events.KindDecision && strings.Contains(e.Reason, "member 1's vLLM ended: GPU out of memory: rung 0→1")
	}
	if !said {
		t.Error("the leader's decision does not name member 1's OOM")
	}
	leader.WaitEvent("the leader ready", 1, 60*time.Second, isReady)
	follower.WaitEvent("the follower ready", 1, 60*time.Second, isReady)
	stopGroup(leader, follower)
}

// A follower whose vLLM dies again and again: the leader's policy counts
// each group end once and gives up once (give_up_after 3: three ends, exit
// 1); the follower neither backs off nor gives up on its own: it hears
// the leader's give-up and waits for the leader's guard to start again.
func TestAGroupGivesUpOnceAtTheLeader(t *testing.T) {
	leader, follower := groupScenes(t)
	for _, s := range []*scene{leader, follower} {
		s.extra = strings.Replace(s.extra, "[restart]\n", "[restart]\ngive_up_after = 3\ngive_up_window = \"1h\"\n", 1)
	}
	leader.start()
	follower.start()
	for n := 1; n <= 3; n++ {
		leader.WaitEvent("the leader ready", n, 60*time.Second, isReady)
		follower.WaitEvent("the follower ready", n, 60*time.Second, isReady)
		if err := syscall.Kill(lastStart(follower).PID, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", n, err)
		}
		le := leader.WaitEvent("the leader's vLLM ended by the group", n, 30*time.Second, isExited)
		fe := follower.WaitEvent("the follower's vLLM ended", n, 30*time.Second, isExited)
		if fe.Failure == nil || fe.Failure.Decision.Action != "restart" || fe.Failure.Decision.Delay != 0 {
			t.Errorf("death %d: the follower decided on its own: %+v", n, fe.Failure)
		}
		want := "restart"
		if n == 3 {
			want = "give_up"
		}
		if le.Failure == nil || string(le.Failure.Decision.Action) != want {
			t.Errorf("death %d: the leader's decision %+v, want %s", n, le.Failure, want)
		}
		groupCause(t, fmt.Sprintf("death %d: the leader's end", n), le, 1, "ended")
	}
	if code := leader.WaitExit(30 * time.Second); code != 1 {
		t.Errorf("the leader's guard exited %d, want 1 (gave up)", code)
	}
	// The leader's last words: the follower shows the give-up, not only a
	// leader gone quiet, and waits.
	d := waitState(t, follower.socket(), "starting", 30*time.Second)
	if g := d.Group; g == nil || len(g.Members) != 2 || g.Members[0].Said != "gave_up" {
		t.Errorf("the follower's view of the group %+v, want the leader's word gave_up", d.Group)
	}
	if n := leader.CountEvents(isExited); n != 3 {
		t.Errorf("the leader counted %d ends, want 3: each group end once", n)
	}
	if n := follower.CountEvents(isStarting); n != 3 {
		t.Errorf("the follower started %d times, want 3: it starts only on the leader's go", n)
	}
	follower.stopCleanly(20*time.Second, 10*time.Second)
}

// groupCause: an end the group caused is recorded as the group's, naming
// the member and the word it said, not a hang.
func groupCause(t *testing.T, what string, e events.Event, rank int, said string) {
	t.Helper()
	if e.Failure == nil {
		t.Fatalf("%s: no failure", what)
	}
	v := e.Failure.Verdict
	if v.Cause != "group" || v.Group == nil || v.Group.Rank != rank || v.Group.Said != said {
		t.Errorf("%s: cause %q %+v, want group naming member %d and %q", what, v.Cause, v.Group, rank, said)
	}
	for _, a := range v.Advice {
		if strings.Contains(a, "NCCL") {
			t.Errorf("%s: NCCL advice for the group's end: %q", what, a)
		}
	}
}

// `status` on every member shows the group: this guard's rank, the size,
// the leader, the epoch, each member's last word and when it was heard,
// and whether the group is ready (the document and the human view).
func TestStatusShowsTheGroup(t *testing.T) {
	leader, follower := groupScenes(t)
	groupReady(t, leader, follower, 60*time.Second)
	for rank, s := range []*scene{leader, follower} {
		d := waitState(t, s.socket(), "ready", 30*time.Second)
		g := d.Group
		if g == nil {
			t.Fatalf("rank %d: status has no group", rank)
		}
		if g.Rank != rank || g.Size != 2 || g.Epoch != 1 || !g.Ready || !strings.HasPrefix(g.Leader, "127.0.0.1:") || len(g.Members) != 2 {
			t.Errorf("rank %d: group %+v, want rank %d of 2, epoch 1, ready, leader 127.0.0.1, two members", rank, g, rank)
			continue
		}
		other := g.Members[1-rank]
		wantSaid := map[int]string{0: "running", 1: "ready"}[rank] // the other's word
		if !g.Members[rank].This || other.This || other.Said != wantSaid || other.Epoch != 1 || other.Heard.IsZero() || !other.Present {
			t.Errorf("rank %d: members %+v, want this guard and the other saying %q at epoch 1, heard", rank, g.Members, wantSaid)
		}
		var view strings.Builder
		control.WriteStatus(&view, d)
		for _, want := range []string{fmt.Sprintf("Group: rank %d of 2, leader 127.0.0.1:", rank), "epoch 1 (", "the group is ready",
			fmt.Sprintf("member %d", 1-rank), wantSaid + " at epoch 1", "heard "} {
			if !strings.Contains(view.String(), want) {
				t.Errorf("rank %d: the human view has no %q:\n%s", rank, want, view.String())
			}
		}
	}
	stopGroup(leader, follower)
}
