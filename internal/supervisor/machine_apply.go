package supervisor

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
)

// The executor's side of the effects: each one into calls, an answer
// (when it has one) into an event.

// apply does one effect; ok when it is answered by the event.
func (m *machine) apply(f effect) (answer event, ok bool) {
	switch f := f.(type) {
	case fxLaunch:
		return m.launch(f), true
	case fxKillHolders:
		return event{Kind: evKilledHolders, Killed: m.killHolders(f.Held)}, true
	case fxClassify, fxDecide, fxRestore, fxAskRestore, fxAskRung:
		return m.askPolicy(f), true
	case fxObserveCost, fxApplyConfig, fxReload, fxResetProfile, fxSavePolicy, fxPolicyStart, fxReady:
		m.tellPolicy(f)
		if _, ok := f.(fxReady); ok && m.s.group != nil {
			m.s.group.Ready()
		}
	case fxGroupGone:
		if m.s.group != nil {
			m.s.group.Gone("")
		}
	default:
		m.applyWorld(f)
	}
	return event{}, false
}

// applyWorld does an effect on the status, the bus, the log, the timers
// or the run.
func (m *machine) applyWorld(f effect) {
	s := m.s
	switch f := f.(type) {
	case fxEnter:
		s.entered(f)
	case fxStatus:
		s.update(f.At, f.Set)
	case fxPublish:
		s.publish(f.E)
	case fxLog:
		s.log.Log(f.Level, f.Msg, f.Fields...)
	case fxArm:
		m.arm(f.K, f.D)
	case fxDisarm:
		m.disarm(f.K)
	case fxReadFree:
		gpu, health := s.gpu, s.health
		m.readGPU(func() gpuRead { return readFree(gpu, health, f.Rung, f.Since) })
	case fxReadRelease:
		gpu := s.gpu
		m.readGPU(func() gpuRead {
			released, held := gpu.Released(f.PIDs, f.Base)
			return gpuRead{Released: released, Held: held}
		})
	case fxCheckPort:
		m.checkPort(f.Host, f.Port)
	case fxStop:
		m.withTree(proc.Stop)
	case fxKill:
		m.withTree(proc.Kill)
	case fxProbe:
		m.probe(f)
	case fxEndProbing:
		if m.res.cancel != nil {
			m.res.cancel()
		}
	case fxFinishRun:
		m.res.prober.Close()
		m.cleanUp(f.CheckPort)
	case fxRefresh:
		m.refreshTree()
	case fxReadIO:
		m.readIO()
	case fxReply:
		f.Ch <- f.Err
	}
}

// askPolicy asks the classifier or the restart policy, at the event's
// time, and answers.
func (m *machine) askPolicy(f effect) event {
	s, now := m.s, m.at
	switch f := f.(type) {
	case fxClassify:
		exit := f.Exit
		exit.Critical = s.criticalFraction()
		if s.gpu != nil {
			exit.MemFractions = s.gpu.RecentFractions(10)
		}
		return event{Kind: evClassified, Exit: exit, Verdict: cause.Classify(exit)}
	case fxDecide:
		var d policy.Decision
		s.withPolicy(func(p *policy.Policy) { d = p.OnFailure(now, f.V) })
		s.savePolicy()
		m.describeCost()
		return event{Kind: evDecided, Decision: d}
	case fxRestore:
		s.withPolicy(func(p *policy.Policy) { p.OnRestore(now) })
		s.savePolicy()
		return event{Kind: evRestored, Rung: s.rung()}
	case fxAskRestore:
		var r policy.Rung
		var due bool
		if s.mayRestore == nil || s.mayRestore() {
			s.withPolicy(func(p *policy.Policy) { r, due = p.RestoreDue(now, f.Peak, f.Idle) })
		}
		return event{Kind: evRestoreDue, Rung: r, Due: due}
	default: // fxAskRung
		return event{Kind: evRung, Rung: s.rung()}
	}
}

// tellPolicy tells the restart policy (and what reads its configuration)
// what happened.
func (m *machine) tellPolicy(f effect) {
	s, now := m.s, m.at
	switch f := f.(type) {
	case fxObserveCost:
		s.withPolicy(func(p *policy.Policy) { p.ObserveCost(f.Running, f.Used, f.Total) })
		if f.Describe {
			m.describeCost()
		}
	case fxApplyConfig:
		m.applyConfig(f.Cfg)
	case fxReload:
		s.cfg = f.Cfg
		s.pendingReload.Store(f.Pending)
	case fxResetProfile:
		s.withPolicy(func(p *policy.Policy) { p.ResetProfile() })
		s.savePolicy()
		rung := s.rung()
		s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionProfileReset, Rung: &rung,
			Reason: "operator " + f.Peer + " reset the profile: rung 0 at the next start"})
	case fxSavePolicy:
		s.savePolicy()
	case fxPolicyStart:
		s.withPolicy(func(p *policy.Policy) { p.OnStart(now) })
		s.savePolicy()
	case fxReady:
		m.ready(f.TTR)
		m.recordStart(f)
	}
}

// ready: vLLM answered its readiness probe: the pump stops looking for
// load phases, the tree is re-read, the policy and the GPU monitor told.
func (m *machine) ready(ttr time.Duration) {
	s := m.s
	m.res.out.loaded.Store(true)
	m.refreshTree()
	var longest time.Duration
	s.withPolicy(func(p *policy.Policy) {
		p.OnReady(m.at)
		p.NoteTimeToReady(ttr)
		longest = p.LongestTimeToReady()
	})
	s.savePolicy()
	s.update(m.at, func(st *Status) { st.LongestTimeToReady = longest })
	if s.gpu != nil {
		s.gpu.SetLoading(false)
	}
}

// describeCost puts the cost model's one-line summary in the status.
func (m *machine) describeCost() {
	s := m.s
	var d string
	s.withPolicy(func(p *policy.Policy) {
		d = p.Cost().Describe(p.Current().GPUMemoryUtilization, s.cfg.Profile.Headroom)
	})
	s.update(m.at, func(st *Status) { st.Cost = d })
}

// applyConfig: vLLM starts now on the reloaded configuration cfg.
func (m *machine) applyConfig(cfg *config.Config) {
	s := m.s
	s.cfg = cfg
	s.pendingReload.Store(false)
	s.withPolicy(func(p *policy.Policy) { p.Reconfigure(cfg.Policy()) })
	if args, err := cfg.VLLMArgs(s.extra); err == nil {
		s.args = args
		s.withPolicy(func(p *policy.Policy) { p.SetKVCacheBytes(args.KVCacheMemoryBytes) })
	} else {
		s.withPolicy(func(p *policy.Policy) { p.SetKVCacheBytes(s.args.KVCacheMemoryBytes) })
		s.log.Warn("the reloaded vLLM command line cannot be read; probes keep the old names and keys", zap.Error(err))
	}
	if names := cfg.ServedModelNames(s.args); len(names) > 0 {
		s.model = names[0]
	}
	s.log.Info("vLLM starts on the reloaded configuration")
}

// killHolders kills the holders that are still the very processes of the
// old tree (never a reused PID), and says whether it killed any.
func (m *machine) killHolders(held []Holder) bool {
	killed := false
	for _, h := range held {
		if m.relChild != nil && m.killIfOurs(h.PID) {
			m.s.log.Warn("killed a survivor of the old vLLM that still held GPU memory",
				zap.Int("pid", h.PID), zap.String("command", h.Command), zap.Uint64("bytes", h.Bytes))
			killed = true
		}
	}
	return killed
}

// launch starts vLLM as f says (or, the port held at the guard's first
// start, only says so), and watches it: its tree for the GPU monitor and
// the probes, its channels. Answered by evLaunched.
func (m *machine) launch(f fxLaunch) event {
	s, cfg, rung := m.s, m.s.cfg, f.Rung
	m.relChild = nil
	s.tasks.Store(nil) // what vLLM serves is read afresh from this run's own startup line
	out := newOutput(m.sink, max(cfg.Log.ChildLines, 1000), m.at)
	m.res = runRes{out: out, stdout: out.writer("stdout"), stderr: out.writer("stderr"), treeMu: new(sync.Mutex),
		startedAt: m.at, bindHost: bindHost(f.Argv, cfg.VLLM.Host), bindPort: f.Ep.Port}
	var l launched
	if s.gpu != nil {
		l.Baseline = s.gpu.UsedBytes()
	}
	var c proc
	var err error
	if f.HeldBy == "" {
		m.readOOM()
		c, err = s.launcher.Launch(launchSpec{Keeper: s.keeper, Argv: f.Argv, Env: cfg.VLLM.Env,
			Dir: cfg.VLLM.Workdir, Grace: cfg.VLLM.StopTimeout.Duration, Stdout: m.res.stdout, Stderr: m.res.stderr})
	}
	s.publish(events.Event{Kind: events.KindStarting, Rung: &rung, Argv: s.MaskedArgv(f.Argv), PID: pidOf(c)})
	if c == nil {
		m.res.stdout.Close()
		m.res.stderr.Close()
		l.Err, l.Lines = err, out.ring.snapshot()
		return event{Kind: evLaunched, Launched: l}
	}
	m.watch(c, rung, f)
	m.expectStart(rung)
	l.PID = c.PID()
	if s.group != nil {
		s.group.Launched(rung)
	}
	return event{Kind: evLaunched, Launched: l}
}

// watch begins watching the launched run c.
func (m *machine) watch(c proc, rung policy.Rung, f fxLaunch) {
	s := m.s
	m.res.child = c
	m.refreshTree() // the API server is known (with its start time) from the first moment
	m.res.out.pid.Store(int64(c.PID()))
	if s.gpu != nil {
		s.gpu.SetBudget(rung)
		s.gpu.SetTree(c.Tree)
		s.gpu.SetLoading(true)
	}
	tree := c.Tree
	s.tree.Store(&tree)
	m.res.prober = s.newProber(f.Ep, s.model, tree)
	m.res.ctx, m.res.cancel = context.WithCancel(context.Background())
	m.forward(c)
}

// withTree calls f on the run's tree once no re-read of it is on its way:
// the tree's record of every process seen is written by the re-read and
// read by the signals (proctree: one at a time).
func (m *machine) withTree(f func(proc)) {
	m.res.treeMu.Lock()
	defer m.res.treeMu.Unlock()
	f(m.res.child)
}

// killIfOurs kills pid if it is still a process of the run that ended
// (its record is no longer written: no re-read after its cleanup).
func (m *machine) killIfOurs(pid int) bool { return m.relChild.KillIfOurs(pid) }

// entered: the machine entered a sub-state; a vLLM still ready in its
// status whose engine died or whose API server finished is Dying.
func (s *Supervisor) entered(f fxEnter) {
	if s.traceSub != nil {
		s.traceSub(f.From, f.To)
	}
	dying := f.To == heart.SubEngineDead || f.To == heart.SubServerExiting
	s.dying.Store(dying)
	if dying && s.onDying != nil {
		s.onDying()
	}
	if (f.To == heart.SubGaveUp || f.To == heart.SubFailed) && s.group != nil {
		s.group.GaveUp()
	}
}
