package supervisor

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
)

// The machine's collaborators sit behind these small interfaces, so the
// step machine is tested without processes (machine_test.go) and runs real
// ones in production (internal/proctree, probe.go, gpu.go).

// launcher starts one vLLM tree.
type launcher interface {
	launch(spec launchSpec) (proc, error)
}

// launchSpec is one start of vLLM.
type launchSpec struct {
	keeper []string // the keeper's argv prefix: [exe, KeeperArg]
	argv   []string
	env    map[string]string // [vllm] env, over the guard's own environment
	dir    string
	grace  time.Duration
	stdout io.Writer
	stderr io.Writer
}

// proc is one running vLLM tree, as the machine sees it.
type proc interface {
	// pid is vLLM's API server (0 when it never started).
	pid() int
	// apiGone is closed when the API server exited; the rest of the tree
	// may still be going.
	apiGone() <-chan struct{}
	// done is closed when the whole tree is gone.
	done() <-chan struct{}
	// exit is how the API server ended; valid after done.
	exit() exitInfo
	// stop asks vLLM to stop gracefully (SIGTERM to its API server).
	stop()
	// kill has the keeper kill the whole tree now (stop, walk, SIGKILL, in
	// rounds until it is empty); done closes once it is.
	kill()
	// refresh re-reads the tree from /proc and remembers every process seen.
	refresh()
	// tree is the tree as last read (for the GPU monitor's attribution).
	tree() []int
	// seen is every PID seen in this run's tree (for the release wait).
	seen() []int
	// killLeftovers kills what outlived the keeper (what it reported as
	// survivors, and what was seen and is still alive if the keeper itself
	// was killed; same processes only, never a reused PID) and returns
	// their PIDs, and those still alive after every kill round. It may take
	// long (a process stuck in the kernel): the machine calls it off its
	// loop.
	killLeftovers() (outlived, unkillable []int)
	// lingering is what outlived the keeper and is still alive, with where
	// each is stuck; it reads /proc only and never waits.
	lingering() []lingerer
	// io is the storage I/O (bytes read plus written) of each live process
	// of the tree: its growth is load progress (a silent download).
	io() map[int]uint64
	// killIfOurs kills pid if it is still the very process seen in the
	// tree (never a reused PID) and says whether it did.
	killIfOurs(pid int) bool
}

// checker asks vLLM whether it is ready or still alive.
type checker interface {
	ready(ctx context.Context, level string, timeout time.Duration) probeResult
	health(ctx context.Context, timeout time.Duration) probeResult
	// paused asks vLLM whether an operator paused it (GET /is_paused);
	// the result's paused field says so.
	paused(ctx context.Context, timeout time.Duration) probeResult
	close()
}

// exitInfo is how vLLM's API server ended (the keeper's report).
type exitInfo = proctree.Exit

// processLauncher starts vLLM under the keeper, for real
// (internal/proctree).
type processLauncher struct{}

func (processLauncher) launch(spec launchSpec) (proc, error) {
	c, err := proctree.Start(proctree.Spec{Keeper: spec.keeper, Argv: spec.argv, Env: launch.ChildEnv(os.Environ(), spec.env), Dir: spec.dir,
		Grace: spec.grace, Stdout: spec.stdout, Stderr: spec.stderr})
	if err != nil {
		return nil, err
	}
	return treeProc{c}, nil
}

// treeProc is a tree under its keeper as the machine sees it: proc over a
// proctree.Child.
type treeProc struct{ c *proctree.Child }

func (p treeProc) pid() int                                    { return p.c.PID() }
func (p treeProc) apiGone() <-chan struct{}                    { return p.c.APIGone() }
func (p treeProc) done() <-chan struct{}                       { return p.c.Done() }
func (p treeProc) exit() exitInfo                              { return p.c.Exit() }
func (p treeProc) stop()                                       { p.c.Stop() }
func (p treeProc) kill()                                       { p.c.Kill() }
func (p treeProc) refresh()                                    { p.c.Refresh() }
func (p treeProc) tree() []int                                 { return p.c.Tree() }
func (p treeProc) seen() []int                                 { return p.c.Seen() }
func (p treeProc) killLeftovers() (outlived, unkillable []int) { return p.c.KillLeftovers() }
func (p treeProc) io() map[int]uint64                          { return p.c.IO() }
func (p treeProc) killIfOurs(pid int) bool                     { return p.c.KillIfOurs(pid) }

func (p treeProc) lingering() []lingerer {
	var out []lingerer
	for _, l := range p.c.Lingering() {
		out = append(out, lingerer{pid: l.PID, state: l.State, wchan: l.WChan})
	}
	return out
}

// lingerer is a process that outlived the keeper and is not dead yet.
type lingerer struct {
	pid   int
	state byte   // /proc/PID/stat's state: D is uninterruptible sleep (stuck in the kernel)
	wchan string // the kernel function it waits in, when readable
}

// lingeringText says which processes do not die and where they are stuck:
// "pid 1234 does not die: state D in nvidia_…".
func lingeringText(ls []lingerer) string {
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		t := fmt.Sprintf("pid %d does not die: state %c", l.pid, l.state)
		if l.wchan != "" && l.wchan != "0" {
			t += " in " + l.wchan
		}
		parts = append(parts, t)
	}
	return strings.Join(parts, "; ")
}

// GPUHealth is what the supervisor needs of the GPU's hardware health;
// nil: no such view (no NVML). Every method returns at once.
type GPUHealth interface {
	// GPUs is every watched GPU's hardware state, with the XID events
	// since since; nil when NVML cannot tell. fresh: read the counters now
	// rather than take the last sample's.
	GPUs(since time.Time, fresh bool) []policy.GPUDevice
}
