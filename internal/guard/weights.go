package guard

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
	"github.com/vllm-guard/vllm-guard/internal/weightcache"
)

// The weight cache daemon's wiring ([weights], internal/weightcache): the
// guard starts it before vLLM (the supervisor waits for it before each
// launch), tells the GPU monitor its processes are the guard's own,
// restarts vLLM when it died (the next launch starts it again first), and
// stops it after vLLM.

// weightCache is the daemon the guard runs; nil when it runs none.
type weightCache struct {
	d      *weightcache.Daemon
	ctx    context.Context // ends when vLLM's supervision has ended
	cancel context.CancelFunc
	died   func(why string) // the guard's answer to a death (set once the supervisor exists)
}

// weightRole is what status calls the daemon's processes.
const weightRole = "weight cache daemon"

// newWeightCache reads [weights] and vLLM's command line: no daemon (nil)
// unless it is wanted; with cache = "daemon", --load-format ipc_cache is
// added to vLLM's extra arguments (returned with the command line re-read).
// A command the daemon's cannot be derived from is the operator's to fix.
func newWeightCache(cfg *config.Config, extra []string, args *vllmargs.Args, log *zap.Logger) (*weightCache, []string, *vllmargs.Args, error) {
	argv, add, err := weightcache.Command(cfg.Weights.Cache, args)
	if err != nil {
		return nil, nil, nil, &config.Error{File: cfg.Path, Key: "[weights] cache", Msg: err.Error(), Err: err}
	}
	if argv == nil {
		return nil, extra, args, nil
	}
	if len(add) > 0 {
		extra = append(append([]string(nil), extra...), add...)
		if args, err = cfg.VLLMArgs(extra); err != nil {
			return nil, nil, nil, err
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("find own executable for the weight cache daemon's keeper: %w", err)
	}
	w := &weightCache{}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.d = weightcache.New(weightcache.Options{Argv: argv, HealthPort: cfg.Weights.HealthPort, Keeper: []string{exe, proctree.KeeperArg},
		Env: launch.ChildEnv(os.Environ(), cfg.VLLM.Env), Dir: cfg.VLLM.Workdir, StopTimeout: cfg.VLLM.StopTimeout.Duration,
		Log: log.Named("weight-cache"), OnDeath: func(why string) { w.died(why) }})
	log.Info("the weight cache daemon runs before vLLM: a restart maps its weights instead of reading the disk", zap.Strings("argv", args.Masked(argv)))
	return w, extra, args, nil
}

// beforeLaunch is what the supervisor waits for before each launch (nil:
// nothing).
func (w *weightCache) beforeLaunch() func(context.Context) error {
	if w == nil {
		return nil
	}
	return w.d.Ready
}

// wire tells the GPU monitor that the daemon's processes are the guard's
// own (their memory counts in vLLM's budget, never as another process's
// or an orphan's) and has a death restart vLLM with the reason.
func (w *weightCache) wire(g *Guard) {
	if w == nil {
		return
	}
	g.gpu.SetOwn(weightRole, w.d.PIDs)
	w.died = func(why string) {
		reason := fmt.Sprintf("its weight cache daemon died (%s): vLLM starts again after the daemon, and maps its weights", why)
		ctx, cancel := context.WithTimeout(w.ctx, time.Minute)
		defer cancel()
		if err := g.pair.RestartFor(ctx, reason); err != nil && w.ctx.Err() == nil {
			g.log.Warn("could not restart vLLM after its weight cache daemon died", zap.Error(err))
		}
	}
}

// stop stops the daemon, after vLLM: the guard's stop.
func (w *weightCache) stop() {
	if w == nil {
		return
	}
	w.cancel()
	w.d.Stop()
}

// status is the daemon in the status document (nil: none).
func (w *weightCache) status() *weightcache.Status {
	if w == nil {
		return nil
	}
	st := w.d.Status()
	return &st
}
