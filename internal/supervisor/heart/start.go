package heart

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// Starting a run: room on the GPU, the launch, load progress (output and
// disk I/O), the stall check and readiness.

// Next starts the next run once the GPU has room for it: the free-memory
// check vLLM itself makes and fails on. NVML is read off the loop (a GPU in
// trouble can make one read take seconds); onFreeRead goes on. While there
// is no room, the state is waiting_gpu, naming the holders.
func (m *Core) Next() {
	if m.StopAsked {
		m.Finish(exitcode.OK, "stopped on request")
		return
	}
	m.ApplyPending()
	m.Do(FxAskRung{}) // onRung goes on
}

// OnRung: the policy's rung for the next start.
func (m *Core) OnRung(rung policy.Rung) {
	m.Update(func(st *Status) { st.Rung = rung })
	if !m.Ports.GPU && !m.Ports.Health {
		m.Launch(rung, nil)
		return
	}
	if m.Sub != SubWaitGPU && m.Sub != SubWaitPort { // waiting already: read again, still waiting
		m.Enter(SubCheckGPU, "checking the GPUs' health and free memory before starting vLLM", nil)
	}
	m.Do(FxReadFree{rung, m.Now})
}

// OnFreeRead: room → launch; none → wait a sample interval and read again.
func (m *Core) OnFreeRead(r GPURead) {
	if r.Blocked != "" {
		m.GPUBlocked(r.Blocked)
		return
	}
	if r.Free {
		m.Launch(r.Rung, r.GPUs) // r.gpus: the ECC counts before the run
		return
	}
	reason := "not enough free GPU memory to start: " + r.Why
	if m.Facts.State != StateWaitingGPU || m.Facts.Reason != reason {
		m.Log().Warn("waiting for GPU memory before starting vLLM", zap.String("why", r.Why), zap.String("holders", HoldersText(r.Holders)))
	}
	m.Enter(SubWaitGPU, reason, nil)
	m.Arm(TFreeMemory, m.Cfg.GPU.SampleInterval.Duration)
}

// PortWait is the check of vLLM's port before a launch, and the wait while
// another process holds it.
type PortWait struct {
	Rung    policy.Rung
	GPUs    []cause.GPUDevice
	Port    int
	Since   time.Time     // when the port was first found held (zero: not waiting)
	Bounded bool          // the wait began at the guard's first start: it ends after port_wait
	Delay   time.Duration // the last retry's delay
	Holder  string        // who held the port at the last try
}

// The retries while vLLM's port is held: the first after portRetryFirst,
// each one twice as late, at most portRetryMax apart.
const (
	PortRetryFirst = 250 * time.Millisecond
	PortRetryMax   = 5 * time.Second
)

// Launch starts vLLM on rung once its port is free: vLLM's own bind is
// tried first, off the loop (checkPort); onPortRead goes on.
func (m *Core) Launch(rung policy.Rung, gpuBefore []cause.GPUDevice) {
	if !m.Ports.PortHolder {
		m.Start(rung, gpuBefore, "")
		return
	}
	argv, ep := launch.BuildArgv(m.Cfg.VLLM.Command, m.Ports.Extra, rung, m.Cfg.VLLM.Host, m.Cfg.VLLM.Port)
	m.Pw.Rung, m.Pw.GPUs, m.Pw.Port = rung, gpuBefore, ep.Port
	if m.Sub != SubWaitPort { // waiting already: try again, still waiting
		m.Enter(SubCheckPort, "checking that vLLM's port is free", nil)
	}
	m.Do(FxCheckPort{BindHost(argv, m.Cfg.VLLM.Host), ep.Port})
}

// OnPortRead: the port is free → launch. Held → wait and try again with
// backoff, saying who holds it: at a restart for as long as it takes (a
// brief grab by another process must not stop the service); at the
// guard's first start for port_wait, then a configuration error naming
// the holder (exit 78): two instances configured on one port.
func (m *Core) OnPortRead(holder string) {
	w := &m.Pw
	if holder == "" {
		if !w.Since.IsZero() {
			m.Log().Info("vLLM's port is free again: starting vLLM", zap.Int("port", w.Port), zap.Duration("waited", m.Now.Sub(w.Since)))
		}
		rung, gpus := w.Rung, w.GPUs
		*w = PortWait{}
		m.Start(rung, gpus, "")
		return
	}
	if w.Since.IsZero() {
		w.Since, w.Bounded = m.Now, m.RunN == 0
	}
	w.Delay = min(max(2*w.Delay, PortRetryFirst), PortRetryMax)
	waited, limit := m.Now.Sub(w.Since), m.Cfg.VLLM.PortWait.Duration
	if w.Bounded && waited >= limit {
		rung, gpus := w.Rung, w.GPUs
		if waited > 0 {
			holder += fmt.Sprintf(" (held for %s, port_wait %s)", waited.Round(time.Millisecond), limit)
		}
		*w = PortWait{}
		m.Start(rung, gpus, holder)
		return
	}
	if holder != w.Holder {
		w.Holder = holder
		m.Log().Warn("vLLM's port is held by another process: waiting for it to be free before starting vLLM",
			zap.Int("port", w.Port), zap.String("holder", holder), zap.Bool("first_start", w.Bounded))
	}
	delay := w.Delay
	until := "as long as it takes (a restart)"
	if w.Bounded {
		delay = min(delay, limit-waited)
		until = fmt.Sprintf("at most port_wait %s at the first start, then exit 78", limit)
	}
	next := m.Now.Add(delay)
	m.Enter(SubWaitPort, fmt.Sprintf("vLLM's port %d is held by %s: waiting %s for it to be free, %s; trying again in %s",
		w.Port, holder, waited.Round(time.Second), until, delay.Round(time.Millisecond)),
		func(st *Status) { st.NextStartAt = next })
	m.Arm(TPortRetry, delay)
}

// Start launches vLLM on rung; heldBy names who holds its port when the
// guard's first start gave up waiting for it: then vLLM is not launched
// (it would fail to bind, and meanwhile the holder would answer the
// probes in its name) and the start ends as a configuration error.
func (m *Core) Start(rung policy.Rung, gpuBefore []cause.GPUDevice, heldBy string) {
	rung, wait := m.WaitGroup(rung, gpuBefore, heldBy)
	if wait {
		return
	}
	cfg := m.Cfg
	argv, ep := launch.BuildArgv(cfg.VLLM.Command, m.Ports.Extra, rung, cfg.VLLM.Host, cfg.VLLM.Port)
	m.RunN++
	m.R = Run{Rung: rung, GPUBefore: gpuBefore, LastLine: m.Now, IOSeen: map[int]uint64{}, OOMBefore: -1, HeldBy: heldBy}
	m.Do(FxPolicyStart{})
	m.R.StartedAt = m.Now
	m.R.BindHost, m.R.BindPort = BindHost(argv, cfg.VLLM.Host), ep.Port
	m.Enter(SubStarting, "launching vLLM", func(st *Status) {
		st.Phase, st.LastProbe, st.PID, st.StartedAt, st.ReadySince, st.Rung = "", "", 0, m.R.StartedAt, time.Time{}, rung
		st.Progress, st.Expected = nil, nil // the executor says what is expected of this start (its launch)
		st.Starts++
	})
	m.Do(FxLaunch{Rung: rung, Argv: argv, Ep: ep, HeldBy: heldBy}) // onLaunched goes on
}

// OnLaunched: vLLM was launched (its readiness polled from now on), or
// not: the guard could not run its keeper, or the guard's first start
// gave up waiting for its port (l.heldBy: vLLM is not launched; the start
// ends as a configuration error).
func (m *Core) OnLaunched(l Launched) {
	m.R.Baseline = l.Baseline
	switch {
	case m.R.HeldBy != "":
		m.R.Gone = true
		m.Fail(Outcome{Exit: ExitInfo{Code: -1, StartFailure: fmt.Sprintf("vLLM's port %d is already in use by %s: "+
			"another vLLM (another guard instance's?) or server holds it; give this instance its own port ([vllm] port, or --port in [vllm] command)",
			m.R.BindPort, m.R.HeldBy)}, Phase: cause.PhaseStarting, Lines: l.Lines})
	case l.Err != nil:
		m.R.Gone = true
		m.Fail(Outcome{Exit: ExitInfo{Code: -1, GuardFailure: l.Err.Error()}, Phase: cause.PhaseStarting, Lines: l.Lines})
	default:
		m.R.PID = l.PID
		m.Update(func(st *Status) { st.PID = l.PID })
		m.Arm(TPoll, m.Cfg.Readiness.PollInterval.Duration)
	}
}

// BindHost is the --host vLLM's argv ends with (the last one wins, under any
// spelling vLLM reads as --host), else host.
func BindHost(argv []string, host string) string {
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

func (m *Core) ProbeReady() {
	rc := m.Cfg.Readiness
	m.Probe(ProbeReady, rc.Probe, rc.ProbeTimeout.Duration)
}

// Probe sends one probe, at most one at a time.
func (m *Core) Probe(kind ProbeKind, level string, timeout time.Duration) {
	if m.R.Probing {
		return
	}
	m.R.Probing = true
	m.Do(FxProbe{kind, level, timeout})
}

// IOGrew takes the tree's storage I/O (read off the loop) and says
// whether any process did more since the last poll. CPU time is not
// progress (NCCL hangs spin).
func (m *Core) IOGrew(now map[int]uint64) bool {
	grew := false
	for pid, n := range now {
		if before, ok := m.R.IOSeen[pid]; ok && n > before {
			m.R.IOBytes += n - before
			grew = true
		} else if !ok && n > 0 && len(m.R.IOSeen) > 0 {
			m.R.IOBytes += n
			grew = true
		}
	}
	m.R.IOSeen = now
	return grew
}

func GibText(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// OnPoll: while starting, with the tree's disk I/O read off the loop
// (readIO), look for load progress, ask the judge about a stall or the
// start-time cap, and probe readiness.
func (m *Core) OnPoll(io map[int]uint64) {
	rc := m.Cfg.Readiness
	now := m.Now
	if seen := m.Pump.LastLine; !seen.Equal(m.R.LastLine) {
		m.R.LastLine = seen
		m.Publish(events.Event{Kind: events.KindProgress, Phase: m.Pump.Phase, PID: m.R.PID, Progress: m.ShownProgress()})
	}
	lastLine := m.R.LastLine
	if m.IOGrew(io) {
		m.R.LastIO = now
		// A silent download or load: say it, as progress.
		if quiet := now.Sub(lastLine); quiet >= time.Second {
			reason := fmt.Sprintf("downloading or loading: %s read/written, no log output for %s", GibText(m.R.IOBytes), quiet.Round(time.Second))
			m.Update(func(st *Status) { st.Reason = reason })
			if now.Sub(m.R.IOAnnounced) >= 10*time.Second {
				m.R.IOAnnounced = now
				m.Publish(events.Event{Kind: events.KindProgress, Phase: "io", Reason: reason, PID: m.R.PID})
			}
		}
	}
	if m.Judge() {
		return
	}
	m.ProbeReady()
	m.Arm(TPoll, rc.PollInterval.Duration)
}

// NoteRefusal notes a readiness probe vLLM refused with a 4xx: its
// server is up and answers, so the request the guard sends does not fit
// this vLLM (a task it does not serve, a name, a key), and the judge ends
// the start after refusedProbeLimit of them. Any other answer starts the
// count again.
func (m *Core) NoteRefusal(r ProbeResult) {
	if !r.Refusal() {
		m.R.RefusedSince = time.Time{}
		return
	}
	if m.R.RefusedSince.IsZero() {
		m.R.RefusedSince = m.Now
	}
	m.R.Refusal, m.R.RefusedLast = r, m.Now
}

// OnProbe: a probe answered; what it answers depends on what asked it.
func (m *Core) OnProbe(r ProbeResult) {
	switch {
	case m.Sub == SubStarting:
		m.OnReadiness(r)
	case m.Sub == SubAskingPaused:
		m.OnPausedAnswer(r)
	case m.R.StuckProbe:
		m.OnStuckProbe(r)
	default:
		m.OnLiveness(r)
	}
}

// OnReadiness: the readiness probe's answer while starting.
func (m *Core) OnReadiness(r ProbeResult) {
	if !r.OK {
		if r.Refused && m.Now.Before(m.R.FastUntil) {
			m.Arm(TFastRetry, FastRetryEvery)
		}
		m.NoteRefusal(r)
		if m.Judge() {
			return
		}
		if !r.Refused {
			m.Update(func(st *Status) {
				st.LastProbe = r.Step + ": " + r.Err
				if r.Explains { // an API key or a name the operator must fix
					st.Reason = r.Err
				}
			})
			m.Publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.Step, Status: r.Status, Error: r.Err}, PID: m.R.PID})
		}
		return
	}
	if !m.Pump.ServerUp && !r.Own {
		// Something answered on vLLM's port before vLLM started its
		// server, over a connection nobody checked: another process's
		// listener, not this vLLM (issue 32 item 4). Its answers count
		// only after this vLLM's own line. (The guard's prober checks
		// every connection: its answers are own.)
		m.Update(func(st *Status) {
			st.LastProbe = r.Step + ": answered before vLLM's own server started (another process on the port?); waiting for vLLM's startup line"
		})
		return
	}
	m.BecomeReady(r)
}

// OnStuckProbe: the answer to the 1-token request the stuck check sends
// when vLLM's metrics are not known.
func (m *Core) OnStuckProbe(r ProbeResult) {
	m.R.StuckProbe = false
	if !r.OK && r.Status == 0 && !r.Refused {
		m.AskPaused(fmt.Sprintf("stuck: a 1-token request did not answer within stuck_timeout %s (%s)", m.Cfg.Liveness.StuckTimeout.Duration, r.Err))
	}
}

// EngineDead: /health said vLLM's engine is dead. vLLM exits by itself
// after its engine dies (its watchdog runs every 5 s), printing why: wait
// for that, for a grace (engine_dead), and kill only if it does not come.
// Already waiting for the server's exit, the wait that ends first stays.
func (m *Core) EngineDead(status int) {
	if !m.R.EngineDeadAt.IsZero() {
		return
	}
	grace := EngineDeadGrace(m.Cfg)
	m.Log().Warn("vLLM's engine is dead (/health answered "+strconv.Itoa(status)+"): waiting for vLLM to exit",
		zap.Duration("grace", grace))
	m.R.EngineDeadAt = m.Now
	if m.Sub == SubServerExiting && !m.Now.Add(grace).Before(m.R.ServerDoneAt.Add(m.Cfg.VLLM.StopTimeout.Duration)) {
		return
	}
	m.Disarm(TExiting)
	m.Enter(SubEngineDead, "", nil)
	m.Arm(TDying, grace)
}

// ServerExiting: the API server finished (uvicorn's last line): its port
// is closed because it is exiting, not hung. Python's teardown can take
// seconds on a loaded host; the exit is waited for, up to stop_timeout
// (server_exiting), and then classified from what it printed. Already
// waiting for a dead engine's exit, the wait that ends first stays.
func (m *Core) ServerExiting() {
	if !m.R.ServerDoneAt.IsZero() {
		return
	}
	limit := m.Cfg.VLLM.StopTimeout.Duration
	m.Log().Warn("vLLM's API server finished: waiting for its process to exit", zap.Duration("at_most", limit))
	m.R.ServerDoneAt = m.Now
	if m.Sub == SubEngineDead && !m.Now.Add(limit).Before(m.R.EngineDeadAt.Add(EngineDeadGrace(m.Cfg))) {
		return
	}
	m.Disarm(TDying)
	m.Enter(SubServerExiting, "", nil)
	m.Arm(TExiting, limit)
}

// OnLiveness: the liveness probe's answer while ready.
func (m *Core) OnLiveness(r ProbeResult) {
	switch {
	case r.OK:
		m.R.Failures = 0
	case r.Status == 503 || r.Status == 500:
		m.EngineDead(r.Status)
	case m.Pump.ServerDone:
		m.ServerExiting()
	default:
		m.R.Failures++
		m.R.LastErr = r.Err
		m.Publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.Step, Status: r.Status, Error: r.Err}, PID: m.R.PID})
		m.Log().Warn("liveness probe failed", zap.String("error", r.Err), zap.Int("consecutive", m.R.Failures),
			zap.Int("failures_allowed", m.Cfg.Liveness.Failures))
		m.Judge()
	}
}

func (m *Core) BecomeReady(r ProbeResult) {
	m.R.Ready = true
	ttr := m.Now.Sub(m.R.StartedAt)
	m.Do(FxReady{TTR: ttr, Phases: m.PhaseTimes()}) // the pump stops looking for load phases; the tree re-read; the policy and the record of starts told
	first := !m.EverReady
	m.EverReady = true
	m.Disarm(TPoll)
	m.Enter(SubReady, "vLLM answered the "+m.Cfg.Readiness.Probe+" probe", func(st *Status) {
		st.ReadySince, st.TimeToReady, st.Phase, st.LastProbe, st.Probe = m.Now, ttr, "", "", r.Probe
	})
	rung := m.Facts.Rung
	m.Publish(events.Event{Kind: events.KindReady, TimeToReady: ttr, First: first, PID: m.R.PID, Rung: &rung})
	m.R.StuckSince, m.R.StuckAsked = time.Time{}, m.Now
	m.Arm(TLive, m.Cfg.Liveness.Interval.Duration)
	m.Arm(TCost, m.Cfg.GPU.SampleInterval.Duration)
}
