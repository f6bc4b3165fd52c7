package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
			"secret_file = %q\nheartbeat_interval = \"100ms\"\nloss_timeout = \"1s\"\n", rank, guards, rendezvous, secret)
		if rank == 0 {
			leader = s
		} else {
			follower = s
		}
	}
	return leader, follower
}

// argvHas: the start's command line has each flag with its value.
func argvHas(t *testing.T, who string, argv []string, want ...string) {
	t.Helper()
	line := " " + strings.Join(argv, " ") + " "
	for _, w := range want {
		if !strings.Contains(line, " "+w+" ") {
			t.Errorf("%s's vLLM command %q has no %q", who, argv, w)
		}
	}
}

// Two guards run one vLLM across two "hosts": the guard adds the
// multi-node flags (the follower headless), the follower is ready when the
// leader is; a follower's vLLM killed ends the epoch: the leader's vLLM is
// killed too, and the group restarts whole, the leader first.
func TestAGroupRestartsWhole(t *testing.T) {
	leader, follower := groupScenes(t)
	leader.start()
	follower.start()
	ls := leader.WaitEvent("the leader's vLLM starts", 1, 30*time.Second, isStarting)
	fs := follower.WaitEvent("the follower's vLLM starts", 1, 30*time.Second, isStarting)
	argvHas(t, "the leader", ls.Argv, "--nnodes 2", "--node-rank 0", "--master-addr 127.0.0.1")
	argvHas(t, "the follower", fs.Argv, "--nnodes 2", "--node-rank 1", "--master-addr 127.0.0.1", "--headless")
	if strings.Contains(strings.Join(ls.Argv, " "), "--headless") {
		t.Errorf("the leader's vLLM runs headless: %q", ls.Argv)
	}
	leader.WaitEvent("the leader ready", 1, 30*time.Second, isReady)
	follower.WaitEvent("the follower ready (the group's word)", 1, 30*time.Second, isReady)

	// The follower's vLLM dies.
	if err := syscall.Kill(fs.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	follower.WaitEvent("the follower's vLLM ended", 1, 30*time.Second, isExited)
	le := leader.WaitEvent("the leader's vLLM killed: the epoch ended", 1, 30*time.Second, isExited)
	if v := verdictText(le); !strings.Contains(v, "member 1's guard says its vLLM ended") {
		t.Errorf("the leader's exit names %q, want the member's end", v)
	}
	ls2 := leader.WaitEvent("the leader's vLLM starts again", 2, 60*time.Second, isStarting)
	fs2 := follower.WaitEvent("the follower's vLLM starts again", 2, 60*time.Second, isStarting)
	if !fs2.Time.After(ls2.Time) {
		t.Errorf("the follower started at %s, before the leader at %s", fs2.Time, ls2.Time)
	}
	leader.WaitEvent("the leader ready again", 2, 60*time.Second, isReady)
	follower.WaitEvent("the follower ready again", 2, 60*time.Second, isReady)
	if n := leader.CountEvents(isStarting); n != 2 {
		t.Errorf("the leader started %d times, want 2: one whole-group restart", n)
	}

	follower.stopCleanly(20*time.Second, 10*time.Second)
	leader.stopCleanly(20*time.Second, 10*time.Second)
}
