package group

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// fakeLocal is a host's supervisor as the driver sees it: every call
// recorded as a line on a channel the test reads in order.
type fakeLocal struct{ calls chan string }

func newFakeLocal() *fakeLocal { return &fakeLocal{calls: make(chan string, 64)} }

func (f *fakeLocal) Kill(epoch uint64, c Cause) { f.calls <- fmt.Sprintf("kill %d: %s", epoch, c) }
func (f *fakeLocal) Start(epoch uint64, rung int, member int, fault Fault) {
	if fault != 0 {
		f.calls <- fmt.Sprintf("start %d rung %d after member %d's %s", epoch, rung, member, fault.Word())
		return
	}
	f.calls <- fmt.Sprintf("start %d rung %d", epoch, rung)
}
func (f *fakeLocal) Ended(epoch uint64, c Cause) { f.calls <- fmt.Sprintf("ended %d: %s", epoch, c) }

// expect waits for the host's next calls, in order.
func (f *fakeLocal) expect(t *testing.T, who string, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case got := <-f.calls:
			if got != w {
				t.Fatalf("%s: %q, want %q", who, got, w)
			}
		case <-time.After(bound):
			t.Fatalf("%s: never %q", who, w)
		}
	}
}

type member struct {
	d     *Driver
	local *fakeLocal
	stop  func()
}

func startMember(t *testing.T, rank int, addr string, inc uint64) (*member, string) {
	t.Helper()
	const beat, lossT = 50 * time.Millisecond, 2 * time.Second
	node, err := Start(Options{Rank: rank, Size: 2, Address: addr, Secret: secret, Incarnation: inc, Interval: beat, LossTimeout: lossT})
	if err != nil {
		t.Fatal(err)
	}
	if rank == 0 {
		addr = node.Addr().String()
	}
	m := &member{local: newFakeLocal()}
	m.d = NewDriver(Config{Rank: rank, Size: 2, LossTimeout: lossT}, node, m.local, beat)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.d.Run(ctx) }()
	var once sync.Once
	m.stop = func() { once.Do(func() { cancel(); wg.Wait(); node.Close() }) }
	t.Cleanup(m.stop)
	return m, addr
}

// Two guards over real sockets on 127.0.0.1 run the group's epochs: the
// leader starts first, the follower when told; the follower's vLLM exits 0
// (its guard calls it a crash) and the whole group restarts on a new
// epoch, the leader told the member's cause; the leader's guard dies and
// the follower kills its tree.
func TestTwoGuardsRunTheEpochs(t *testing.T) {
	l, addr := startMember(t, 0, "127.0.0.1:0", 1)
	f, _ := startMember(t, 1, addr, 2)

	l.local.expect(t, "leader", "start 1 rung 0")
	l.d.LocalLaunched(1, 3)
	f.local.expect(t, "follower", "start 1 rung 3")
	l.d.LocalReady(1)
	testkit.WaitFor(t, "the follower hears the group ready", bound, func() bool { return f.d.State().GroupReady() })

	// The follower's vLLM exits 0: its tree is gone, nothing else said.
	f.d.LocalGone(FaultOf("crash"))
	f.local.expect(t, "follower", "ended 1: this host's vLLM ended")
	l.local.expect(t, "leader", "ended 1: member 1's guard says its vLLM ended", "kill 1: member 1's guard says its vLLM ended")
	l.d.LocalGone(0)
	l.local.expect(t, "leader", "start 2 rung 3 after member 1's crash")
	l.d.LocalLaunched(2, 3)
	f.local.expect(t, "follower", "start 2 rung 3")

	// The leader's guard dies: the follower loses its heartbeat.
	l.stop()
	f.local.expect(t, "follower", "ended 2: the leader not heard for the loss timeout", "kill 2: the leader not heard for the loss timeout")
	f.d.LocalGone(0)

	// A new leader guard (a new incarnation, its epoch 0) learns epoch 2
	// and opens epoch 3.
	l2, _ := startMember(t, 0, addr, 9)
	l2.local.expect(t, "leader", "start 3 rung 0")
	l2.d.LocalLaunched(3, 0)
	f.local.expect(t, "follower", "start 3 rung 0")
}

// A leader's guard that gave up and closes says so as its last words: the
// follower hears the give-up, not only a leader gone quiet.
func TestALeaderThatGaveUpSaysSoAsItCloses(t *testing.T) {
	l, addr := startMember(t, 0, "127.0.0.1:0", 1)
	f, _ := startMember(t, 1, addr, 2)
	l.local.expect(t, "leader", "start 1 rung 0")
	l.d.LocalLaunched(1, 0)
	f.local.expect(t, "follower", "start 1 rung 0")
	l.d.LocalGaveUp() // (the leader says nothing between: no End)
	l.stop()
	f.local.expect(t, "follower", "ended 1: the leader's guard gave up: fix the cause on the leader's host and start its guard again",
		"kill 1: the leader's guard gave up: fix the cause on the leader's host and start its guard again")
}
