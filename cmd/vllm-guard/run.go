package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/guard"
	"github.com/vllm-guard/vllm-guard/internal/logging"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
)

// cmdRun is `vllm-guard run`: flags, the config, the logger and the
// signals here; the guard itself (package guard) does the rest.
func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("run", "run [--config FILE | --instance NAME] [--init] [--events FILE] [-- EXTRA_VLLM_ARGS...]", stderr)
	cf := addConfigFlags(fs, "")
	initMode := fs.Bool("init", false, "act as an init: become a child subreaper and reap every orphan (automatic as PID 1)")
	eventsPath := fs.String("events", "", "also write every event (state changes, starts, ready, exits with cause, decisions, alerts) as JSON lines to this file")
	if code, ok := parse(fs, args, stdout); !ok {
		return code
	}
	// Before the config (it may hold keys) is read: no core dump, no
	// ptrace or /proc/PID/environ by the same user.
	if err := guard.NonDumpable(); err != nil {
		fmt.Fprintf(stderr, "vllm-guard: cannot mark the guard non-dumpable (prctl PR_SET_DUMPABLE): %v\n", err)
	}
	instance, path, ok := cf.resolve(stderr)
	if !ok {
		return exitcode.Usage
	}
	cfg, err := config.LoadFor(path, instance)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return exitcode.Config
	}
	log, err := logging.New(cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return exitcode.Config
	}
	defer log.Sync()

	// Every signal an operator or a supervisor may send has a meaning:
	// SIGTERM, SIGINT and SIGQUIT stop gracefully (a second one kills vLLM's
	// tree at once), SIGHUP reloads the config, SIGUSR1 and SIGUSR2 are
	// ignored (logged). None ends the guard abruptly.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if *initMode || os.Getpid() == 1 {
		if err := proctree.BecomeSubreaper(ctx); err != nil {
			log.Warn("could not become a child subreaper: orphans will not be reaped by the guard", zap.Error(err))
		}
	}

	g, err := guard.New(cfg, fs.Args(), log)
	if err == nil && *eventsPath != "" {
		err = g.WriteEvents(*eventsPath)
	}
	if err != nil {
		log.Error("vllm-guard cannot start", zap.Error(err))
		var ce *config.Error
		if errors.As(err, &ce) {
			return exitcode.Config
		}
		return exitcode.Failed
	}
	done := make(chan struct{})
	defer close(done)
	for _, w := range instanceWarnings(instance, cfg) {
		log.Warn(w)
	}
	if instance != "" {
		log.Info("running as an instance", zap.String("instance", instance), zap.String("config", path),
			zap.String("socket", cfg.Control.Socket), zap.String("state_dir", cfg.Control.StateDir))
	}
	go g.HandleSignals(sigs, done, stop, path, instance)
	code := g.Run(ctx)
	log.Info("vllm-guard exiting", zap.Int("exit_code", code))
	return code
}
