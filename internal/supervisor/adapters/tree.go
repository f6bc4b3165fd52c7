package adapters

import (
	"io"
	"os"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
)

// processLauncher starts vLLM under the keeper, for real
// (internal/proctree).
type ProcessLauncher struct{}

func (ProcessLauncher) Launch(spec LaunchSpec) (TreeProc, error) {
	c, err := proctree.Start(proctree.Spec{Keeper: spec.Keeper, Argv: spec.Argv, Env: launch.VLLMEnv(os.Environ(), spec.Env), Dir: spec.Dir,
		Grace: spec.Grace, Stdout: spec.Stdout, Stderr: spec.Stderr})
	if err != nil {
		return TreeProc{}, err
	}
	return TreeProc{c}, nil
}

// treeProc is a tree under its keeper as the machine sees it: proc over a
// proctree.Child.
type TreeProc struct{ C *proctree.Child }

func (p TreeProc) PID() int                                    { return p.C.PID() }
func (p TreeProc) APIGone() <-chan struct{}                    { return p.C.APIGone() }
func (p TreeProc) Done() <-chan struct{}                       { return p.C.Done() }
func (p TreeProc) Exit() proctree.Exit                         { return p.C.Exit() }
func (p TreeProc) Stop()                                       { p.C.Stop() }
func (p TreeProc) Kill()                                       { p.C.Kill() }
func (p TreeProc) Refresh()                                    { p.C.Refresh() }
func (p TreeProc) Tree() []int                                 { return p.C.Tree() }
func (p TreeProc) Seen() []int                                 { return p.C.Seen() }
func (p TreeProc) KillLeftovers() (outlived, unkillable []int) { return p.C.KillLeftovers() }
func (p TreeProc) IO() map[int]uint64                          { return p.C.IO() }
func (p TreeProc) KillIfOurs(pid int) bool                     { return p.C.KillIfOurs(pid) }

func (p TreeProc) Lingering() []heart.Lingerer {
	var out []heart.Lingerer
	for _, l := range p.C.Lingering() {
		out = append(out, heart.Lingerer{PID: l.PID, State: l.State, WChan: l.WChan})
	}
	return out
}

// launchSpec is one start of vLLM.
type LaunchSpec struct {
	Keeper []string // the keeper's argv prefix: [exe, KeeperArg]
	Argv   []string
	Env    map[string]string // [vllm] env, over the guard's own environment
	Dir    string
	Grace  time.Duration
	Stdout io.Writer
	Stderr io.Writer
}
