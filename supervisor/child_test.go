package supervisor

import (
	"bytes"
	"os"
	"slices"
	"testing"
	"time"
)

// The real process port: a tree under the keeper, as the machine uses it.
func TestChildTracksItsTreeAndKillsOnlyItsOwn(t *testing.T) {
	p, err := processLauncher{}.launch(launchSpec{keeper: testKeeper(t), argv: []string{"sh", "-c", "sleep 300 & wait"},
		env: os.Environ(), grace: time.Second, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	c := p.(*child)
	waitFor(t, "the script's child", 5*time.Second, func() bool { c.refresh(); return len(c.seen()) >= 2 })
	tree := c.tree()
	if tree[0] != c.keeperPID || !slices.Contains(tree, p.pid()) {
		t.Fatalf("tree %v: keeper %d first, then the API server %d", tree, c.keeperPID, p.pid())
	}
	if p.killIfOurs(os.Getpid()) {
		t.Fatal("killIfOurs killed a process that was never in the tree")
	}
	var sleeper int
	for _, pid := range c.seen() {
		if pid != p.pid() {
			sleeper = pid
		}
	}
	if !p.killIfOurs(sleeper) {
		t.Fatalf("killIfOurs(%d) did not kill the tree's sleep", sleeper)
	}
	p.stop()
	select {
	case <-p.done():
	case <-time.After(30 * time.Second):
		t.Fatal("the tree did not stop on SIGTERM")
	}
	select {
	case <-p.apiGone():
	default:
		t.Fatal("done before apiGone")
	}
	if left := p.killLeftovers(); len(left) != 0 {
		t.Fatalf("leftovers %v after a clean stop", left)
	}
	if e := p.exit(); e.Signal != "SIGTERM" && e.Code != 0 && e.Code != 143 {
		t.Fatalf("exit %+v", e)
	}
}
