package realvllm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// groupHosts is two guards on 127.0.0.1 as two hosts of one real vLLM:
// tensor parallel 2 across them (the guard adds --nnodes 2, --node-rank,
// --master-addr and, on the follower, --headless), each vLLM bound to its
// own core, gloo between them. The leader (rank 0) fronts the proxy.
type groupHosts struct {
	t                *testing.T
	leader, follower *scene
	inFlight         []chan string // requests a fault sent, answered after it
}

func newGroupHosts(t *testing.T) *groupHosts {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "group-secret")
	if err := os.WriteFile(secret, []byte("a-group-secret-of-enough-bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	guards, rendezvous := testkit.FreePort(t), testkit.FreePort(t)
	g := &groupHosts{t: t}
	for rank := range 2 {
		s := newScene(t, generate("-tp", "2")...)
		s.env["VLLM_CPU_OMP_THREADS_BIND"] = strconv.Itoa(rank)
		s.extra = fmt.Sprintf("\n[group]\nenabled = true\nrank = %d\nsize = 2\nleader_address = \"127.0.0.1\"\nport = %d\nrendezvous_port = %d\n"+
			"secret_file = %q\nheartbeat_interval = \"500ms\"\nloss_timeout = \"5s\"\n"+
			"distributed_timeout = \"2m\"\ncpu_distributed_timeout = \"2m\"\nengine_ready_timeout = \"3m\"\n", rank, guards, rendezvous, secret)
		name := fmt.Sprintf("%s-rank%d", strings.ReplaceAll(t.Name(), "/", "_"), rank)
		t.Cleanup(func() { // after the scene's own cleanup: each host's log apart
			if t.Failed() && s.Guard != nil {
				s.keepArtifactAs(name)
			}
		})
		if rank == 0 {
			// The hang of a follower is the leader's to see: work in
			// flight and no token for stuck_timeout.
			s.proxy = testkit.FreePort(t)
			s.extra += "\n[liveness]\ninterval = \"1s\"\nstuck_timeout = \"20s\"\n"
			g.leader = s
		} else {
			g.follower = s
		}
	}
	return g
}

// epoch is the group's epoch as a member's `status --json` says it.
func (s *scene) epoch() int {
	s.t.Helper()
	grp, _ := s.status()["group"].(map[string]any)
	if grp == nil {
		s.t.Fatal("status has no group")
	}
	e, _ := grp["epoch"].(float64)
	return int(e)
}

// vllmTree is the scene's vLLM processes: ours without the guard's
// keeper (which carries vLLM's environment too).
func (s *scene) vllmTree() []int {
	var out []int
	for _, pid := range s.ours() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && !strings.Contains(string(b), "\x00__keeper\x00") {
			out = append(out, pid)
		}
	}
	return out
}

// titles are the titles (argv[0]) of the live processes pids.
func titles(pids []int) []string {
	var out []string
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); err == nil {
			out = append(out, strings.SplitN(string(b), "\x00", 2)[0])
		}
	}
	return out
}

// hasTitle: one of titles starts with prefix.
func hasTitle(titles []string, prefix string) bool {
	return slices.ContainsFunc(titles, func(t string) bool { return strings.HasPrefix(t, prefix) })
}

// groupFault is one fault of the scenario and what it must end in.
type groupFault struct {
	name string
	// do does the fault; it returns the follower's scene from then on
	// (a new guard when it killed the old one).
	do func(g *groupHosts) *scene
	// leaderCause: the cause the leader's guard records for its vLLM's end.
	leaderCause string
	// followerExit: the follower's guard records its vLLM's end (not when
	// the guard itself was killed); exit0: with exit code 0.
	followerExit, exit0 bool
}

// Two guards run one real vLLM across two "hosts" (TP=2, --nnodes 2, gloo
// on 127.0.0.1). Four faults, one after another on the same group: the
// leader's EngineCore killed; the follower's worker killed (its headless
// vLLM then exits 0: a failure, not a success); the follower's whole
// guard killed (its keeper kills its vLLM; the guard is started again, as
// systemd would); every process of the follower's vLLM stopped (SIGSTOP)
// with a stream in flight through the leader's proxy: a hang, which the
// leader's guard sees (no token for stuck_timeout) long before gloo's
// timeout. Each ends in one whole-group restart: the epoch moves by one on
// both guards, every process of the old epoch on both hosts is gone, the
// group is ready again, and the requests the proxy held get the answer
// the same vLLM gave before the fault.
func TestAGroupAcrossTwoHosts(t *testing.T) {
	scenario(t, "a group of two guards, TP=2 across two hosts: the leader's EngineCore killed, the follower's worker killed (exit 0), the follower's guard killed, the follower stopped with a stream in flight: each one whole-group restart, nothing of the old epoch left, held requests answered right")
	g := newGroupHosts(t)
	g.leader.start()
	g.follower.start()
	ls := g.leader.WaitEvent("the leader's vLLM starts", 1, startBound, isStarting)
	fs := g.follower.WaitEvent("the follower's vLLM starts", 1, startBound, isStarting)
	testkit.ArgvHas(t, "the leader", ls.Argv, "-tp 2", "--nnodes 2", "--node-rank 0", "--master-addr 127.0.0.1", "--distributed-timeout-seconds 120", "--cpu-distributed-timeout-seconds 120")
	testkit.ArgvHas(t, "the follower", fs.Argv, "-tp 2", "--nnodes 2", "--node-rank 1", "--master-addr 127.0.0.1", "--headless")
	g.leader.WaitEvent("the leader ready", 1, startBound, isReady)
	g.follower.WaitEvent("the follower ready (the group's word)", 1, startBound, isReady)

	// The oracle: the greedy answers of this vLLM, before any fault.
	base := g.leader.proxyURL()
	shortPath, short := resumeRequest(1, false, false, 8)
	longPath, longStream := resumeRequest(2, false, true, 64)
	want, wantLong := wholeIDs(base+shortPath, short), streamIDs(base+longPath, longStream, nil)
	if want.status != 200 || len(want.ids) != 8 || wantLong.status != 200 || !wantLong.done || len(wantLong.ids) != 64 {
		t.Fatalf("the group's answers before any fault: %d with %d ids, %d with %d ids (%.300s %.300s)",
			want.status, len(want.ids), wantLong.status, len(wantLong.ids), want.raw, wantLong.raw)
	}

	faults := []groupFault{
		{name: "the leader's EngineCore killed", leaderCause: "crash", followerExit: true, do: func(g *groupHosts) *scene {
			g.signal(g.leader, "VLLM::EngineCore", syscall.SIGKILL)
			return g.follower
		}},
		{name: "the follower's worker killed", leaderCause: "group", followerExit: true, exit0: true, do: func(g *groupHosts) *scene {
			g.signal(g.follower, "VLLM::Worker", syscall.SIGKILL)
			return g.follower
		}},
		{name: "the follower's guard killed", leaderCause: "group", do: func(g *groupHosts) *scene {
			old := g.follower.ours()
			g.follower.Signal(syscall.SIGKILL)
			g.follower.WaitExit(exitBound)
			// Its keeper kills its vLLM tree; then it starts again.
			waitGone(g.t, old, exitBound)
			again := *g.follower
			again.start()
			g.t.Cleanup(func() {
				if g.t.Failed() {
					again.keepArtifactAs(strings.ReplaceAll(g.t.Name(), "/", "_") + "-rank1-again")
				}
			})
			return &again
		}},
		{name: "the follower stopped with a stream in flight", leaderCause: "hang", followerExit: true, do: func(g *groupHosts) *scene {
			// Stopped once the stream has tokens: vLLM is mid-request.
			stopped, answered := make(chan struct{}), make(chan string, 1)
			var once sync.Once
			go func() {
				v := streamIDs(base+longPath, longStream, func(n int) {
					once.Do(func() {
						for _, pid := range g.follower.vllmTree() {
							syscall.Kill(pid, syscall.SIGSTOP)
						}
						close(stopped)
					})
				})
				answered <- judge(v, wantLong, true)
			}()
			select {
			case <-stopped:
			case v := <-answered:
				g.t.Fatalf("the stream ended before any token: %s", v)
			}
			g.inFlight = append(g.inFlight, answered)
			return g.follower
		}},
	}
	for i, f := range faults {
		g.fault(i+1, f, base+shortPath, short, want)
	}
	if n := g.leader.CountEvents(isStarting); n != len(faults)+1 {
		t.Errorf("the leader's vLLM started %d times for %d faults: one whole-group restart each", n, len(faults))
	}
}

// signal sends sig to s's vLLM process whose title starts with title.
func (g *groupHosts) signal(s *scene, title string, sig syscall.Signal) {
	g.t.Helper()
	pid := s.byTitle(title)
	if pid == 0 {
		g.t.Fatalf("no %s process", title)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		g.t.Fatal(err)
	}
}

// send sends a request through the leader's proxy in the background; the
// channel gets a verdict ("" when it got want's ids).
func (g *groupHosts) send(url string, body map[string]any, want clientView) chan string {
	c := make(chan string, 1)
	go func() { c <- judge(wholeIDs(url, body), want, false) }()
	return c
}

// judge: "" when v is the oracle's answer (a stream: whole, with no error
// event), else what is wrong.
func judge(v, want clientView, stream bool) string {
	if v.err != nil || v.status != 200 || !slices.Equal(v.ids, want.ids) || stream && (!v.done || v.errEv) {
		return fmt.Sprintf("status %d, ids %v, err %v, [DONE] %v, error event %v; want ids %v (%.300s)", v.status, v.ids, v.err, v.done, v.errEv, want.ids, v.raw)
	}
	return ""
}

// fault n: do it, then the group must restart whole, once.
func (g *groupHosts) fault(n int, f groupFault, url string, body map[string]any, want clientView) {
	t := g.t
	t.Logf("fault %d: %s", n, f.name)
	epoch := g.leader.epoch()
	if fe := g.follower.epoch(); fe != epoch {
		t.Fatalf("fault %d: before it the leader is at epoch %d, the follower at %d", n, epoch, fe)
	}
	lOld, fOld := g.leader.ours(), g.follower.ours()
	lt, ft := titles(lOld), titles(fOld)
	if !hasTitle(lt, "VLLM::EngineCore") || !hasTitle(lt, "VLLM::Worker_TP0") || !hasTitle(ft, "VLLM::Worker_TP1") {
		t.Fatalf("fault %d: the old epoch's processes are not the group's: leader %q, follower %q", n, lt, ft)
	}
	lExits, fExits := g.leader.CountEvents(isExited), g.follower.CountEvents(isExited)
	lStarts, fStarts, follower := g.leader.CountEvents(isStarting), g.follower.CountEvents(isStarting), g.follower
	g.inFlight = nil
	if g.follower = f.do(g); g.follower != follower {
		fStarts = 0 // a new guard
	}
	le := g.leader.WaitEvent("the leader's vLLM ended", lExits+1, exitBound, isExited)
	if c := causeOf(le); c != f.leaderCause {
		t.Errorf("fault %d (%s): the leader's guard says %q (%s), want %s", n, f.name, c, le.Failure.Verdict.Summary, f.leaderCause)
	}
	// Held by the proxy while the group restarts.
	held := append(g.inFlight, g.send(url, body, want))
	if f.followerExit {
		fe := g.follower.WaitEvent("the follower's vLLM ended", fExits+1, exitBound, isExited)
		if fe.Failure == nil || fe.Failure.Decision.Action != "restart" {
			t.Errorf("fault %d (%s): the follower's end not taken for a failure: %+v", n, f.name, fe.Failure)
		} else if f.exit0 && (fe.Failure.ExitCode != 0 || fe.Failure.Signal != "") {
			t.Errorf("fault %d (%s): the follower's vLLM ended %q, want exit code 0 (vLLM's headless rank exits 0 when a worker dies)", n, f.name, fe.Failure.Exit)
		}
	}
	ls := g.leader.WaitEvent("the leader's vLLM starts again", lStarts+1, startBound, isStarting)
	lr := g.leader.WaitEvent("the leader ready again", lStarts+1, startBound, isReady)
	fr := g.follower.WaitEvent("the follower ready again", 1, startBound, func(e events.Event) bool { return isReady(e) && e.Time.After(ls.Time) })
	t.Logf("fault %d: the leader's vLLM ended at %s (%s), the group ready again at %s (the follower at %s)",
		n, le.Time.Format("15:04:05.000"), le.Failure.Verdict.Summary, lr.Time.Format("15:04:05.000"), fr.Time.Format("15:04:05.000"))
	for i, c := range held {
		if v := <-c; v != "" {
			t.Errorf("fault %d (%s): request %d held through the restart: %s", n, f.name, i, v)
		}
	}
	if got := g.leader.CountEvents(isStarting); got != lStarts+1 {
		t.Errorf("fault %d (%s): the leader's vLLM started %d times after it, want once", n, f.name, got-lStarts)
	}
	if got := g.follower.CountEvents(isStarting); got != fStarts+1 {
		t.Errorf("fault %d (%s): the follower's vLLM started %d times after it, want once (for the leader's next epoch)", n, f.name, got-fStarts)
	}
	for _, s := range []*scene{g.leader, g.follower} {
		if e := s.epoch(); e != epoch+1 {
			t.Errorf("fault %d (%s): epoch %d after it, was %d: want one whole-group restart", n, f.name, e, epoch)
		}
	}
	waitGone(t, append(lOld, fOld...), exitBound)
}
