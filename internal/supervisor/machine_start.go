package supervisor

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// Starting a run: room on the GPU, the launch, load progress (output and
// disk I/O), the stall check and readiness.

// next starts the next run once the GPU has room for it: the free-memory
// check vLLM itself makes and fails on. NVML is read off the loop (a GPU in
// trouble can make one read take seconds); onFreeRead goes on. While there
// is no room, the state is waiting_gpu, naming the holders.
func (m *machine) next() {
	if m.stopAsked {
		m.finish(exitcode.OK, "stopped on request")
		return
	}
	m.applyPending()
	rung := m.s.pol.Current()
	m.update(func(st *Status) { st.Rung = rung })
	if m.s.gpu == nil && m.s.health == nil {
		m.launch(rung, nil)
		return
	}
	if m.sub != subWaitGPU && m.sub != subWaitPort { // waiting already: read again, still waiting
		m.enter(subCheckGPU, "checking the GPUs' health and free memory before starting vLLM", nil)
	}
	gpu, health, since := m.s.gpu, m.s.health, m.now
	m.readGPU(func() gpuRead { return readFree(gpu, health, rung, since) })
}

// onFreeRead: room → launch; none → wait a sample interval and read again.
func (m *machine) onFreeRead(r gpuRead) {
	if r.blocked != "" {
		m.gpuBlocked(r.blocked)
		return
	}
	if r.free {
		m.launch(r.rung, r.gpus) // r.gpus: the ECC counts before the run
		return
	}
	reason := "not enough free GPU memory to start: " + r.why
	if st := m.s.Status(); st.State != StateWaitingGPU || st.Reason != reason {
		m.s.log.Warn("waiting for GPU memory before starting vLLM", zap.String("why", r.why), zap.String("holders", holdersText(r.holders)))
	}
	m.enter(subWaitGPU, reason, nil)
	m.arm(tFreeMemory, m.s.cfg.GPU.SampleInterval.Duration)
}

// portWait is the check of vLLM's port before a launch, and the wait while
// another process holds it.
type portWait struct {
	rung    policy.Rung
	gpus    []policy.GPUDevice
	port    int
	since   time.Time     // when the port was first found held (zero: not waiting)
	bounded bool          // the wait began at the guard's first start: it ends after port_wait
	delay   time.Duration // the last retry's delay
	holder  string        // who held the port at the last try
}

// The retries while vLLM's port is held: the first after portRetryFirst,
// each one twice as late, at most portRetryMax apart.
const (
	portRetryFirst = 250 * time.Millisecond
	portRetryMax   = 5 * time.Second
)

// launch starts vLLM on rung once its port is free: vLLM's own bind is
// tried first, off the loop (checkPort); onPortRead goes on.
func (m *machine) launch(rung policy.Rung, gpuBefore []policy.GPUDevice) {
	s := m.s
	if s.portHolder == nil {
		m.start(rung, gpuBefore, "")
		return
	}
	argv, ep := launch.BuildArgv(s.cfg.VLLM.Command, s.extra, rung, s.cfg.VLLM.Host, s.cfg.VLLM.Port)
	m.pw.rung, m.pw.gpus, m.pw.port = rung, gpuBefore, ep.Port
	if m.sub != subWaitPort { // waiting already: try again, still waiting
		m.enter(subCheckPort, "checking that vLLM's port is free", nil)
	}
	m.checkPort(bindHost(argv, s.cfg.VLLM.Host), ep.Port)
}

// onPortRead: the port is free → launch. Held → wait and try again with
// backoff, saying who holds it: at a restart for as long as it takes (a
// brief grab by another process must not stop the service); at the
// guard's first start for port_wait, then a configuration error naming
// the holder (exit 78): two instances configured on one port.
func (m *machine) onPortRead(holder string) {
	s, w := m.s, &m.pw
	if holder == "" {
		if !w.since.IsZero() {
			s.log.Info("vLLM's port is free again: starting vLLM", zap.Int("port", w.port), zap.Duration("waited", m.now.Sub(w.since)))
		}
		rung, gpus := w.rung, w.gpus
		*w = portWait{}
		m.start(rung, gpus, "")
		return
	}
	if w.since.IsZero() {
		w.since, w.bounded = m.now, m.runN == 0
	}
	w.delay = min(max(2*w.delay, portRetryFirst), portRetryMax)
	waited, limit := m.now.Sub(w.since), s.cfg.VLLM.PortWait.Duration
	if w.bounded && waited >= limit {
		rung, gpus := w.rung, w.gpus
		if waited > 0 {
			holder += fmt.Sprintf(" (held for %s, port_wait %s)", waited.Round(time.Millisecond), limit)
		}
		*w = portWait{}
		m.start(rung, gpus, holder)
		return
	}
	if holder != w.holder {
		w.holder = holder
		s.log.Warn("vLLM's port is held by another process: waiting for it to be free before starting vLLM",
			zap.Int("port", w.port), zap.String("holder", holder), zap.Bool("first_start", w.bounded))
	}
	delay := w.delay
	until := "as long as it takes (a restart)"
	if w.bounded {
		delay = min(delay, limit-waited)
		until = fmt.Sprintf("at most port_wait %s at the first start, then exit 78", limit)
	}
	next := m.now.Add(delay)
	m.enter(subWaitPort, fmt.Sprintf("vLLM's port %d is held by %s: waiting %s for it to be free, %s; trying again in %s",
		w.port, holder, waited.Round(time.Second), until, delay.Round(time.Millisecond)),
		func(st *Status) { st.NextStartAt = next })
	m.arm(tPortRetry, delay)
}

// start launches vLLM on rung; heldBy names who holds its port when the
// guard's first start gave up waiting for it: then vLLM is not launched
// (it would fail to bind, and meanwhile the holder would answer the
// probes in its name) and the start ends as a configuration error.
func (m *machine) start(rung policy.Rung, gpuBefore []policy.GPUDevice, heldBy string) {
	s := m.s
	cfg := s.cfg
	argv, ep := launch.BuildArgv(cfg.VLLM.Command, s.extra, rung, cfg.VLLM.Host, cfg.VLLM.Port)
	m.runN++
	m.rel.child = nil
	// What vLLM serves is read afresh from this run's own startup line.
	s.tasks.Store(nil)
	out := newOutput(m.sink, max(cfg.Log.ChildLines, 1000), m.now)
	m.r = run{rung: rung, gpuBefore: gpuBefore, out: out, lastLine: m.now, ioSeen: map[int]uint64{},
		stdout: out.writer("stdout"), stderr: out.writer("stderr"), oomBefore: -1, refreshing: new(atomic.Bool)}
	if s.gpu != nil {
		m.r.baseline = s.gpu.UsedBytes()
	}
	s.pol.OnStart(m.now)
	s.savePolicy()
	m.r.startedAt = m.now
	m.r.bindHost, m.r.bindPort = bindHost(argv, cfg.VLLM.Host), ep.Port
	m.enter(subStarting, "launching vLLM", func(st *Status) {
		st.Phase, st.LastProbe, st.PID, st.StartedAt, st.ReadySince, st.Rung = "", "", 0, m.r.startedAt, time.Time{}, rung
		st.Starts++
	})
	if heldBy != "" {
		m.portInUse(rung, argv, ep.Port, heldBy)
		return
	}
	m.readOOM()
	c, err := s.launcher.launch(launchSpec{keeper: s.keeper, argv: argv, env: cfg.VLLM.Env,
		dir: cfg.VLLM.Workdir, grace: cfg.VLLM.StopTimeout.Duration, stdout: m.r.stdout, stderr: m.r.stderr})
	r := rung
	s.publish(events.Event{Kind: events.KindStarting, Rung: &r, Argv: s.MaskedArgv(argv), PID: pidOf(c)})
	if err != nil {
		// The guard could not even run its keeper.
		m.r.child = nil
		m.r.stdout.Close()
		m.r.stderr.Close()
		m.fail(outcome{exit: exitInfo{Code: -1, GuardFailure: err.Error()}, phase: policy.PhaseStarting, lines: m.r.out.ring.snapshot()})
		return
	}
	m.watch(c, rung, ep)
}

// portInUse: the guard's first start gave up waiting for vLLM's port,
// held by heldBy: vLLM is not launched and the start ends as a
// configuration error.
func (m *machine) portInUse(rung policy.Rung, argv []string, port int, heldBy string) {
	s := m.s
	s.publish(events.Event{Kind: events.KindStarting, Rung: &rung, Argv: s.MaskedArgv(argv)})
	m.r.child = nil
	m.r.stdout.Close()
	m.r.stderr.Close()
	m.fail(outcome{exit: exitInfo{Code: -1, StartFailure: fmt.Sprintf("vLLM's port %d is already in use by %s: "+
		"another vLLM (another guard instance's?) or server holds it; give this instance its own port ([vllm] port, or --port in [vllm] command)",
		port, heldBy)}, phase: policy.PhaseStarting, lines: m.r.out.ring.snapshot()})
}

// watch begins watching the launched run c: its tree for the GPU monitor
// and the probes, its channels, the readiness poll.
func (m *machine) watch(c proc, rung policy.Rung, ep launch.Endpoint) {
	s := m.s
	m.r.child = c
	m.refreshTree() // the API server is known (with its start time) from the first moment
	m.r.out.pid.Store(int64(c.pid()))
	m.update(func(st *Status) { st.PID = c.pid() })
	if s.gpu != nil {
		s.gpu.SetBudget(rung)
		s.gpu.SetTree(c.tree)
		s.gpu.SetLoading(true)
	}
	tree := c.tree
	s.tree.Store(&tree)
	m.r.prober = s.newProber(ep, s.model, tree)
	m.r.ctx, m.r.cancel = context.WithCancel(context.Background())
	m.forward(c)
	m.arm(tPoll, s.cfg.Readiness.PollInterval.Duration)
}

// bindHost is the --host vLLM's argv ends with (the last one wins, under any
// spelling vLLM reads as --host), else host.
func bindHost(argv []string, host string) string {
	for i, a := range argv {
		name, val, inline := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "--") {
			continue
		}
		if f, _ := vllmargs.ResolveFlag(name); f != "--host" {
			continue
		}
		if inline {
			host = val
		} else if i+1 < len(argv) {
			host = argv[i+1]
		}
	}
	return host
}

func pidOf(c proc) int {
	if c == nil {
		return 0
	}
	return c.pid()
}

func (m *machine) probeReady() {
	rc := m.s.cfg.Readiness
	m.probe(func(ctx context.Context, p checker) probeResult {
		return p.ready(ctx, rc.Probe, rc.ProbeTimeout.Duration)
	})
}

// ioGrew takes the tree's storage I/O (read off the loop) and says
// whether any process did more since the last poll. CPU time is not
// progress (NCCL hangs spin).
func (m *machine) ioGrew(now map[int]uint64) bool {
	grew := false
	for pid, n := range now {
		if before, ok := m.r.ioSeen[pid]; ok && n > before {
			m.r.ioBytes += n - before
			grew = true
		} else if !ok && n > 0 && len(m.r.ioSeen) > 0 {
			m.r.ioBytes += n
			grew = true
		}
	}
	m.r.ioSeen = now
	return grew
}

func gibText(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// onPoll: while starting, with the tree's disk I/O read off the loop
// (readIO), look for load progress, ask the judge about a stall or the
// start-time cap, and probe readiness.
func (m *machine) onPoll(io map[int]uint64) {
	rc := m.s.cfg.Readiness
	now := m.now
	if seen := m.pump.lastLine; !seen.Equal(m.r.lastLine) {
		m.r.lastLine = seen
		m.s.publish(events.Event{Kind: events.KindProgress, Phase: m.pump.phase, PID: m.r.child.pid()})
	}
	lastLine := m.r.lastLine
	if m.ioGrew(io) {
		m.r.lastIO = now
		// A silent download or load: say it, as progress.
		if quiet := now.Sub(lastLine); quiet >= time.Second {
			reason := fmt.Sprintf("downloading or loading: %s read/written, no log output for %s", gibText(m.r.ioBytes), quiet.Round(time.Second))
			m.update(func(st *Status) { st.Reason = reason })
			if now.Sub(m.r.ioAnnounced) >= 10*time.Second {
				m.r.ioAnnounced = now
				m.s.publish(events.Event{Kind: events.KindProgress, Phase: "io", Reason: reason, PID: m.r.child.pid()})
			}
		}
	}
	if m.judge() {
		return
	}
	m.probeReady()
	m.arm(tPoll, rc.PollInterval.Duration)
}

// noteRefusal notes a readiness probe vLLM refused with a 4xx: its
// server is up and answers, so the request the guard sends does not fit
// this vLLM (a task it does not serve, a name, a key), and the judge ends
// the start after refusedProbeLimit of them. Any other answer starts the
// count again.
func (m *machine) noteRefusal(r probeResult) {
	if !r.refusal() {
		m.r.refusedSince = time.Time{}
		return
	}
	if m.r.refusedSince.IsZero() {
		m.r.refusedSince = m.now
	}
	m.r.refusal, m.r.refusedLast = r, m.now
}

// onProbe: a probe answered; what it answers depends on what asked it.
func (m *machine) onProbe(r probeResult) {
	switch {
	case m.sub == subStarting:
		m.onReadiness(r)
	case m.sub == subAskingPaused:
		m.onPausedAnswer(r)
	case m.r.stuckProbe:
		m.onStuckProbe(r)
	default:
		m.onLiveness(r)
	}
}

// onReadiness: the readiness probe's answer while starting.
func (m *machine) onReadiness(r probeResult) {
	s := m.s
	if !r.ok {
		if r.refused && m.now.Before(m.r.fastUntil) {
			m.arm(tFastRetry, fastRetryEvery)
		}
		m.noteRefusal(r)
		if m.judge() {
			return
		}
		if !r.refused {
			m.update(func(st *Status) {
				st.LastProbe = r.step + ": " + r.err
				if r.explains { // an API key or a name the operator must fix
					st.Reason = r.err
				}
			})
			s.publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.step, Status: r.status, Error: r.err}, PID: m.r.child.pid()})
		}
		return
	}
	if !m.pump.serverUp && !r.own {
		// Something answered on vLLM's port before vLLM started its
		// server, over a connection nobody checked: another process's
		// listener, not this vLLM (issue 32 item 4). Its answers count
		// only after this vLLM's own line. (The guard's prober checks
		// every connection: its answers are own.)
		m.update(func(st *Status) {
			st.LastProbe = r.step + ": answered before vLLM's own server started (another process on the port?); waiting for vLLM's startup line"
		})
		return
	}
	m.becomeReady(r)
}

// onStuckProbe: the answer to the 1-token request the stuck check sends
// when vLLM's metrics are not known.
func (m *machine) onStuckProbe(r probeResult) {
	m.r.stuckProbe = false
	if !r.ok && r.status == 0 && !r.refused {
		m.askPaused(fmt.Sprintf("stuck: a 1-token request did not answer within stuck_timeout %s (%s)", m.s.cfg.Liveness.StuckTimeout.Duration, r.err))
	}
}

// engineDead: /health said vLLM's engine is dead. vLLM exits by itself
// after its engine dies (its watchdog runs every 5 s), printing why: wait
// for that, for a grace (engine_dead), and kill only if it does not come.
// Already waiting for the server's exit, the wait that ends first stays.
func (m *machine) engineDead(status int) {
	if !m.r.engineDeadAt.IsZero() {
		return
	}
	s := m.s
	grace := s.engineDeadGrace()
	s.log.Warn("vLLM's engine is dead (/health answered "+strconv.Itoa(status)+"): waiting for vLLM to exit",
		zap.Duration("grace", grace))
	m.r.engineDeadAt = m.now
	if m.sub == subServerExiting && !m.now.Add(grace).Before(m.r.serverDoneAt.Add(s.cfg.VLLM.StopTimeout.Duration)) {
		return
	}
	m.disarm(tExiting)
	m.enter(subEngineDead, "", nil)
	m.arm(tDying, grace)
}

// serverExiting: the API server finished (uvicorn's last line): its port
// is closed because it is exiting, not hung. Python's teardown can take
// seconds on a loaded host; the exit is waited for, up to stop_timeout
// (server_exiting), and then classified from what it printed. Already
// waiting for a dead engine's exit, the wait that ends first stays.
func (m *machine) serverExiting() {
	if !m.r.serverDoneAt.IsZero() {
		return
	}
	s := m.s
	limit := s.cfg.VLLM.StopTimeout.Duration
	s.log.Warn("vLLM's API server finished: waiting for its process to exit", zap.Duration("at_most", limit))
	m.r.serverDoneAt = m.now
	if m.sub == subEngineDead && !m.now.Add(limit).Before(m.r.engineDeadAt.Add(s.engineDeadGrace())) {
		return
	}
	m.disarm(tDying)
	m.enter(subServerExiting, "", nil)
	m.arm(tExiting, limit)
}

// onLiveness: the liveness probe's answer while ready.
func (m *machine) onLiveness(r probeResult) {
	s := m.s
	switch {
	case r.ok:
		m.r.failures = 0
	case r.status == 503 || r.status == 500:
		m.engineDead(r.status)
	case m.pump.serverDone:
		m.serverExiting()
	default:
		m.r.failures++
		m.r.lastErr = r.err
		s.publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.step, Status: r.status, Error: r.err}, PID: m.r.child.pid()})
		s.log.Warn("liveness probe failed", zap.String("error", r.err), zap.Int("consecutive", m.r.failures),
			zap.Int("failures_allowed", s.cfg.Liveness.Failures))
		m.judge()
	}
}

func (m *machine) becomeReady(r probeResult) {
	s := m.s
	m.r.ready = true
	m.r.out.loaded.Store(true)
	m.r.child.refresh()
	ttr := m.now.Sub(m.r.startedAt)
	s.pol.OnReady(m.now)
	s.pol.NoteTimeToReady(ttr)
	s.savePolicy()
	first := !m.everReady
	m.everReady = true
	m.disarm(tPoll)
	m.enter(subReady, "vLLM answered the "+s.cfg.Readiness.Probe+" probe", func(st *Status) {
		st.ReadySince, st.TimeToReady, st.Phase, st.LastProbe, st.Probe = m.now, ttr, "", "", r.probe
		st.LongestTimeToReady = s.pol.LongestTimeToReady()
	})
	rung := s.pol.Current()
	s.publish(events.Event{Kind: events.KindReady, TimeToReady: ttr, First: first, PID: m.r.child.pid(), Rung: &rung})
	if s.gpu != nil {
		s.gpu.SetLoading(false)
	}
	m.r.stuckSince, m.r.stuckAsked = time.Time{}, m.now
	m.arm(tLive, s.cfg.Liveness.Interval.Duration)
	m.arm(tCost, s.cfg.GPU.SampleInterval.Duration)
}
