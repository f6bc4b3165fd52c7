package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/policy"
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

	g, err := newGuard(ctx, cfg, fs.Args(), log)
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

// guard wires the supervisor to everything around it.
type guard struct {
	cfg *config.Config
	log *zap.Logger
	sup *supervisor.Supervisor
}

func newGuard(ctx context.Context, cfg *config.Config, extra []string, log *zap.Logger) (*guard, error) {
	g := &guard{cfg: cfg, log: log}
	pol := policy.New(cfg, policy.State{}, realClock{})
	sup, err := supervisor.New(cfg, supervisor.Options{
		Log:       log,
		Policy:    pol,
		ExtraArgs: extra,
	})
	if err != nil {
		return nil, err
	}
	g.sup = sup
	return g, nil
}

func (g *guard) run(ctx context.Context) int {
	return g.sup.Run(ctx)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
