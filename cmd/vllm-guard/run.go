package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/gpumon"
	"github.com/vllm-guard/vllm-guard/policy"
	"github.com/vllm-guard/vllm-guard/state"
	"github.com/vllm-guard/vllm-guard/supervisor"
)

func cmdRun(args []string, stderr io.Writer) int {
	fs := newFlags("run", "run [--config FILE] [--init] [-- EXTRA_VLLM_ARGS...]", stderr)
	cfgPath := fs.String("config", "", "config file (default $VLLM_GUARD_CONFIG, ./vllm-guard.toml, /etc/vllm-guard/vllm-guard.toml)")
	initMode := fs.Bool("init", false, "act as an init: become a child subreaper and reap every orphan (automatic as PID 1)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	cfg, err := config.Load(config.Resolve(*cfgPath))
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return exitConfig
	}
	log, err := newLogger(cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return exitConfig
	}
	defer log.Sync()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *initMode || os.Getpid() == 1 {
		if err := supervisor.BecomeSubreaper(ctx); err != nil {
			log.Warn("could not become a child subreaper: orphans will not be reaped by the guard", zap.Error(err))
		}
	}

	g, err := newGuard(cfg, fs.Args(), log)
	if err != nil {
		log.Error("vllm-guard cannot start", zap.Error(err))
		var ce *config.Error
		if errors.As(err, &ce) {
			return exitConfig
		}
		return exitFailed
	}
	code := g.run(ctx)
	log.Info("vllm-guard exiting", zap.Int("exit_code", code))
	return code
}

// guard wires the supervisor to everything around it: the state store, the
// GPU monitor, and (through hooks) incidents.
type guard struct {
	cfg   *config.Config
	log   *zap.Logger
	store *state.Store
	gpu   *gpumon.Monitor
	pol   *policy.Policy
	sup   *supervisor.Supervisor

	mu           sync.Mutex
	lastIncident *state.Incident
}

func newGuard(cfg *config.Config, extra []string, log *zap.Logger) (*guard, error) {
	g := &guard{cfg: cfg, log: log}
	store, warnings, err := state.Open(cfg.Control.StateDir, log.Named("state"))
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	g.store = store
	var pst policy.State
	if found, warning := store.Load(&pst); warning != "" {
		log.Warn(warning)
	} else if found {
		log.Info("resuming from the saved state", zap.String("path", store.StatePath()), zap.Int("rung", pst.Rung))
	}
	g.pol = policy.New(cfg, pst, realClock{})

	cuda, _ := childEnvValue(cfg, "CUDA_VISIBLE_DEVICES")
	g.gpu = gpumon.Open(gpumon.Options{
		Devices:            cfg.GPU.Devices,
		CUDAVisibleDevices: cuda,
		SampleInterval:     cfg.GPU.SampleInterval.Duration,
		WarnFraction:       cfg.GPU.WarnFraction,
		CriticalFraction:   cfg.GPU.CriticalFraction,
		PredictHorizon:     cfg.GPU.PredictHorizon.Duration,
	}, log.Named("gpu"))

	sup, err := supervisor.New(cfg, supervisor.Options{
		Log:       log,
		Policy:    g.pol,
		GPU:       supervisor.MonitorGPU(g.gpu),
		ExtraArgs: extra,
		Hooks: supervisor.Hooks{
			OnPolicy:  g.savePolicy,
			OnFailure: g.recordIncident,
		},
	})
	if err != nil {
		return nil, err
	}
	g.sup = sup
	return g, nil
}

func (g *guard) run(ctx context.Context) int {
	// Before the first start, so the free-memory check sees the GPUs; Run
	// reports a failure.
	_ = g.gpu.Open()
	var wg sync.WaitGroup
	gctx, cancel := context.WithCancel(context.Background())
	wg.Add(1)
	go func() { defer wg.Done(); g.gpu.Run(gctx) }()
	defer func() {
		cancel()
		wg.Wait()
		g.gpu.Close()
	}()
	return g.sup.Run(ctx)
}

func (g *guard) savePolicy(st policy.State) {
	if err := g.store.Save(st); err != nil {
		g.log.Warn("could not save the guard's state: a restarted guard will start on rung 0", zap.Error(err))
	}
}

// recordIncident writes one incident record per failure.
func (g *guard) recordIncident(f supervisor.Failure) {
	inc := state.Incident{
		Time: f.Time, Cause: f.Verdict.Cause, Confidence: f.Verdict.Confidence, Summary: f.Verdict.Summary,
		Evidence: f.Verdict.Evidence, ExitCode: f.ExitCode, Signal: f.Signal, Phase: f.Phase,
		RungBefore: f.RungBefore, RungAfter: f.Decision.Rung, Action: f.Decision.Action, Reason: f.Decision.Reason,
		Delay: f.Decision.Delay,
	}
	from := max(0, len(f.Lines)-g.cfg.Log.ChildLines)
	for _, l := range f.Lines[from:] {
		inc.LastLines = append(inc.LastLines, l.Text)
	}
	snap := g.gpu.Snapshot()
	interval := g.cfg.GPU.SampleInterval.Duration
	for _, d := range snap.Devices {
		if inc.MemoryTrend == "" || d.Trend != "steady" {
			inc.MemoryTrend = d.Trend
		}
		for i, fr := range d.History {
			t := f.Time.Add(-time.Duration(len(d.History)-1-i) * interval)
			if i < len(inc.Memory) {
				inc.Memory[i].Fraction = max(inc.Memory[i].Fraction, fr)
			} else {
				inc.Memory = append(inc.Memory, state.MemSample{T: t, Fraction: fr})
			}
		}
	}
	path, err := g.store.AddIncident(inc)
	if err != nil {
		g.log.Warn("could not write the incident record", zap.Error(err))
		return
	}
	g.log.Info("incident recorded", zap.String("path", path), zap.String("cause", string(inc.Cause)))
	g.mu.Lock()
	g.lastIncident = &inc
	g.mu.Unlock()
}

// childEnvValue is what vLLM will see for k: [vllm] env first, then the guard's.
func childEnvValue(cfg *config.Config, k string) (string, bool) {
	if v, ok := cfg.VLLM.Env[k]; ok {
		return v, true
	}
	return os.LookupEnv(k)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
