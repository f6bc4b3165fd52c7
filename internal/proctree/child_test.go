package proctree

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// A tree under the keeper, as the supervisor uses it.
func TestChildTracksItsTreeAndKillsOnlyItsOwn(t *testing.T) {
	p, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"sh", "-c", "sleep 300 & wait"},
		Env: os.Environ(), Grace: time.Second, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	c := p
	testkit.WaitFor(t, "the script's child", 30*time.Second, func() bool { c.Refresh(); return len(c.Seen()) >= 2 })
	tree := c.Tree()
	if tree[0] != c.keeperPID || !slices.Contains(tree, p.PID()) {
		t.Fatalf("tree %v: keeper %d first, then the API server %d", tree, c.keeperPID, p.PID())
	}
	if p.KillIfOurs(os.Getpid()) {
		t.Fatal("killIfOurs killed a process that was never in the tree")
	}
	var sleeper int
	for _, pid := range c.Seen() {
		if pid != p.PID() {
			sleeper = pid
		}
	}
	if !p.KillIfOurs(sleeper) {
		t.Fatalf("killIfOurs(%d) did not kill the tree's sleep", sleeper)
	}
	p.Stop()
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the tree did not stop on SIGTERM")
	}
	select {
	case <-p.APIGone():
	default:
		t.Fatal("done before apiGone")
	}
	if left, stuck := p.KillLeftovers(); len(left) != 0 || len(stuck) != 0 {
		t.Fatalf("leftovers %v (unkillable %v) after a clean stop", left, stuck)
	}
	if e := p.Exit(); e.Signal != "SIGTERM" && e.Code != 0 && e.Code != 143 {
		t.Fatalf("exit %+v", e)
	}
}

// lineWriter hands the first line written to it to a channel.
type lineWriter struct {
	buf  []byte
	once bool
	c    chan string
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	if i := bytes.IndexByte(w.buf, '\n'); i >= 0 && !w.once {
		w.once = true
		w.c <- string(w.buf[:i])
	}
	return len(b), nil
}

// The tree the GPU monitor asks for is read when it asks (issue 24 item
// 11): a process vLLM starts after the machine last refreshed (EngineCore,
// which holds nearly all the memory) is ours at the next sample, not a
// neighbour's until the next heartbeat (no refresh here at all). The script prints its child's pid
// after starting it, so the child exists when the line arrives.
func TestChildTreeIsReadWhenAsked(t *testing.T) {
	out := &lineWriter{c: make(chan string, 1)}
	p, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"sh", "-c", "sleep 300 & echo $!; wait"},
		Env: os.Environ(), Grace: time.Second, Stdout: out, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	c := p
	t.Cleanup(func() { p.Kill(); <-p.Done() })
	var line string
	select {
	case line = <-out.c:
	case <-time.After(30 * time.Second):
		t.Fatal("the script did not print its child's pid")
	}
	sleeper, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the script printed %q, not a pid", line)
	}
	if tree := c.Tree(); !slices.Contains(tree, sleeper) || tree[0] != c.keeperPID || !slices.Contains(tree, p.PID()) {
		t.Fatalf("tree %v without a refresh: want the keeper %d first, the API server %d and its new child %d", tree, c.keeperPID, p.PID(), sleeper)
	}
}
