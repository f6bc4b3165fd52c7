package supervisor

import (
	"context"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/adapters"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
)

// The machine's collaborators sit behind these small interfaces, so the
// step machine is tested without processes (machine_test.go) and runs real
// ones in production: the OS adapters of package adapters (the keeper's
// tree through internal/proctree, the probes, the port's holder, the OOM
// count, the GPU through internal/gpumon).

// launcher starts one vLLM tree.
type launcher interface {
	Launch(spec launchSpec) (proc, error)
}

// launchSpec is one start of vLLM.
type launchSpec = adapters.LaunchSpec

// processLauncher starts vLLM under the keeper, for real.
type processLauncher struct{}

func (processLauncher) Launch(spec launchSpec) (proc, error) {
	t, err := adapters.ProcessLauncher{}.Launch(spec)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// probeResult is a probe's answer; lingerer a process that outlived the
// keeper and is not dead yet (the heart reads both).
type (
	probeResult = heart.ProbeResult
	lingerer    = heart.Lingerer
)

// proc is one running vLLM tree, as the machine sees it.
type proc interface {
	// PID is vLLM's API server (0 when it never started).
	PID() int
	// APIGone is closed when the API server exited; the rest of the tree
	// may still be going.
	APIGone() <-chan struct{}
	// Done is closed when the whole tree is gone.
	Done() <-chan struct{}
	// Exit is how the API server ended; valid after done.
	Exit() exitInfo
	// Stop asks vLLM to stop gracefully (SIGTERM to its API server).
	Stop()
	// Kill has the keeper kill the whole tree now (stop, walk, SIGKILL, in
	// rounds until it is empty); done closes once it is.
	Kill()
	// Refresh re-reads the tree from /proc and remembers every process seen.
	Refresh()
	// Tree is the tree as last read (for the GPU monitor's attribution).
	Tree() []int
	// Seen is every PID seen in this run's tree (for the release wait).
	Seen() []int
	// KillLeftovers kills what outlived the keeper (what it reported as
	// survivors, and what was seen and is still alive if the keeper itself
	// was killed; same processes only, never a reused PID) and returns
	// their PIDs, and those still alive after every kill round. It may take
	// long (a process stuck in the kernel): the machine calls it off its
	// loop.
	KillLeftovers() (outlived, unkillable []int)
	// Lingering is what outlived the keeper and is still alive, with where
	// each is stuck; it reads /proc only and never waits.
	Lingering() []lingerer
	// IO is the storage I/O (bytes read plus written) of each live process
	// of the tree: its growth is load progress (a silent download).
	IO() map[int]uint64
	// KillIfOurs kills pid if it is still the very process seen in the
	// Tree (never a reused PID) and says whether it did.
	KillIfOurs(pid int) bool
}

// checker asks vLLM whether it is ready or still alive.
type checker interface {
	Ready(ctx context.Context, level string, timeout time.Duration) probeResult
	Health(ctx context.Context, timeout time.Duration) probeResult
	// Paused asks vLLM whether an operator paused it (GET /is_paused);
	// the result's paused field says so.
	Paused(ctx context.Context, timeout time.Duration) probeResult
	Close()
}

// exitInfo is how vLLM's API server ended (the keeper's report).
type exitInfo = proctree.Exit

// GPUHealth is what the supervisor needs of the GPU's hardware health;
// nil: no such view (no NVML). Every method returns at once.
type GPUHealth interface {
	// GPUs is every watched GPU's hardware state, with the XID events
	// since since; nil when NVML cannot tell. fresh: read the counters now
	// rather than take the last sample's.
	GPUs(since time.Time, fresh bool) []cause.GPUDevice
}
