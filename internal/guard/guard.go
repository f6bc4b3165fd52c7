// Package guard is `vllm-guard run` once its flags are read: it wires the
// supervisor to everything around it (the state store, the GPU monitor,
// the event stream's consumers: log, metrics, systemd, alerts, incidents,
// the proxy and its admission) and serves the control socket and HTTP.
// It owns what a signal to the guard means and what a reload applies.
package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/gate"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/incident"
	"github.com/vllm-guard/vllm-guard/internal/logging"
	"github.com/vllm-guard/vllm-guard/internal/metrics"
	"github.com/vllm-guard/vllm-guard/internal/notify"
	"github.com/vllm-guard/vllm-guard/internal/ownconns"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/proxy"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/supervisor"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

// Guard wires the supervisor to everything around it: the state store, the
// GPU monitor, and the consumers of the event stream (log, metrics,
// systemd, alerts, incidents, the proxy).
type Guard struct {
	cfg   *config.Config
	log   *zap.Logger
	store *state.Store
	gpu   *gpumon.Monitor
	pol   *policy.Policy
	pair  *pair // vLLM a's supervisor, and with [standby] b's: which one serves
	met   *metrics.Metrics
	sd    *notify.Notifier
	alert *alerts.Dispatcher
	stats *vllmstats.Scraper
	proxy *proxy.Proxy // nil unless [proxy] listen is set
	gate  *gate.Gate   // what the proxy asks, kept ready; its memory-aware limit
	extra []string
	bus   *events.Bus
	inc   *incident.Recorder
	jsonl *events.JSONLines // --events, nil when not asked for
	saved savedState        // whether the state reaches state_dir
	wc    *weightCache      // the weight cache daemon (weights.go); nil: none

	// starts is the record of this host's starts of vLLM (starts.go),
	// one for every supervisor of the guard.
	starts *starttimes.Book
	sbMet  *standbyMetrics // the standby's series; nil without one
	// standbyDied: the exit being recorded is a standby's (proxyDied).
	standbyDied atomic.Bool
	// member is this guard's place in a [group]; nil without (group.go).
	member *groupMember
}

// savedState is whether the guard's state reaches state_dir, for status,
// metrics and the state_not_saved alert.
type savedState struct {
	mu    sync.Mutex
	doc   control.SavedState
	alert bool // state_not_saved raised
}

// New wires a guard for cfg; extra are the arguments after "--" for vLLM.
// An error that is the operator's to fix in the config is a *config.Error.
func New(cfg *config.Config, extra []string, log *zap.Logger) (*Guard, error) {
	// vLLM's effective command line, read once: names, keys, KV bytes.
	args, err := cfg.VLLMArgs(extra)
	if err != nil {
		return nil, err
	}
	wc, extra, args, err := newWeightCache(cfg, extra, args, log)
	if err != nil {
		return nil, err
	}
	conns := ownconns.New() // the guard's own connections to vLLM: their access lines are dropped
	g := &Guard{cfg: cfg, log: log, sd: notify.New(log.Named("systemd")),
		alert: alerts.New(cfg.Alerts, log.Named("alerts")), bus: events.NewBus(),
		stats: vllmstats.NewScraper(cfg.GPU.SampleInterval.Duration, log.Named("vllm-metrics")), extra: extra, wc: wc}
	if len(args.APIKeys) > 0 {
		g.stats.SetAPIKey(args.APIKeys[0])
	}
	if err := cfg.CheckStateDir(); err != nil {
		return nil, err // a symlink or another user's folder: never followed, never tightened
	}
	store, warnings, err := state.Open(cfg.Control.StateDir, log.Named("state"))
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	g.store = store
	g.starts = startTimes(store, log)
	var pst policy.State
	if found, warning := store.Load(&pst); warning != "" {
		log.Warn(warning)
	} else if found {
		log.Info("resuming from the saved state", zap.String("path", store.StatePath()), zap.Int("rung", pst.Rung))
	}
	g.saved.doc = control.SavedState{OK: true, Dir: store.Dir(), SavedRung: pst.Rung}
	g.pol = policy.New(cfg.Policy(), pst, realClock{})
	g.pol.SetKVCacheBytes(args.KVCacheMemoryBytes)

	cuda, _ := childEnvValue(cfg, "CUDA_VISIBLE_DEVICES")
	g.gpu = gpumon.Open(gpumon.Options{
		Devices:            cfg.GPU.Devices,
		CUDAVisibleDevices: cuda,
		SampleInterval:     cfg.GPU.SampleInterval.Duration,
		Thresholds:         cfg.GPU.Thresholds,
		PredictHorizon:     cfg.GPU.PredictHorizon.Duration,
	}, log.Named("gpu"))
	// The GPU and vLLM series are read from the samplers at scrape time.
	g.met = metrics.New(metrics.Sources{GPU: g.gpu, VLLM: g.stats})
	if err := g.unsaved(); err != nil {
		// Said in status and metrics now; the alert goes out from Run.
		g.saved.doc.OK, g.saved.doc.Error, g.saved.doc.Since = false, err.Error(), time.Now()
		g.met.SetStateSaved(false)
	}

	g.inc = incident.New(store, g.gpu.Snapshot, cfg.Log.ChildLines, cfg.GPU.SampleInterval.Duration, log.Named("incidents"))
	// The event stream's consumers, in order: the log, then what acts on it.
	g.bus.Handle(events.Log(log))
	g.bus.Handle(g.onEvent)
	g.bus.Handle(g.inc.Handle)
	g.alert.Publish(g.bus.Publish)
	g.inc.Publish(g.bus.Publish)
	var awaiting func() (int, float64)
	var inFlight func() int
	if cfg.Proxy.Listen != "" {
		// The proxy is made below, before the supervisor runs.
		awaiting = func() (int, float64) { return g.proxy.Awaiting() }
		inFlight = func() int { return g.proxy.Stats().Inflight }
	}
	supExtra, err := groupArgs(cfg, extra)
	if err != nil {
		return nil, err
	}
	var grp supervisor.Group
	if cfg.Group.Enabled {
		g.member = &groupMember{cfg: cfg.Group, log: log.Named("group")}
		grp = g.member
		if args, err = cfg.VLLMArgs(supExtra); err != nil {
			return nil, err
		}
	}
	p, err := newPair(cfg, pairOptions{
		opts: supervisor.Options{
			Log:       log,
			Policy:    g.pol,
			GPU:       supervisor.MonitorGPU(g.gpu),
			Health:    supervisor.MonitorGPUHealth(g.gpu),
			ExtraArgs: supExtra,
			Args:      args,
			Conns:     conns,
			Group:     grp,

			BeforeLaunch: wc.beforeLaunch(),
			// The time to ready expected of each start (starts.go).
			StartTimes: g.starts,
			SaveStarts: store.SaveStarts,
		},
		persist: g.savePolicy, load: g.vllmLoad, progress: g.vllmProgress, awaiting: awaiting, inFlight: inFlight,
	}, g.bus.Publish, log)
	if err != nil {
		return nil, err
	}
	g.pair = p
	if g.member != nil {
		g.member.sup = p.m[0].sup // a group has no standby (config)
	}
	g.standbyMetrics()
	wc.wire(g)
	g.registerLoadSeries()
	// The scraper reaches vLLM only, like the probes: its key goes to no
	// other listener on the port.
	g.stats.Dial(p.DialVLLM(&net.Dialer{Timeout: 5 * time.Second}))
	g.gate = gate.New(cfg, extra, gate.Sources{Status: func() status.Status { st, _ := p.gateView(); return st }, GPU: g.gpu.Snapshot,
		Sampled: g.gpu.Sampled, VLLM: g.stats.Latest, Publish: g.bus.Publish, Log: log})
	g.gate.RefreshOn(p.gateView())
	p.onLost = func() {
		g.gate.RefreshOn(g.pair.gateView())
		if g.proxy != nil {
			g.proxy.Notify()
		}
	}
	if cfg.Proxy.Listen != "" {
		g.gate.EnableMemory(store, pst.CostSamples)
		g.proxy = proxy.New(cfg.Proxy, g.gate, g.met.Registry(), log.Named("proxy"))
		// Clients' keys and prompts reach vLLM's own listener only (the
		// serving one's, by the port the gate names).
		g.proxy.DialThrough(p.DialVLLM)
		g.gate.Attach(g.proxy)
		// A request refused another send after resume_limit deaths is
		// named in the record of the death.
		if p.standby {
			g.proxy.SetOnContinued(g.continued)
		}
		g.proxy.SetOnSuspect(func(s proxy.Suspect) { g.inc.NoteSuspect(state.SuspectRequest(s)) })
		g.inc.SetHeld(func() state.HeldRequests {
			st := g.proxy.Stats()
			return state.HeldRequests{Requests: st.Held, PausedStreams: st.Paused}
		})
		// What became of the requests each death touched comes into its
		// record once they have all finished.
		g.inc.SetDeaths(g.proxyDied)
		g.proxy.SetOnDeathRequests(g.inc.NoteRequests)
	}
	return g, nil
}

// Run supervises vLLM until ctx ends or the supervisor gives up, and
// returns the exit code.
func (g *Guard) Run(ctx context.Context) int {
	// Before the first start, so the free-memory check sees the GPUs; Run
	// reports a failure.
	_ = g.gpu.Open()
	g.met.SetProfile(g.pair.current())
	if sv := g.savedDoc(); !sv.OK {
		g.notSaved(errors.New(sv.Error), g.pair.current().Index)
	}
	var wg sync.WaitGroup
	gctx, cancel := context.WithCancel(context.Background())
	background := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(gctx) }()
	}
	background(g.gpu.Run)
	background(g.alert.Run)
	background(func(ctx context.Context) { g.sd.RunWatchdog(ctx, g.pair.LastTurn) })
	background(g.forwardGPUAlerts)
	go func() {
		<-ctx.Done()
		g.sd.Stopping()
		if g.proxy != nil {
			// Nothing new is served from here: refused at once, not
			// held until vLLM has stopped.
			g.proxy.Stopping()
		}
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

	stopGroup := func() {}
	if g.member != nil {
		stop, code := g.startGroup(gctx, background)
		if stop == nil {
			cancel()
			wg.Wait()
			return code
		}
		stopGroup = stop
	}
	code := g.pair.Run(ctx)
	g.wc.stop() // after vLLM: its weights outlive every run
	if g.proxy != nil {
		// The deaths' accounts still open go to their records before
		// these close, with the requests still going as pending.
		g.proxy.Stopping()
	}
	g.inc.Close()

	// Deliver what is queued (gave_up above all) before going.
	fctx, fcancel := context.WithTimeout(context.Background(), 15*time.Second)
	if err := g.alert.Flush(fctx); err != nil {
		g.log.Warn("alerts still queued at exit were not delivered", zap.Error(err))
	}
	fcancel()
	cancel()
	wg.Wait()
	stopGroup()
	g.gpu.Close()
	if g.jsonl != nil {
		g.jsonl.Close()
	}
	return code
}

// WriteEvents also writes the event stream as JSON lines to path (the test
// tools, the soak, the storm benchmark and the demo read it).
func (g *Guard) WriteEvents(path string) error {
	f, err := events.OpenFile(path)
	if err != nil {
		return err
	}
	g.jsonl = events.NewJSONLines(f, g.log.Named("events"))
	g.bus.Handle(g.jsonl.Put)
	return nil
}

// onEvent is how the guard's parts hear about vLLM.
func (g *Guard) onEvent(e events.Event) {
	switch e.Kind {
	case events.KindStarting:
		g.met.Started()
	case events.KindState:
		st := g.pair.Status()
		logging.SetGuardState(string(st.State))
		g.onState(st)
	case events.KindFailover:
		g.onFailover(*e.Failover)
		g.onState(g.pair.Status())
	case events.KindProgress:
		g.onProgress(e.Phase)
		g.sd.ProgressStatus(g.statusLine) // the load's step and the time left, at most once a second
	case events.KindReady:
		g.standbyReady()
		if e.Role != events.RoleStandby {
			g.onReady(e.First, e.TimeToReady)
		}
	case events.KindExited:
		// (Before the incident recorder hears it: a standby's death is
		// no death of the proxy's vLLM.)
		g.standbyDied.Store(e.Role == events.RoleStandby)
		g.standbyReady()
		g.pairExited(e.VLLM, e.Role, string(e.Failure.Verdict.Cause))
		g.onFailure(*e.Failure, e.Role == events.RoleStandby, e.VLLM)
	case events.KindIncident:
		if why, ok := strings.CutPrefix(e.Reason, incident.NotWritten); ok {
			g.notSaved(fmt.Errorf("an incident record could not be written (status keeps the last one): %s", why), g.pair.current().Index)
		}
	case events.KindAlert:
		g.met.SetAlert(e.Alert.Name, e.Alert.Active)
		g.gate.SetPressure(g.alert.InForce())
		if g.proxy != nil {
			g.proxy.Notify()
		}
	}
}

// onState: st is the serving vLLM's status (the guard's public state).
func (g *Guard) onState(st status.Status) {
	g.gate.RefreshOn(g.pair.gateView())
	g.standbyReady()
	if g.proxy != nil {
		g.proxy.Notify()
	}
	if st.State == status.StateReady && (g.member == nil || !g.member.Follower()) {
		// A group's follower runs vLLM headless: no HTTP, no /metrics.
		g.stats.SetTarget(g.gate.URL())
	} else {
		g.stats.SetTarget("")
	}
	g.met.SetState(st.State)
	g.met.SetProfile(st.Rung)
	g.sd.Status(g.statusLine())
	// Starting again after a failure: systemd's start timeout must not
	// run out while the guard backs off before the first ready.
	if st.State == status.StateBackoff || st.State == status.StateWaitingGPU {
		g.onProgress("")
	}
}

// onProgress keeps systemd's start timeout ahead of the guard's own stall
// detection while vLLM loads.
func (g *Guard) onProgress(string) {
	g.sd.Extend(g.cfg.Readiness.StallTimeout.Duration + time.Minute)
}

func (g *Guard) onReady(first bool, ttr time.Duration) {
	g.sd.Ready()
	g.met.Ready(ttr)
	g.alert.Clear(alerts.OOM)
	g.alert.Clear(alerts.GPUFault) // a survivable fault: vLLM serves again
}

// onFailure: standby is true for the death of a standby (vLLM name),
// which served no client: the proxy's memory-aware limit does not step
// down for it, and its alerts say it was the standby.
func (g *Guard) onFailure(f status.Failure, standby bool, name string) {
	g.met.Exited(f.Verdict.Cause)
	if f.Verdict.Cause == cause.CauseOOM && !standby {
		g.gate.OnOOM()
	}
	for _, e := range alerts.FromFailure(f) {
		if standby {
			e.Message = "the standby vLLM " + name + " (the serving one is untouched): " + e.Message
			if e.Alert == alerts.GaveUp {
				e.Message += "; the guard serves without a standby"
			}
		}
		g.alert.Send(e)
	}
}

// forwardGPUAlerts sends the monitor's memory alerts to the dispatcher and
// the metrics.
func (g *Guard) forwardGPUAlerts(ctx context.Context) {
	ch, unsubscribe := g.gpu.Subscribe()
	defer unsubscribe()
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-ch:
			g.alert.Send(alerts.FromGPU(a, g.pair.Status().Rung))
		}
	}
}

// unsaved is why nothing the guard saves reaches state_dir (nil: it does).
func (g *Guard) unsaved() error {
	if why := g.store.NotWritable(); why != "" {
		return fmt.Errorf("%s cannot be written: %s", g.store.Dir(), why)
	}
	if !g.store.Persistent() {
		return fmt.Errorf("%s cannot be used: the state is kept in memory only", g.store.Dir())
	}
	return nil
}

func (g *Guard) savePolicy(st policy.State) {
	err := g.store.Save(st)
	if err == nil {
		err = g.unsaved()
	}
	if err != nil {
		g.notSaved(err, st.Rung)
		return
	}
	g.saved.mu.Lock()
	was := g.saved.doc
	g.saved.doc = control.SavedState{OK: true, Dir: g.store.Dir(), SavedRung: st.Rung}
	clear := g.saved.alert
	g.saved.alert = false
	g.saved.mu.Unlock()
	g.met.SetStateSaved(true)
	if clear {
		g.log.Info("the guard's state is saved again", zap.String("dir", was.Dir), zap.Int("rung", st.Rung))
		g.alert.Send(alerts.Event{Alert: alerts.StateNotSaved, Active: false, GPU: -1, SecondsToCritical: -1,
			Message: fmt.Sprintf("the guard's state is saved again in %s (rung %d)", was.Dir, st.Rung)})
	}
}

// notSaved says, in status, metrics and the state_not_saved alert (not only
// the log), that the state in force is not on disk: a restarted guard
// resumes the saved rung, not inForce.
func (g *Guard) notSaved(err error, inForce int) {
	g.saved.mu.Lock()
	d := &g.saved.doc
	if d.OK {
		d.Since = time.Now()
	}
	d.OK, d.Error = false, err.Error()
	saved := d.SavedRung
	raise := !g.saved.alert
	g.saved.alert = true
	g.saved.mu.Unlock()
	msg := fmt.Sprintf("what the guard keeps in state_dir cannot be saved (rung %d in force): %v; a restarted guard resumes rung %d, the one on disk. Free space in or make writable %s",
		inForce, err, saved, g.store.Dir())
	g.log.Warn("could not save the guard's state: a restarted guard resumes the rung on disk", zap.Int("rung_in_force", inForce),
		zap.Int("rung_on_disk", saved), zap.Error(err))
	g.met.SetStateSaved(false)
	if raise {
		g.alert.Send(alerts.Event{Alert: alerts.StateNotSaved, Active: true, GPU: -1, SecondsToCritical: -1, Message: msg})
	}
}

// savedDoc is the status document's saved_state.
func (g *Guard) savedDoc() *control.SavedState {
	g.saved.mu.Lock()
	defer g.saved.mu.Unlock()
	d := g.saved.doc
	return &d
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
func (g *Guard) vllmProgress() (running, tokens float64, ok bool) {
	v := g.stats.Latest()
	return v.Running, v.PromptTokens + v.GenerationTokens, v.Up && v.TokensKnown
}

// vllmLoad is vLLM's running and waiting requests from its last scrape.
func (g *Guard) vllmLoad() (running, waiting float64, ok bool) {
	v := g.stats.Latest()
	return v.Running, v.Waiting, v.Up
}
