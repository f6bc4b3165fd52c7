package supervisor

import (
	"fmt"
	"strconv"
	"strings"
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
func (m *core) next() {
	if m.stopAsked {
		m.finish(exitcode.OK, "stopped on request")
		return
	}
	m.applyPending()
	m.do(fxAskRung{}) // onRung goes on
}

// onRung: the policy's rung for the next start.
func (m *core) onRung(rung policy.Rung) {
	m.update(func(st *Status) { st.Rung = rung })
	if !m.ports.gpu && !m.ports.health {
		m.launch(rung, nil)
		return
	}
	if m.sub != subWaitGPU && m.sub != subWaitPort { // waiting already: read again, still waiting
		m.enter(subCheckGPU, "checking the GPUs' health and free memory before starting vLLM", nil)
	}
	m.do(fxReadFree{rung, m.now})
}

// onFreeRead: room → launch; none → wait a sample interval and read again.
func (m *core) onFreeRead(r gpuRead) {
	if r.blocked != "" {
		m.gpuBlocked(r.blocked)
		return
	}
	if r.free {
		m.launch(r.rung, r.gpus) // r.gpus: the ECC counts before the run
		return
	}
	reason := "not enough free GPU memory to start: " + r.why
	if m.facts.state != StateWaitingGPU || m.facts.reason != reason {
		m.log().Warn("waiting for GPU memory before starting vLLM", zap.String("why", r.why), zap.String("holders", holdersText(r.holders)))
	}
	m.enter(subWaitGPU, reason, nil)
	m.arm(tFreeMemory, m.cfg.GPU.SampleInterval.Duration)
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
func (m *core) launch(rung policy.Rung, gpuBefore []policy.GPUDevice) {
	if !m.ports.portHolder {
		m.start(rung, gpuBefore, "")
		return
	}
	argv, ep := launch.BuildArgv(m.cfg.VLLM.Command, m.ports.extra, rung, m.cfg.VLLM.Host, m.cfg.VLLM.Port)
	m.pw.rung, m.pw.gpus, m.pw.port = rung, gpuBefore, ep.Port
	if m.sub != subWaitPort { // waiting already: try again, still waiting
		m.enter(subCheckPort, "checking that vLLM's port is free", nil)
	}
	m.do(fxCheckPort{bindHost(argv, m.cfg.VLLM.Host), ep.Port})
}

// onPortRead: the port is free → launch. Held → wait and try again with
// backoff, saying who holds it: at a restart for as long as it takes (a
// brief grab by another process must not stop the service); at the
// guard's first start for port_wait, then a configuration error naming
// the holder (exit 78): two instances configured on one port.
func (m *core) onPortRead(holder string) {
	w := &m.pw
	if holder == "" {
		if !w.since.IsZero() {
			m.log().Info("vLLM's port is free again: starting vLLM", zap.Int("port", w.port), zap.Duration("waited", m.now.Sub(w.since)))
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
	waited, limit := m.now.Sub(w.since), m.cfg.VLLM.PortWait.Duration
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
		m.log().Warn("vLLM's port is held by another process: waiting for it to be free before starting vLLM",
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
func (m *core) start(rung policy.Rung, gpuBefore []policy.GPUDevice, heldBy string) {
	cfg := m.cfg
	argv, ep := launch.BuildArgv(cfg.VLLM.Command, m.ports.extra, rung, cfg.VLLM.Host, cfg.VLLM.Port)
	m.runN++
	m.r = run{rung: rung, gpuBefore: gpuBefore, lastLine: m.now, ioSeen: map[int]uint64{}, oomBefore: -1, heldBy: heldBy}
	m.do(fxPolicyStart{})
	m.r.startedAt = m.now
	m.r.bindHost, m.r.bindPort = bindHost(argv, cfg.VLLM.Host), ep.Port
	m.enter(subStarting, "launching vLLM", func(st *Status) {
		st.Phase, st.LastProbe, st.PID, st.StartedAt, st.ReadySince, st.Rung = "", "", 0, m.r.startedAt, time.Time{}, rung
		st.Starts++
	})
	m.do(fxLaunch{rung: rung, argv: argv, ep: ep, heldBy: heldBy}) // onLaunched goes on
}

// onLaunched: vLLM was launched (its readiness polled from now on), or
// not: the guard could not run its keeper, or the guard's first start
// gave up waiting for its port (l.heldBy: vLLM is not launched; the start
// ends as a configuration error).
func (m *core) onLaunched(l launched) {
	m.r.baseline = l.baseline
	switch {
	case m.r.heldBy != "":
		m.r.gone = true
		m.fail(outcome{exit: exitInfo{Code: -1, StartFailure: fmt.Sprintf("vLLM's port %d is already in use by %s: "+
			"another vLLM (another guard instance's?) or server holds it; give this instance its own port ([vllm] port, or --port in [vllm] command)",
			m.r.bindPort, m.r.heldBy)}, phase: policy.PhaseStarting, lines: l.lines})
	case l.err != nil:
		m.r.gone = true
		m.fail(outcome{exit: exitInfo{Code: -1, GuardFailure: l.err.Error()}, phase: policy.PhaseStarting, lines: l.lines})
	default:
		m.r.pid = l.pid
		m.update(func(st *Status) { st.PID = l.pid })
		m.arm(tPoll, m.cfg.Readiness.PollInterval.Duration)
	}
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

func pidOf(c proc) int { // (the executor's)
	if c == nil {
		return 0
	}
	return c.pid()
}

func (m *core) probeReady() {
	rc := m.cfg.Readiness
	m.probe(probeReady, rc.Probe, rc.ProbeTimeout.Duration)
}

// probe sends one probe, at most one at a time.
func (m *core) probe(kind probeKind, level string, timeout time.Duration) {
	if m.r.probing {
		return
	}
	m.r.probing = true
	m.do(fxProbe{kind, level, timeout})
}

// ioGrew takes the tree's storage I/O (read off the loop) and says
// whether any process did more since the last poll. CPU time is not
// progress (NCCL hangs spin).
func (m *core) ioGrew(now map[int]uint64) bool {
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
func (m *core) onPoll(io map[int]uint64) {
	rc := m.cfg.Readiness
	now := m.now
	if seen := m.pump.lastLine; !seen.Equal(m.r.lastLine) {
		m.r.lastLine = seen
		m.publish(events.Event{Kind: events.KindProgress, Phase: m.pump.phase, PID: m.r.pid})
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
				m.publish(events.Event{Kind: events.KindProgress, Phase: "io", Reason: reason, PID: m.r.pid})
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
func (m *core) noteRefusal(r probeResult) {
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
func (m *core) onProbe(r probeResult) {
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
func (m *core) onReadiness(r probeResult) {
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
			m.publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.step, Status: r.status, Error: r.err}, PID: m.r.pid})
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
func (m *core) onStuckProbe(r probeResult) {
	m.r.stuckProbe = false
	if !r.ok && r.status == 0 && !r.refused {
		m.askPaused(fmt.Sprintf("stuck: a 1-token request did not answer within stuck_timeout %s (%s)", m.cfg.Liveness.StuckTimeout.Duration, r.err))
	}
}

// engineDead: /health said vLLM's engine is dead. vLLM exits by itself
// after its engine dies (its watchdog runs every 5 s), printing why: wait
// for that, for a grace (engine_dead), and kill only if it does not come.
// Already waiting for the server's exit, the wait that ends first stays.
func (m *core) engineDead(status int) {
	if !m.r.engineDeadAt.IsZero() {
		return
	}
	grace := engineDeadGrace(m.cfg)
	m.log().Warn("vLLM's engine is dead (/health answered "+strconv.Itoa(status)+"): waiting for vLLM to exit",
		zap.Duration("grace", grace))
	m.r.engineDeadAt = m.now
	if m.sub == subServerExiting && !m.now.Add(grace).Before(m.r.serverDoneAt.Add(m.cfg.VLLM.StopTimeout.Duration)) {
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
func (m *core) serverExiting() {
	if !m.r.serverDoneAt.IsZero() {
		return
	}
	limit := m.cfg.VLLM.StopTimeout.Duration
	m.log().Warn("vLLM's API server finished: waiting for its process to exit", zap.Duration("at_most", limit))
	m.r.serverDoneAt = m.now
	if m.sub == subEngineDead && !m.now.Add(limit).Before(m.r.engineDeadAt.Add(engineDeadGrace(m.cfg))) {
		return
	}
	m.disarm(tDying)
	m.enter(subServerExiting, "", nil)
	m.arm(tExiting, limit)
}

// onLiveness: the liveness probe's answer while ready.
func (m *core) onLiveness(r probeResult) {
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
		m.publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.step, Status: r.status, Error: r.err}, PID: m.r.pid})
		m.log().Warn("liveness probe failed", zap.String("error", r.err), zap.Int("consecutive", m.r.failures),
			zap.Int("failures_allowed", m.cfg.Liveness.Failures))
		m.judge()
	}
}

func (m *core) becomeReady(r probeResult) {
	m.r.ready = true
	ttr := m.now.Sub(m.r.startedAt)
	m.do(fxReady{ttr}) // the pump stops looking for load phases; the tree re-read; the policy told
	first := !m.everReady
	m.everReady = true
	m.disarm(tPoll)
	m.enter(subReady, "vLLM answered the "+m.cfg.Readiness.Probe+" probe", func(st *Status) {
		st.ReadySince, st.TimeToReady, st.Phase, st.LastProbe, st.Probe = m.now, ttr, "", "", r.probe
	})
	rung := m.facts.rung
	m.publish(events.Event{Kind: events.KindReady, TimeToReady: ttr, First: first, PID: m.r.pid, Rung: &rung})
	m.r.stuckSince, m.r.stuckAsked = time.Time{}, m.now
	m.arm(tLive, m.cfg.Liveness.Interval.Duration)
	m.arm(tCost, m.cfg.GPU.SampleInterval.Duration)
}
