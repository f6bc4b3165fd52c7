package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// groupScenes are two guards on 127.0.0.1 as two hosts of one vLLM
// ([group], tensor parallel across them): the leader (rank 0) over the
// simulator's server, the follower (rank 1) over its headless rank.
func groupScenes(t *testing.T) (leader, follower *scene) {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "group-secret")
	if err := os.WriteFile(secret, []byte("a-group-secret-of-enough-bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	guards, rendezvous := testkit.FreePort(t), testkit.FreePort(t)
	for rank := range 2 {
		s := newScene(t)
		s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"-tp\", \"2\"]", bins.fakevllm)
		s.extra = fmt.Sprintf("\n[group]\nenabled = true\nrank = %d\nsize = 2\nleader_address = \"127.0.0.1\"\nport = %d\nrendezvous_port = %d\n"+
			"secret_file = %q\nheartbeat_interval = \"100ms\"\nloss_timeout = \"3s\"\n"+
			"\n[restart]\ninitial_delay = \"200ms\"\nmax_delay = \"1s\"\n", rank, guards, rendezvous, secret)
		if rank == 0 {
			leader = s
		} else {
			follower = s
		}
	}
	return leader, follower
}

// groupReady starts both guards of groupScenes and waits until each is
// ready (the follower's ready is the group's word).
func groupReady(t *testing.T, leader, follower *scene, within time.Duration) {
	t.Helper()
	leader.start()
	follower.start()
	leader.WaitEvent("the leader ready", 1, within, isReady)
	follower.WaitEvent("the follower ready", 1, within, isReady)
}

// stopGroup stops the follower's guard, then the leader's, each cleanly.
func stopGroup(leader, follower *scene) {
	follower.stopCleanly(20*time.Second, 10*time.Second)
	leader.stopCleanly(20*time.Second, 10*time.Second)
}

// killFollowersGuard SIGKILLs the follower's guard and waits until it and
// everything of its vLLM are gone (its keeper kills the tree).
func killFollowersGuard(follower *scene) {
	follower.Signal(syscall.SIGKILL)
	follower.WaitExit(10 * time.Second)
	follower.waitNoProcesses(10 * time.Second)
}

// wholeRestart waits for the group's restart number n (its n+1th start)
// after a fault: both vLLMs ended (each a failure, exit 0 too), the one
// the group ended naming why, the leader started before the follower,
// both ready again. It returns the follower's exit.
func wholeRestart(t *testing.T, leader, follower *scene, n int, ended *scene, why string) events.Event {
	t.Helper()
	fe := follower.WaitEvent("the follower's vLLM ended", n, 30*time.Second, isExited)
	le := leader.WaitEvent("the leader's vLLM ended", n, 30*time.Second, isExited)
	for _, e := range []events.Event{fe, le} {
		if e.Failure == nil || e.Failure.Decision.Action != "restart" {
			t.Errorf("restart %d: an exit not taken for a failure to restart from: %+v", n, e.Failure)
		}
	}
	ev := le
	if ended == follower {
		ev = fe
	}
	if v := verdictText(ev); !strings.Contains(v, why) {
		t.Errorf("restart %d: the exit the group ended says %q, want %q", n, v, why)
	}
	ls := leader.WaitEvent("the leader's vLLM starts again", n+1, 60*time.Second, isStarting)
	fs := follower.WaitEvent("the follower's vLLM starts again", n+1, 60*time.Second, isStarting)
	if !fs.Time.After(ls.Time) {
		t.Errorf("restart %d: the follower started at %s, before the leader at %s", n, fs.Time, ls.Time)
	}
	leader.WaitEvent("the leader ready again", n+1, 60*time.Second, isReady)
	follower.WaitEvent("the follower ready again", n+1, 60*time.Second, isReady)
	for _, s := range []*scene{leader, follower} {
		if c := s.CountEvents(isStarting); c != n+1 {
			t.Errorf("restart %d: %d starts, want %d: one whole-group restart per fault", n, c, n+1)
		}
	}
	return fe
}

// Two guards run one vLLM across two "hosts": the guard adds the
// multi-node flags (the follower headless), the follower is ready when the
// leader is. Each fault ends the epoch and restarts the group whole, the
// leader first: the follower's vLLM killed, the follower's vLLM exiting 0
// (vLLM's headless rank exits 0 when a worker dies), the leader's vLLM
// killed.
func TestAGroupRestartsWhole(t *testing.T) {
	leader, follower := groupScenes(t)
	leader.start()
	follower.start()
	ls := leader.WaitEvent("the leader's vLLM starts", 1, 30*time.Second, isStarting)
	fs := follower.WaitEvent("the follower's vLLM starts", 1, 30*time.Second, isStarting)
	testkit.ArgvHas(t, "the leader", ls.Argv, "--nnodes 2", "--node-rank 0", "--master-addr 127.0.0.1")
	testkit.ArgvHas(t, "the follower", fs.Argv, "--nnodes 2", "--node-rank 1", "--master-addr 127.0.0.1", "--headless")
	if strings.Contains(strings.Join(ls.Argv, " "), "--headless") {
		t.Errorf("the leader's vLLM runs headless: %q", ls.Argv)
	}
	leader.WaitEvent("the leader ready", 1, 30*time.Second, isReady)
	follower.WaitEvent("the follower ready (the group's word)", 1, 30*time.Second, isReady)

	faults := []struct {
		name   string
		victim *scene
		sig    syscall.Signal
		ended  *scene // the side the group's end killed
		why    string
	}{
		{"the follower's vLLM killed", follower, syscall.SIGKILL, leader, "member 1's guard says its vLLM ended"},
		{"the follower's vLLM exits 0", follower, syscall.SIGTERM, leader, "member 1's guard says its vLLM ended"},
		{"the leader's vLLM killed", leader, syscall.SIGKILL, follower, "the leader ended the epoch"},
	}
	for i, f := range faults {
		if err := syscall.Kill(lastStart(f.victim).PID, f.sig); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		fe := wholeRestart(t, leader, follower, i+1, f.ended, f.why)
		if f.sig == syscall.SIGTERM && (fe.Failure == nil || fe.Failure.ExitCode != 0) {
			t.Errorf("%s: the follower's exit %+v, want exit code 0", f.name, fe.Failure)
		}
	}
	stopGroup(leader, follower)
}

// A follower's guard that dies takes its vLLM with it (its keeper), the
// leader misses its heartbeats and kills its own vLLM; the guard started
// again (a new incarnation) joins, and the group starts whole.
func TestAGroupOutlivesAFollowersGuard(t *testing.T) {
	leader, follower := groupScenes(t)
	groupReady(t, leader, follower, 30*time.Second)
	killFollowersGuard(follower)
	le := leader.WaitEvent("the leader's vLLM killed", 1, 30*time.Second, isExited)
	if v := verdictText(le); !strings.Contains(v, "member 1 not heard for the loss timeout") {
		t.Errorf("the leader's exit says %q, want the member lost", v)
	}
	again := follower.restart()
	ls := leader.WaitEvent("the leader starts again", 2, 60*time.Second, isStarting)
	fs := again.WaitEvent("the new follower starts", 1, 60*time.Second, isStarting)
	if !fs.Time.After(ls.Time) {
		t.Errorf("the follower started at %s, before the leader at %s", fs.Time, ls.Time)
	}
	leader.WaitEvent("the leader ready again", 2, 60*time.Second, isReady)
	again.WaitEvent("the follower ready again", 1, 60*time.Second, isReady)
	again.stopCleanly(20*time.Second, 10*time.Second)
	leader.stopCleanly(20*time.Second, 10*time.Second)
}

// lastStart is a scene's last start of vLLM.
func lastStart(s *scene) events.Event {
	var last events.Event
	for _, e := range s.Events() {
		if isStarting(e) {
			last = e
		}
	}
	return last
}

// The leader's guard port as an attacker meets it: a stranger's hello and
// a megabyte of junk are refused and logged, nothing of them reaches the
// group, and the real follower still joins.
func TestTheGroupsPortRefusesStrangers(t *testing.T) {
	leader, follower := groupScenes(t)
	leader.start()
	leader.WaitLog("the leader joins the group", 1, 30*time.Second, msg("joined the group"))
	port := guardPort(t, leader)
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write(bytes.Repeat([]byte("junk"), 1<<18)) // ends when the guard closes the connection
	leader.WaitLog("the junk refused", 1, 30*time.Second, msg("a group connection refused"))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the leader's guard kept the stranger's connection open")
		}
	}
	if n := leader.CountEvents(isStarting); n != 0 {
		t.Fatalf("the leader started vLLM %d times with no follower joined", n)
	}
	follower.start()
	leader.WaitEvent("the leader ready once the follower joined", 1, 30*time.Second, isReady)
	follower.WaitEvent("the follower ready", 1, 30*time.Second, isReady)
}

// guardPort is the [group] port a scene's config names.
func guardPort(t *testing.T, s *scene) int {
	t.Helper()
	var port int
	for _, line := range strings.Split(s.extra, "\n") {
		if _, err := fmt.Sscanf(line, "port = %d", &port); err == nil {
			return port
		}
	}
	t.Fatal("no [group] port in the scene")
	return 0
}

// A follower's guard killed and started again at once, while the leader
// still serves (before the loss timeout): the new guard hears the leader's
// Ready of the running epoch, whose rendezvous is over, and starts nothing
// until the leader has ended that epoch (it hears the new incarnation) and
// opened the next: one start, after the leader's, and no vLLM of the old
// epoch started and killed on the way.
func TestAFollowersGuardStartedAgainWaitsForTheNextEpoch(t *testing.T) {
	leader, follower := groupScenes(t)
	for _, s := range []*scene{leader, follower} {
		s.extra = strings.Replace(s.extra, `loss_timeout = "3s"`, `loss_timeout = "1m"`, 1)
	}
	groupReady(t, leader, follower, 30*time.Second)
	killFollowersGuard(follower)
	again := follower.restart()
	le := leader.WaitEvent("the leader's vLLM ended by the group", 1, 30*time.Second, isExited)
	groupCause(t, "the leader's end", le, 1, "")
	ls := leader.WaitEvent("the leader starts again", 2, 60*time.Second, isStarting)
	again.WaitEvent("the new follower ready", 1, 60*time.Second, isReady)
	fs := again.WaitEvent("the new follower's start", 1, 60*time.Second, isStarting)
	if !fs.Time.After(ls.Time) {
		t.Errorf("the new follower started its vLLM at %s, before the leader's next epoch at %s", fs.Time, ls.Time)
	}
	if n, m := again.CountEvents(isStarting), again.CountEvents(isExited); n != 1 || m != 0 {
		t.Errorf("the new follower started %d times and its vLLM ended %d times: want one start, for the next epoch", n, m)
	}
	again.stopCleanly(20*time.Second, 10*time.Second)
	leader.stopCleanly(20*time.Second, 10*time.Second)
}

// A follower's vLLM runs headless (no HTTP): its guard does not scrape
// its /metrics, which would fail every sample and warn that it cannot.
// By the time the leader's guard has scraped its vLLM twice since the
// group was ready, the follower's guard would have tried too.
func TestAFollowersGuardScrapesNothing(t *testing.T) {
	leader, follower := groupScenes(t)
	groupReady(t, leader, follower, 30*time.Second)
	base := waitState(t, leader.socket(), "ready", 30*time.Second).VLLM.Scrapes
	leader.Until("two more scrapes by the leader's guard", 30*time.Second, func() bool {
		return waitState(t, leader.socket(), "ready", 30*time.Second).VLLM.Scrapes >= base+2
	})
	if v := waitState(t, follower.socket(), "ready", 30*time.Second).VLLM; v.Scrapes != 0 || v.LastError != "" {
		t.Errorf("the follower's guard scraped its headless vLLM: %d scrapes, %d failed, last %q", v.Scrapes, v.Failures, v.LastError)
	}
	var view strings.Builder
	control.WriteStatus(&view, waitState(t, follower.socket(), "ready", 30*time.Second))
	if !strings.Contains(view.String(), "runs vLLM headless") {
		t.Errorf("the follower's status does not say why its vLLM is not scraped:\n%s", view.String())
	}
	if n := follower.CountLogs(msg("cannot scrape vLLM metrics")); n != 0 {
		t.Errorf("the follower's guard warned %d times that it cannot scrape its headless vLLM", n)
	}
	stopGroup(leader, follower)
}
