package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/vllm-guard/vllm-guard/exitcode"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/admission"
	"github.com/vllm-guard/vllm-guard/alerts"
	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/control"
	"github.com/vllm-guard/vllm-guard/events"
	"github.com/vllm-guard/vllm-guard/gpumon"
	"github.com/vllm-guard/vllm-guard/incident"
	"github.com/vllm-guard/vllm-guard/internal/ownconns"
	"github.com/vllm-guard/vllm-guard/logging"
	"github.com/vllm-guard/vllm-guard/metrics"
	"github.com/vllm-guard/vllm-guard/notify"
	"github.com/vllm-guard/vllm-guard/policy"
	"github.com/vllm-guard/vllm-guard/proxy"
	"github.com/vllm-guard/vllm-guard/state"
	"github.com/vllm-guard/vllm-guard/supervisor"
	"github.com/vllm-guard/vllm-guard/vllmstats"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("run", "run [--config FILE | --instance NAME] [--init] [--events FILE] [-- EXTRA_VLLM_ARGS...]", stderr)
	cf := addConfigFlags(fs, "")
	initMode := fs.Bool("init", false, "act as an init: become a child subreaper and reap every orphan (automatic as PID 1)")
	eventsPath := fs.String("events", "", "also write every event (state changes, starts, ready, exits with cause, decisions, alerts) as JSON lines to this file")
	if code, ok := parse(fs, args, stdout); !ok {
		return code
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
		if err := supervisor.BecomeSubreaper(ctx); err != nil {
			log.Warn("could not become a child subreaper: orphans will not be reaped by the guard", zap.Error(err))
		}
	}

	g, err := newGuard(cfg, fs.Args(), log)
	if err == nil && *eventsPath != "" {
		err = g.writeEvents(*eventsPath)
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
	go g.handleSignals(sigs, done, stop, path, instance)
	code := g.run(ctx)
	log.Info("vllm-guard exiting", zap.Int("exit_code", code))
	return code
}

// guard wires the supervisor to everything around it: the state store, the
// GPU monitor, and the consumers of the event stream (log, metrics,
// systemd, alerts, incidents, the proxy).
type guard struct {
	cfg   *config.Config
	log   *zap.Logger
	store *state.Store
	gpu   *gpumon.Monitor
	pol   *policy.Policy
	sup   *supervisor.Supervisor
	met   *metrics.Metrics
	sd    *notify.Notifier
	alert *alerts.Dispatcher
	stats *vllmstats.Scraper
	proxy *proxy.Proxy    // nil unless [proxy] listen is set
	gate  *admission.Gate // what the proxy asks, kept ready; its memory-aware limit
	extra []string
	bus   *events.Bus
	inc   *incident.Recorder
	jsonl *events.JSONLines // --events, nil when not asked for
}

func newGuard(cfg *config.Config, extra []string, log *zap.Logger) (*guard, error) {
	// vLLM's effective command line, read once: names, keys, KV bytes.
	args, err := cfg.VLLMArgs(extra)
	if err != nil {
		return nil, err
	}
	conns := ownconns.New() // the guard's own connections to vLLM: their access lines are dropped
	g := &guard{cfg: cfg, log: log, met: metrics.New(), sd: notify.New(log.Named("systemd")),
		alert: alerts.New(cfg.Alerts, log.Named("alerts")), bus: events.NewBus(),
		stats: vllmstats.NewScraper(cfg.GPU.SampleInterval.Duration, log.Named("vllm-metrics")), extra: extra}
	g.stats.Dial(conns.Dial(&net.Dialer{Timeout: 5 * time.Second}))
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
	g.pol.SetKVCacheBytes(args.KVCacheMemoryBytes)

	cuda, _ := childEnvValue(cfg, "CUDA_VISIBLE_DEVICES")
	g.gpu = gpumon.Open(gpumon.Options{
		Devices:            cfg.GPU.Devices,
		CUDAVisibleDevices: cuda,
		SampleInterval:     cfg.GPU.SampleInterval.Duration,
		Thresholds:         cfg.GPU.Thresholds,
		PredictHorizon:     cfg.GPU.PredictHorizon.Duration,
	}, log.Named("gpu"))

	g.inc = incident.New(store, g.gpu.Snapshot, cfg.Log.ChildLines, cfg.GPU.SampleInterval.Duration, log.Named("incidents"))
	// The event stream's consumers, in order: the log, then what acts on it.
	g.bus.Handle(events.Log(log))
	g.bus.Handle(g.onEvent)
	g.bus.Handle(g.inc.Handle)
	g.alert.Publish(g.bus.Publish)
	g.inc.Publish(g.bus.Publish)
	sup, err := supervisor.New(cfg, supervisor.Options{
		Log:       log,
		Policy:    g.pol,
		GPU:       supervisor.MonitorGPU(g.gpu),
		Events:    g.bus,
		Persist:   g.savePolicy,
		ExtraArgs: extra,
		Load:      g.vllmLoad,
		Progress:  g.vllmProgress,
		Args:      args,
		Conns:     conns,
	})
	if err != nil {
		return nil, err
	}
	g.sup = sup
	g.gate = admission.New(cfg, extra, admission.Sources{Status: sup.Status, GPU: g.gpu.Snapshot,
		VLLM: g.stats.Latest, Publish: g.bus.Publish, Log: log})
	g.gate.Refresh(sup.Status())
	if cfg.Proxy.Listen != "" {
		g.gate.EnableMemory(store, pst.CostSamples)
		g.proxy = proxy.New(cfg.Proxy, g.gate, g.met.Registry(), log.Named("proxy"))
		g.gate.Attach(g.proxy)
	}
	return g, nil
}

func (g *guard) run(ctx context.Context) int {
	// Before the first start, so the free-memory check sees the GPUs; Run
	// reports a failure.
	_ = g.gpu.Open()
	g.met.SetProfile(g.pol.Current())
	var wg sync.WaitGroup
	gctx, cancel := context.WithCancel(context.Background())
	background := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(gctx) }()
	}
	background(g.gpu.Run)
	background(g.alert.Run)
	background(func(ctx context.Context) { g.sd.RunWatchdog(ctx, g.sup.LastTurn) })
	background(g.forwardGPUAlerts)
	background(g.refreshMetrics)
	go func() {
		<-ctx.Done()
		g.sd.Stopping()
	}()

	// The control socket and HTTP endpoints: a socket that cannot be made
	// is a configuration problem an operator must fix (exit 78).
	sock, err := control.ListenSocket(g.cfg.Control.Socket, g, g.log.Named("control"))
	if err != nil {
		g.log.Error("cannot serve the control socket: fix [control] socket", zap.Error(err))
		cancel()
		wg.Wait()
		return exitcode.Config
	}
	defer sock.Close()
	if addr := g.cfg.Control.HTTPListen; addr != "" {
		hs, err := control.ListenHTTP(addr, control.NewHTTPHandler(g, g.met.Handler()), g.log.Named("http"))
		if err != nil {
			g.log.Error("cannot listen for HTTP: fix [control] http_listen", zap.Error(err))
			cancel()
			wg.Wait()
			return exitcode.Config
		}
		defer hs.Close()
	}
	background(g.stats.Run)
	if addr := g.cfg.Proxy.Listen; addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			g.log.Error("cannot listen for the proxy: fix [proxy] listen", zap.Error(err))
			cancel()
			wg.Wait()
			return exitcode.Config
		}
		g.log.Info("admission-control proxy listening", zap.String("listen", ln.Addr().String()))
		// The proxy drains after the supervisor stops (Serve returns when
		// its context ends), so it outlives vLLM only to answer 503s.
		background(func(ctx context.Context) {
			if err := g.proxy.Serve(ctx, ln); err != nil {
				g.log.Warn("proxy stopped", zap.Error(err))
			}
		})
		background(g.gate.Run)
	}

	code := g.sup.Run(ctx)
	g.inc.Close()

	// Deliver what is queued (gave_up above all) before going.
	fctx, fcancel := context.WithTimeout(context.Background(), 15*time.Second)
	if err := g.alert.Flush(fctx); err != nil {
		g.log.Warn("alerts still queued at exit were not delivered", zap.Error(err))
	}
	fcancel()
	cancel()
	wg.Wait()
	g.gpu.Close()
	if g.jsonl != nil {
		g.jsonl.Close()
	}
	return code
}

// handleSignals turns signals into a stop, an escalation or a reload,
// until done.
func (g *guard) handleSignals(sigs <-chan os.Signal, done <-chan struct{}, stop func(), path, instance string) {
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
					g.sup.Kill()
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
func (g *guard) reload(path, instance string) {
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
	pending, err := g.sup.Reload(ctx, cfg)
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

// writeEvents also writes the event stream as JSON lines to path (the test
// tools, the soak, the storm benchmark and the demo read it).
func (g *guard) writeEvents(path string) error {
	f, err := events.OpenFile(path)
	if err != nil {
		return err
	}
	g.jsonl = events.NewJSONLines(f, g.log.Named("events"))
	g.bus.Handle(g.jsonl.Put)
	return nil
}

// onEvent is how the guard's parts hear about vLLM.
func (g *guard) onEvent(e events.Event) {
	switch e.Kind {
	case events.KindStarting:
		g.met.Started()
	case events.KindState:
		logging.SetGuardState(e.State)
		g.onState(g.sup.Status())
	case events.KindProgress:
		g.onProgress(e.Phase)
	case events.KindReady:
		g.onReady(e.First, e.TimeToReady)
	case events.KindExited:
		g.onFailure(*e.Failure)
	case events.KindAlert:
		g.met.SetAlert(e.Alert.Name, e.Alert.Active)
		g.gate.SetPressure(g.alert.InForce())
		if g.proxy != nil {
			g.proxy.Notify()
		}
	}
}

func (g *guard) onState(st supervisor.Status) {
	g.gate.Refresh(st)
	if g.proxy != nil {
		g.proxy.Notify()
	}
	if st.State == supervisor.StateReady {
		g.stats.SetTarget(g.gate.URL())
	} else {
		g.stats.SetTarget("")
	}
	g.met.SetState(st.State)
	g.met.SetProfile(st.Rung)
	g.sd.Status(notify.StatusLine(st, g.gpu.Snapshot()))
	// Starting again after a failure: systemd's start timeout must not
	// run out while the guard backs off before the first ready.
	if st.State == supervisor.StateBackoff || st.State == supervisor.StateWaitingGPU {
		g.onProgress("")
	}
}

// onProgress keeps systemd's start timeout ahead of the guard's own stall
// detection while vLLM loads.
func (g *guard) onProgress(string) {
	g.sd.Extend(g.cfg.Readiness.StallTimeout.Duration + time.Minute)
}

func (g *guard) onReady(first bool, ttr time.Duration) {
	g.sd.Ready()
	g.met.Ready(ttr)
	g.alert.Clear(alerts.OOM)
}

func (g *guard) onFailure(f supervisor.Failure) {
	g.met.Exited(f.Verdict.Cause)
	if f.Verdict.Cause == policy.CauseOOM {
		g.gate.OnOOM()
	}
	for _, e := range alerts.FromFailure(f) {
		g.alert.Send(e)
	}
}

// forwardGPUAlerts sends the monitor's memory alerts to the dispatcher and
// the metrics.
func (g *guard) forwardGPUAlerts(ctx context.Context) {
	ch, unsubscribe := g.gpu.Subscribe()
	defer unsubscribe()
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-ch:
			g.alert.Send(alerts.FromGPU(a, g.sup.Status().Rung))
		}
	}
}

// refreshMetrics copies the GPU monitor's view into the metrics each sample.
func (g *guard) refreshMetrics(ctx context.Context) {
	t := time.NewTicker(g.cfg.GPU.SampleInterval.Duration)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.met.SetGPU(g.gpu.Snapshot())
			v := g.stats.Latest()
			g.met.SetVLLM(v.Running, v.Waiting, v.KVUsage, v.Up)
		}
	}
}

func (g *guard) savePolicy(st policy.State) {
	if err := g.store.Save(st); err != nil {
		g.log.Warn("could not save the guard's state: a restarted guard will start on rung 0", zap.Error(err))
	}
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

// vllmProgress is vLLM's running requests and token counters from its
// last scrape, for stuck detection.
func (g *guard) vllmProgress() (running, tokens float64, ok bool) {
	v := g.stats.Latest()
	return v.Running, v.PromptTokens + v.GenerationTokens, v.Up && v.TokensKnown
}

// vllmLoad is vLLM's running and waiting requests from its last scrape.
func (g *guard) vllmLoad() (running, waiting float64, ok bool) {
	v := g.stats.Latest()
	return v.Running, v.Waiting, v.Up
}
