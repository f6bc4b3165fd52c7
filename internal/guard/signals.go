package guard

import (
	"context"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/logging"
)

// HandleSignals turns signals into a stop, an escalation or a reload,
// until done.
func (g *Guard) HandleSignals(sigs <-chan os.Signal, done <-chan struct{}, stop func(), path, instance string) {
	stopping := false
	for {
		select {
		case <-done:
			return
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				g.reload(path, instance)
			case syscall.SIGUSR1, syscall.SIGUSR2:
				g.log.Info("signal ignored: SIGUSR1 and SIGUSR2 mean nothing to the guard", zap.String("signal", sig.String()))
			default:
				if stopping {
					g.log.Warn("asked to stop again: killing vLLM's process tree now", zap.String("signal", sig.String()))
					g.pair.Kill()
					continue
				}
				stopping = true
				g.log.Info("stopping on request", zap.String("signal", sig.String()))
				stop()
			}
		}
	}
}

// reload re-reads the config on SIGHUP. A broken file changes nothing:
// every error is logged with file:line:key and the guard runs on. What
// does not touch the running vLLM applies at once (log level, alerts'
// command and webhook, intervals and timeouts of readiness, liveness and
// stuck detection); vLLM's command, environment and profile apply at its
// next start. Listen addresses, the state folder and the GPU view apply
// when the guard itself restarts.
func (g *Guard) reload(path, instance string) {
	said := func(reason string) {
		g.bus.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionReload, Reason: reason})
	}
	cfg, err := config.LoadFor(path, instance)
	if err != nil {
		g.log.Error("config reload failed: the running configuration stays in force; fix the file and send SIGHUP again",
			zap.String("config", path), zap.Error(err))
		said("refused: " + err.Error())
		return
	}
	if _, err := cfg.VLLMArgs(g.extra); err != nil {
		g.log.Error("config reload failed: vLLM's command line cannot be read; the running configuration stays in force",
			zap.String("config", path), zap.Error(err))
		said("refused: " + err.Error())
		return
	}
	if err := logging.SetLevel(cfg.Log.Level); err != nil {
		g.log.Error("config reload: [log] level not applied", zap.Error(err))
	}
	g.alert.Configure(cfg.Alerts)
	g.gpu.SetThresholds(cfg.GPU.Thresholds)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pending, err := g.pair.Reload(ctx, cfg)
	if err != nil {
		g.log.Error("config reload: the supervisor did not take it", zap.Error(err))
		return
	}
	fields := []zap.Field{zap.String("config", path)}
	if pending {
		g.log.Info("config reloaded; vLLM's command, environment or profile changed: they apply at its next restart (vllm-guard restart applies them now)", fields...)
		said("applied; vLLM's command, environment or profile at its next start")
		return
	}
	g.log.Info("config reloaded and applied", fields...)
	said("applied")
}
