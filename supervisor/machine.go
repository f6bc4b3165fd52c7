package supervisor

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/events"
	"github.com/vllm-guard/vllm-guard/exitcode"
	"github.com/vllm-guard/vllm-guard/policy"
)

// The step machine. One goroutine (Run) owns every field below and turns
// one event at a time into a new state plus effects: launch, signal, probe,
// arm a timer, persist, publish. Nothing in it blocks: a probe runs on its
// own goroutine and comes back as an event; every wait (the stop timeout,
// the memory release, backoff, free memory before a start) is a state with
// a timer, so the heartbeat turns all the while.
//
//	waiting_gpu (free memory) → starting → ready
//	      ↑                        ↓ exit, hang, stop, restart, restore
//	   backoff ← waiting_gpu (release) ← stopping
//	failed (gave up)   stopped (asked to)

// After "Application startup complete." a refused readiness probe is tried
// again every fastRetryEvery, for fastRetryFor.
const (
	fastRetryEvery = time.Millisecond
	fastRetryFor   = 2 * time.Second
)

// timerKind names what a timer is for; each kind has at most one armed.
type timerKind int

const (
	tPoll       timerKind = iota // readiness poll and stall check while starting
	tLive                        // liveness probe while ready
	tCost                        // a cost-model sample while ready
	tDying                       // grace after /health said the engine is dead
	tStopKill                    // SIGTERM sent: SIGKILL when it fires
	tRelease                     // read NVML again while waiting for the release
	tBackoff                     // the decided delay before the next start
	tFreeMemory                  // read NVML again while waiting for free memory
	tFastRetry                   // a refused probe right after the startup line, tried again
	timerKinds
)

// evKind is what an event from outside the loop says.
type evKind int

const (
	evTimer           evKind = iota
	evAPIGone                // vLLM's API server exited
	evTreeGone               // the whole tree is gone (the keeper exited)
	evStartupComplete        // "Application startup complete." was printed
	evProgress               // a new load phase was recognised
	evProbe                  // a probe answered
)

type event struct {
	kind  evKind
	run   int // the run of vLLM it belongs to; events of an older run are dropped
	timer timerKind
	id    uint64 // the timer's arming; a re-armed or disarmed timer's event is dropped
	probe probeResult
}

// ending is why the run in progress ends.
type ending int

const (
	endNone    ending = iota
	endExited         // vLLM exited by itself, or hung and is being killed: a failure
	endStop           // the guard was asked to stop
	endRestart        // an operator asked for a restart
	endRestore        // a stable stretch on a lower rung: one rung up
)

// phase is the machine's own state; the public State is derived from it.
type phase int

const (
	phIdle      phase = iota
	phFree            // waiting for free GPU memory before a start
	phRunning         // vLLM runs (starting or ready)
	phStopping        // the run is ending; waiting for the tree to go
	phReleasing       // waiting for the old tree's GPU memory
	phBackoff         // waiting the decided delay
	phFailed          // gave up, staying to answer status
	phDone            // Run returns
)

type machine struct {
	s      *Supervisor
	ev     chan event
	quit   chan struct{}
	timers [timerKinds]struct {
		t  *time.Timer
		id uint64
	}
	timerSeq uint64

	phase     phase
	stopAsked bool // the guard is stopping: no new start
	code      int  // the exit code once phDone

	// The run in progress.
	runN        int
	rung        policy.Rung
	child       proc
	lastChild   proc // the run that ended, for the release wait
	out         *output
	stdout      *streamWriter
	stderr      *streamWriter
	prober      checker
	runCtx      context.Context // cancelled when the run ends: in-flight probes stop
	runCancel   context.CancelFunc
	probing     bool
	startedAt   time.Time
	ready       bool
	failures    int       // consecutive liveness failures
	peak        float64   // highest GPU fraction since ready (restore)
	lastLine    int64     // the last output line's time seen by the stall check
	fastUntil   time.Time // refused probes retry fast until then (uvicorn listens just after its line)
	baseline    []uint64
	oomBefore   int64
	end         ending
	hang        string
	peer        string
	costObs     int
	ioSeen      map[int]uint64 // per process: storage I/O at the last poll
	ioBytes     uint64         // storage I/O of the tree since launch
	lastIO      time.Time      // when the tree's I/O last grew
	ioAnnounced time.Time      // when I/O progress was last published
	stuckTokens float64        // the token counters' sum seen last while ready
	stuckSince  time.Time      // since when they stand still with requests running
	stuckProbe  bool           // the probe in flight is the stuck check's request
	stuckAsked  time.Time      // when that request was last sent

	// After a failure.
	decision       policy.Decision
	releasePIDs    []int
	releaseBase    []uint64
	releaseUntil   time.Time
	releaseKilled  bool
	releaseStarted time.Time

	everReady bool

	pending *config.Config // a reloaded config for vLLM's next start
}

// Run supervises vLLM until ctx is cancelled (exit 0) or the policy gives
// up (exit 1, or 78 for a configuration error).
func (s *Supervisor) Run(ctx context.Context) int {
	sink := newLogSink(s.log)
	sink.filter = s.pumpFilter()
	defer sink.close()
	m := &machine{s: s, ev: make(chan event, 64), quit: make(chan struct{})}
	defer m.shutdown()
	heartbeat := time.NewTicker(time.Second)
	defer heartbeat.Stop()
	stop := ctx.Done()
	m.next(sink)
	for m.phase != phDone {
		select {
		case <-stop:
			stop = nil
			m.onStop()
		case <-s.kill:
			m.onKill()
		case e := <-m.ev:
			m.handle(e, sink)
		case r := <-s.reqs:
			m.onRequest(r, sink)
		case <-heartbeat.C:
			s.beat()
			m.onHeartbeat()
		}
	}
	code := m.code
	s.publish(events.Event{Kind: events.KindStopped, State: string(s.Status().State), Reason: s.Status().Reason, ExitCode: &code})
	return code
}

// shutdown releases what the machine holds when Run returns.
func (m *machine) shutdown() {
	for k := range m.timers {
		m.disarm(timerKind(k))
	}
	if m.runCancel != nil {
		m.runCancel()
	}
	close(m.quit)
}

// post hands an event to the loop from another goroutine; it gives up when
// the loop has ended.
func (m *machine) post(e event) {
	select {
	case m.ev <- e:
	case <-m.quit:
	}
}

func (m *machine) arm(k timerKind, d time.Duration) {
	m.disarm(k)
	m.timerSeq++
	id, run := m.timerSeq, m.runN
	m.timers[k].id = id
	m.timers[k].t = time.AfterFunc(d, func() { m.post(event{kind: evTimer, timer: k, id: id, run: run}) })
}

func (m *machine) disarm(k timerKind) {
	if t := m.timers[k].t; t != nil {
		t.Stop()
	}
	m.timers[k].t, m.timers[k].id = nil, 0
}

// handle turns one event into the next state.
func (m *machine) handle(e event, sink *logSink) {
	if e.kind == evTimer {
		if m.timers[e.timer].id != e.id {
			return // re-armed or disarmed since
		}
		m.timers[e.timer].t, m.timers[e.timer].id = nil, 0
		m.onTimer(e.timer, sink)
		return
	}
	if e.run != m.runN {
		return // an older run's
	}
	switch e.kind {
	case evAPIGone:
		m.endRun(endExited)
	case evTreeGone:
		if m.child != nil {
			m.finishRun(sink)
		}
	case evStartupComplete:
		if m.phase == phRunning && !m.ready {
			// uvicorn logs the line, then starts listening: the first probe
			// is usually refused, so refused probes retry at a short, bounded
			// cadence instead of waiting for the next poll.
			m.fastUntil = time.Now().Add(fastRetryFor)
			m.probeReady()
		}
	case evProgress:
		if m.phase == phRunning && !m.ready {
			ph := m.out.Phase()
			m.s.update(func(st *Status) { st.Phase, st.Reason = ph, "loading: "+ph })
			m.s.publish(events.Event{Kind: events.KindProgress, Phase: ph, PID: m.child.pid()})
		}
	case evProbe:
		m.probing = false
		if m.phase == phRunning {
			m.onProbe(e.probe)
		}
	}
}

func (m *machine) onTimer(k timerKind, sink *logSink) {
	switch k {
	case tPoll:
		m.onPoll()
	case tLive:
		lc := m.s.cfg.Liveness
		m.probe(func(ctx context.Context, p checker) probeResult { return p.health(ctx, lc.Timeout.Duration) })
		m.arm(tLive, lc.Interval.Duration)
	case tCost:
		m.observeCost()
		m.arm(tCost, m.s.cfg.GPU.SampleInterval.Duration)
	case tDying:
		m.hung(fmt.Sprintf("/health said vLLM's engine is dead and vLLM did not exit within %s", m.s.engineDeadGrace()))
	case tStopKill:
		m.s.log.Warn("vLLM did not stop within its stop timeout: the keeper kills its whole tree",
			zap.Duration("stop_timeout", m.s.stopTimeout()))
		m.s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.child.pid(),
			Reason: fmt.Sprintf("vLLM did not stop within %s", m.s.stopTimeout())})
		m.child.kill()
	case tRelease:
		m.checkReleased()
	case tBackoff:
		m.s.update(func(st *Status) { st.NextStartAt = time.Time{} })
		m.next(sink)
	case tFreeMemory:
		m.next(sink)
	case tFastRetry:
		if m.phase == phRunning && !m.ready {
			m.probeReady()
		}
	}
}

// next starts the next run once the GPU has room for it: the free-memory
// check vLLM itself makes and fails on. While there is no room, the state
// is waiting_gpu, naming the holders.
func (m *machine) next(sink *logSink) {
	if m.stopAsked {
		m.finish(exitcode.OK, StateStopped, "stopped on request")
		return
	}
	m.applyPending()
	rung := m.s.pol.Current()
	m.s.update(func(st *Status) { st.Rung = rung })
	if m.s.gpu != nil {
		ok, why, holders := m.s.gpu.CheckFree(rung)
		if !ok {
			reason := "not enough free GPU memory to start: " + why
			if m.phase != phFree || m.s.Status().Reason != reason {
				m.s.log.Warn("waiting for GPU memory before starting vLLM", zap.String("why", why), zap.String("holders", holdersText(holders)))
			}
			m.phase = phFree
			m.s.update(func(st *Status) { st.State, st.Reason = StateWaitingGPU, reason })
			m.arm(tFreeMemory, m.s.cfg.GPU.SampleInterval.Duration)
			return
		}
	}
	m.launch(sink, rung)
}

// launch starts vLLM on rung.
func (m *machine) launch(sink *logSink, rung policy.Rung) {
	s := m.s
	cfg := s.cfg
	argv, ep := BuildArgv(cfg.VLLM.Command, s.extra, rung, cfg.VLLM.Host, cfg.VLLM.Port)
	m.runN++
	m.phase = phRunning
	m.rung = rung
	m.ready, m.failures, m.peak, m.end, m.hang, m.peer, m.probing = false, 0, 0, endNone, "", "", false
	m.lastChild = nil
	m.ioSeen, m.ioBytes, m.lastIO, m.stuckProbe = map[int]uint64{}, 0, time.Time{}, false
	m.out = newOutput(sink, max(cfg.Log.ChildLines, 1000))
	m.lastLine = m.out.lastLine.Load()
	m.stdout, m.stderr = m.out.writer("stdout"), m.out.writer("stderr")
	m.oomBefore = s.hostOOM()
	m.baseline = nil
	if s.gpu != nil {
		m.baseline = s.gpu.UsedBytes()
	}
	s.pol.OnStart(time.Now())
	s.savePolicy()
	m.startedAt = time.Now()
	s.update(func(st *Status) {
		st.State, st.Reason, st.Phase, st.LastProbe, st.PID, st.StartedAt, st.ReadySince, st.Rung =
			StateStarting, "launching vLLM", "", "", 0, m.startedAt, time.Time{}, rung
		st.Starts++
	})
	env := ChildEnv(os.Environ(), cfg.VLLM.Env)
	c, err := s.launcher.launch(launchSpec{keeper: s.keeper, argv: argv, env: env,
		dir: cfg.VLLM.Workdir, grace: cfg.VLLM.StopTimeout.Duration, stdout: m.stdout, stderr: m.stderr})
	r := rung
	s.publish(events.Event{Kind: events.KindStarting, Rung: &r, Argv: s.MaskedArgv(argv), PID: pidOf(c)})
	if err != nil {
		// The guard could not even run its keeper.
		m.child = nil
		m.stdout.Close()
		m.stderr.Close()
		m.fail(outcome{exit: exitInfo{Code: -1, GuardFailure: err.Error()}, phase: policy.PhaseStarting, lines: m.out.ring.snapshot()})
		return
	}
	m.child = c
	c.refresh() // the API server is known (with its start time) from the first moment
	m.out.pid.Store(int64(c.pid()))
	s.update(func(st *Status) { st.PID = c.pid() })
	if s.gpu != nil {
		s.gpu.SetBudget(rung)
		s.gpu.SetTree(c.tree)
		s.gpu.SetLoading(true)
	}
	m.prober = s.newProber(ep, s.model)
	m.runCtx, m.runCancel = context.WithCancel(context.Background())
	m.forward(c)
	m.arm(tPoll, cfg.Readiness.PollInterval.Duration)
}

func pidOf(c proc) int {
	if c == nil {
		return 0
	}
	return c.pid()
}

// forward turns the run's channels into events for the loop, until the
// tree is gone.
func (m *machine) forward(c proc) {
	run, out := m.runN, m.out
	go func() {
		apiGone := c.apiGone()
		for {
			select {
			case <-apiGone:
				apiGone = nil
				m.post(event{kind: evAPIGone, run: run})
			case <-out.startupEnd:
				m.post(event{kind: evStartupComplete, run: run})
			case <-out.progress:
				m.post(event{kind: evProgress, run: run})
			case <-c.done():
				m.post(event{kind: evTreeGone, run: run})
				return
			}
		}
	}()
}

// probe runs one probe on its own goroutine, at most one at a time.
func (m *machine) probe(f func(context.Context, checker) probeResult) {
	if m.probing {
		return
	}
	m.probing = true
	run, p, ctx := m.runN, m.prober, m.runCtx
	go func() { m.post(event{kind: evProbe, run: run, probe: f(ctx, p)}) }()
}

func (m *machine) probeReady() {
	rc := m.s.cfg.Readiness
	m.probe(func(ctx context.Context, p checker) probeResult {
		return p.ready(ctx, rc.Probe, rc.ProbeTimeout.Duration)
	})
}

// ioGrew reads the tree's storage I/O and says whether any process did
// more since the last poll. CPU time is not progress (NCCL hangs spin).
func (m *machine) ioGrew() bool {
	grew := false
	now := m.child.io()
	for pid, n := range now {
		if before, ok := m.ioSeen[pid]; ok && n > before {
			m.ioBytes += n - before
			grew = true
		} else if !ok && n > 0 && len(m.ioSeen) > 0 {
			m.ioBytes += n
			grew = true
		}
	}
	m.ioSeen = now
	return grew
}

func gibText(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// onPoll: while starting, look for load progress, a stall, the start-time
// cap, and probe readiness.
func (m *machine) onPoll() {
	if m.phase != phRunning || m.ready {
		return
	}
	rc := m.s.cfg.Readiness
	now := time.Now()
	if seen := m.out.lastLine.Load(); seen != m.lastLine {
		m.lastLine = seen
		m.s.publish(events.Event{Kind: events.KindProgress, Phase: m.out.Phase(), PID: m.child.pid()})
	}
	lastLine := time.Unix(0, m.lastLine)
	if m.ioGrew() {
		m.lastIO = now
		// A silent download or load: say it, as progress.
		if quiet := now.Sub(lastLine); quiet >= time.Second {
			reason := fmt.Sprintf("downloading or loading: %s read/written, no log output for %s", gibText(m.ioBytes), quiet.Round(time.Second))
			m.s.update(func(st *Status) { st.Reason = reason })
			if now.Sub(m.ioAnnounced) >= 10*time.Second {
				m.ioAnnounced = now
				m.s.publish(events.Event{Kind: events.KindProgress, Phase: "io", Reason: reason, PID: m.child.pid()})
			}
		}
	}
	last := lastLine
	if m.lastIO.After(last) {
		last = m.lastIO
	}
	if silent := now.Sub(last); silent > rc.StallTimeout.Duration {
		m.hung(fmt.Sprintf("no load progress (no output, no disk I/O) for %s while starting (stall_timeout %s), last phase %q",
			silent.Round(time.Second), rc.StallTimeout.Duration, m.out.Phase()))
		return
	}
	if limit := rc.MaxStartTime.Duration; limit > 0 && now.Sub(m.startedAt) > limit {
		m.hung(fmt.Sprintf("not ready after max_start_time %s", limit))
		return
	}
	m.probeReady()
	m.arm(tPoll, rc.PollInterval.Duration)
}

func (m *machine) onProbe(r probeResult) {
	s := m.s
	if !m.ready {
		if !r.ok {
			if r.refused && time.Now().Before(m.fastUntil) {
				m.arm(tFastRetry, fastRetryEvery)
			}
			if !r.refused {
				s.update(func(st *Status) {
					st.LastProbe = r.step + ": " + r.err
					if r.explains { // an API key or a name the operator must fix
						st.Reason = r.err
					}
				})
				s.publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.step, Status: r.status, Error: r.err}, PID: m.child.pid()})
			}
			return
		}
		m.becomeReady(r)
		return
	}
	if m.stuckProbe {
		m.stuckProbe = false
		if !r.ok && r.status == 0 && !r.refused {
			m.hung(fmt.Sprintf("stuck: a 1-token request did not answer within stuck_timeout %s (%s)", s.cfg.Liveness.StuckTimeout.Duration, r.err))
		}
		return
	}
	switch {
	case r.ok:
		m.failures = 0
	case r.status == 503 || r.status == 500:
		// vLLM exits by itself after its engine dies (its watchdog runs
		// every 5 s), printing why: wait for that, and kill only if it
		// does not come.
		if m.timers[tDying].t == nil {
			grace := s.engineDeadGrace()
			s.log.Warn("vLLM's engine is dead (/health answered "+strconv.Itoa(r.status)+"): waiting for vLLM to exit",
				zap.Duration("grace", grace))
			m.arm(tDying, grace)
		}
	default:
		m.failures++
		s.publish(events.Event{Kind: events.KindProbeFailed, Probe: &events.Probe{Step: r.step, Status: r.status, Error: r.err}, PID: m.child.pid()})
		s.log.Warn("liveness probe failed", zap.String("error", r.err), zap.Int("consecutive", m.failures),
			zap.Int("failures_allowed", s.cfg.Liveness.Failures))
		if m.failures >= s.cfg.Liveness.Failures {
			m.hung(fmt.Sprintf("%d consecutive liveness failures, last: %s", m.failures, r.err))
		}
	}
}

func (m *machine) becomeReady(r probeResult) {
	s := m.s
	m.ready = true
	m.out.loaded.Store(true)
	m.child.refresh()
	ttr := time.Since(m.startedAt)
	s.pol.OnReady(time.Now())
	s.savePolicy()
	first := !m.everReady
	m.everReady = true
	m.disarm(tPoll)
	s.update(func(st *Status) {
		st.State, st.Reason, st.ReadySince, st.TimeToReady, st.Phase, st.LastProbe, st.Probe =
			StateReady, "vLLM answered the "+s.cfg.Readiness.Probe+" probe", time.Now(), ttr, "", "", r.probe
	})
	rung := s.pol.Current()
	s.publish(events.Event{Kind: events.KindReady, TimeToReady: ttr, First: first, PID: m.child.pid(), Rung: &rung})
	if s.gpu != nil {
		s.gpu.SetLoading(false)
	}
	m.stuckSince, m.stuckAsked = time.Time{}, time.Now()
	m.arm(tLive, s.cfg.Liveness.Interval.Duration)
	m.arm(tCost, s.cfg.GPU.SampleInterval.Duration)
}

// onHeartbeat runs every second: the tree is re-read, and a stable stretch
// on a lower rung may call for a restore.
func (m *machine) onHeartbeat() {
	if m.phase != phRunning {
		return
	}
	m.child.refresh()
	if !m.ready {
		return
	}
	if m.checkStuck() {
		return
	}
	if r, ok := m.restoreDue(); ok {
		m.s.log.Info("stable on a lower rung: restarting one rung up", zap.Int("to_rung", r.Index),
			zap.Int("max_num_seqs", r.MaxNumSeqs), zap.Float64("peak_gpu_fraction", m.peak))
		m.endRun(endRestore)
	}
}

// endProbing stops what watches a run: its timers and in-flight probes.
func (m *machine) endProbing() {
	for _, k := range []timerKind{tPoll, tLive, tCost, tDying, tFastRetry} {
		m.disarm(k)
	}
	if m.runCancel != nil {
		m.runCancel()
	}
}

// checkStuck: /health only checks an error flag, so a wedged engine still
// answers 200. vLLM is stuck when it reports running requests and none of
// its token counters advances for stuck_timeout; without its metrics, a
// 1-token request bounded by stuck_timeout is sent every stuck_timeout.
// A busy vLLM that makes progress, or an idle one, is never stuck.
func (m *machine) checkStuck() bool {
	s := m.s
	limit := s.cfg.Liveness.StuckTimeout.Duration
	if limit <= 0 || s.tokens == nil {
		return false
	}
	now := time.Now()
	running, tokens, ok := s.tokens()
	if !ok {
		if !m.probing && now.Sub(m.stuckAsked) >= limit {
			m.stuckAsked, m.stuckProbe = now, true
			level := s.cfg.Readiness.Probe
			m.probe(func(ctx context.Context, p checker) probeResult { return p.ready(ctx, level, limit) })
		}
		return false
	}
	if running <= 0 || tokens != m.stuckTokens || m.stuckSince.IsZero() {
		m.stuckTokens, m.stuckSince = tokens, now
		return false
	}
	if still := now.Sub(m.stuckSince); still >= limit {
		m.hung(fmt.Sprintf("stuck: %g requests running and no token counter advanced for %s (prompt+generation tokens at %g; stuck_timeout %s)",
			running, still.Round(time.Second), tokens, limit))
		return true
	}
	return false
}

// hung ends the run as a hang.
func (m *machine) hung(reason string) {
	m.hang = reason
	m.endRun(endExited)
}

// endRun starts ending the run in progress: SIGTERM, then SIGKILL after
// stop_timeout, unless the tree is already gone.
func (m *machine) endRun(why ending) {
	if m.phase != phRunning {
		return
	}
	m.end = why
	m.phase = phStopping
	m.endProbing()
	m.s.transition(StateStopping, m.stopReason())
	select {
	case <-m.child.done():
		return // evTreeGone is on its way
	default:
	}
	if m.hang != "" {
		// vLLM is wedged: a drain would only wait on requests that never end.
		m.s.log.Warn("vLLM hung: killing its process tree", zap.String("reason", m.hang))
		m.child.kill()
		return
	}
	select {
	case <-m.child.apiGone():
		// The API server is gone (the keeper cleans up the rest): nothing
		// drains any more; give the keeper its grace, then kill.
		m.arm(tStopKill, m.s.cfg.VLLM.StopTimeout.Duration)
		return
	default:
	}
	m.child.stop()
	m.arm(tStopKill, m.s.stopTimeout())
}

func (m *machine) stopReason() string {
	switch {
	case m.hang != "":
		return "vLLM hung: " + m.hang
	case m.end == endRestart:
		return "restart requested"
	case m.end == endRestore:
		return "restoring one rung up after a stable stretch"
	case m.end == endExited:
		return "vLLM exited: cleaning up its process tree"
	default:
		return "stop requested"
	}
}

// finishRun: the whole tree is gone. Decide what comes next.
func (m *machine) finishRun(sink *logSink) {
	s := m.s
	c := m.child
	if m.phase == phRunning {
		// The tree went before the API server's exit was handled.
		m.end = endExited
	}
	m.disarm(tStopKill)
	m.endProbing()
	m.prober.close()
	c.refresh()
	if left := c.killLeftovers(); len(left) > 0 {
		s.log.Warn("vLLM processes outlived their keeper: killing them", zap.Ints("pids", left))
	}
	m.stdout.Close()
	m.stderr.Close()
	if s.gpu != nil {
		s.gpu.SetTree(nil)
		s.gpu.SetLoading(false)
	}
	exit := c.exit()
	killedByGuard := m.end != endExited || m.hang != ""
	res := outcome{exit: exit, pid: c.pid(), phase: policy.PhaseStarting, hang: m.hang, killedByGuard: killedByGuard,
		lines: m.out.ring.snapshot(), uptime: time.Since(m.startedAt)}
	if m.ready {
		res.phase = policy.PhaseReady
	}
	res.hostOOM = !killedByGuard && exit.Signal == "SIGKILL" && s.hostOOM() > m.oomBefore
	m.releasePIDs, m.releaseBase = c.seen(), m.baseline
	s.update(func(st *Status) { st.LogDropped = sink.dropped.Load(); st.PID = 0 })
	end := m.end
	m.child, m.lastChild = nil, c
	switch end {
	case endStop:
		m.finish(exitcode.OK, StateStopped, "stopped on request")
	case endRestart:
		s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: "restarting vLLM on request from " + m.peer})
		m.next(sink)
	case endRestore:
		s.pol.OnRestore(time.Now())
		s.savePolicy()
		r := s.pol.Current()
		s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestore, Rung: &r,
			Reason: "stepped one rung up after a stable stretch"})
		m.next(sink)
	default:
		m.fail(res)
	}
}

// outcome is how one run of vLLM ended, as the classifier needs it.
type outcome struct {
	exit          exitInfo
	pid           int
	phase         policy.Phase
	hang          string
	killedByGuard bool
	hostOOM       bool
	lines         []policy.Line
	uptime        time.Duration
}

// fail classifies a death, asks the policy what next, publishes it, and
// moves on: give up, or wait for the memory, then back off.
func (m *machine) fail(res outcome) {
	s := m.s
	now := time.Now()
	exit := policy.Exit{
		Lines:         res.lines,
		ExitCode:      res.exit.Code,
		Signal:        res.exit.Signal,
		SignalByGuard: res.killedByGuard,
		Hang:          res.hang,
		HostOOMKill:   res.hostOOM,
		Phase:         res.phase,
		Critical:      s.criticalFraction(),
		StartFailure:  res.exit.StartFailure,
		GuardFailure:  res.exit.GuardFailure,
	}
	if s.gpu != nil {
		exit.MemFractions = s.gpu.RecentFractions(10)
	}
	v := policy.Classify(exit)
	d := s.pol.OnFailure(now, v)
	s.savePolicy()
	m.describeCost()
	f := Failure{Time: now, PID: res.pid, Exit: res.exit.String(), ExitCode: res.exit.Code, Signal: res.exit.Signal,
		Phase: res.phase, Verdict: v, Decision: d, RungBefore: m.rung, Lines: res.lines, MemFractions: exit.MemFractions, Uptime: res.uptime}
	s.update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	s.publish(events.Event{Kind: events.KindExited, Failure: &f, PID: res.pid})
	m.decision = d
	if d.Action == policy.ActionGiveUp {
		m.giveUp(f)
		return
	}
	if m.stopAsked {
		m.finish(exitcode.OK, StateStopped, "stopped on request")
		return
	}
	if s.gpu != nil && res.pid != 0 {
		m.phase = phReleasing
		m.releaseStarted = time.Now()
		m.releaseUntil = m.releaseStarted.Add(s.cfg.GPU.ReleaseTimeout.Duration)
		m.releaseKilled = false
		s.transition(StateWaitingGPU, "waiting for the old vLLM's GPU memory to be released")
		m.checkReleased()
		return
	}
	m.backoff()
}

// checkReleased reads NVML once: released → back off; not yet → read again
// at the next sample; after release_timeout, survivors of the old tree that
// still hold memory are killed (they would make the next start fail vLLM's
// free-memory check) and the wait starts once more.
func (m *machine) checkReleased() {
	s := m.s
	released, held := s.gpu.Released(m.releasePIDs, m.releaseBase)
	if released {
		m.backoff()
		return
	}
	now := time.Now()
	if now.Before(m.releaseUntil) {
		m.arm(tRelease, min(s.cfg.GPU.SampleInterval.Duration, m.releaseUntil.Sub(now)))
		return
	}
	if !m.releaseKilled {
		m.releaseKilled = true
		if m.killHolders(held) {
			m.releaseUntil = now.Add(s.cfg.GPU.ReleaseTimeout.Duration)
			m.arm(tRelease, s.cfg.GPU.SampleInterval.Duration)
			return
		}
	}
	s.log.Warn("GPU memory still held after release_timeout", zap.String("holders", holdersText(held)),
		zap.Duration("release_timeout", s.cfg.GPU.ReleaseTimeout.Duration))
	m.backoff()
}

// killHolders kills the holders that are still the very processes of the
// old tree (never a reused PID), and says whether it killed any.
func (m *machine) killHolders(held []Holder) bool {
	ours := map[int]bool{}
	for _, p := range m.releasePIDs {
		ours[p] = true
	}
	killed := false
	for _, h := range held {
		if ours[h.PID] && m.lastChild != nil && m.lastChild.killIfOurs(h.PID) {
			m.s.log.Warn("killed a survivor of the old vLLM that still held GPU memory",
				zap.Int("pid", h.PID), zap.String("command", h.Command), zap.Uint64("bytes", h.Bytes))
			killed = true
		}
	}
	return killed
}

func (m *machine) backoff() {
	if m.stopAsked {
		m.finish(exitcode.OK, StateStopped, "stopped on request")
		return
	}
	d := m.decision
	m.phase = phBackoff
	next := time.Now().Add(d.Delay)
	m.s.update(func(st *Status) {
		st.State, st.Reason, st.NextStartAt, st.Rung = StateBackoff,
			fmt.Sprintf("restarting in %s on rung %d: %s", d.Delay.Round(time.Millisecond), d.Rung.Index, d.Reason), next, d.Rung
	})
	m.arm(tBackoff, d.Delay)
}

func (m *machine) giveUp(f Failure) {
	s := m.s
	code := f.Decision.ExitCode
	s.update(func(st *Status) {
		st.State, st.Reason, st.PID, st.ExitCode = StateFailed, "gave up: "+f.Decision.Reason, 0, code
	})
	s.log.Error("gave up on vLLM", zap.String("cause", string(f.Verdict.Cause)), zap.String("reason", f.Decision.Reason),
		zap.Int("exit_code", code))
	if s.cfg.Restart.OnGiveUp != "stay" || m.stopAsked {
		m.phase, m.code = phDone, code
		return
	}
	m.phase = phFailed // "stay": keep answering status until asked to stop
}

func (m *machine) finish(code int, state State, reason string) {
	for k := range m.timers {
		m.disarm(timerKind(k))
	}
	m.s.update(func(st *Status) {
		st.State, st.Reason, st.PID, st.ExitCode, st.NextStartAt = state, reason, 0, code, time.Time{}
	})
	m.phase, m.code = phDone, code
}

// reload: what does not touch the running vLLM applies now; the rest
// (command, env, host, port, workdir, profile, restart policy) waits for
// its next start.
func (m *machine) reload(cfg *config.Config) {
	s := m.s
	live := *cfg
	live.VLLM, live.Profile, live.Restart = s.cfg.VLLM, s.cfg.Profile, s.cfg.Restart
	vllmSame := reflect.DeepEqual(cfg.VLLM, s.cfg.VLLM) && cfg.Profile == s.cfg.Profile && cfg.Restart == s.cfg.Restart
	s.cfg = &live
	if vllmSame {
		m.pending = nil
	} else {
		m.pending = cfg
	}
	s.pendingReload.Store(m.pending != nil)
}

// applyPending: vLLM starts now, on the reloaded config if there is one.
func (m *machine) applyPending() {
	if m.pending == nil {
		return
	}
	s := m.s
	s.cfg, m.pending = m.pending, nil
	s.pendingReload.Store(false)
	s.pol.Reconfigure(s.cfg)
	if args, err := s.cfg.VLLMArgs(s.extra); err == nil {
		s.args = args
		s.pol.SetKVCacheBytes(args.KVCacheMemoryBytes)
	} else {
		s.pol.SetKVCacheBytes(s.args.KVCacheMemoryBytes)
		s.log.Warn("the reloaded vLLM command line cannot be read; probes keep the old names and keys", zap.Error(err))
	}
	if names := s.cfg.ServedModelNames(s.args); len(names) > 0 {
		s.model = names[0]
	}
	s.log.Info("vLLM starts on the reloaded configuration")
}

// onKill: a second SIGTERM or SIGINT while stopping: no more waiting.
func (m *machine) onKill() {
	if m.phase == phStopping && m.child != nil {
		m.disarm(tStopKill)
		m.s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.child.pid(),
			Reason: "asked to stop again"})
		m.child.kill()
	}
}

// onStop: the guard was asked to stop (SIGTERM, SIGINT).
func (m *machine) onStop() {
	m.stopAsked = true
	m.s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionStop, Reason: "the guard was asked to stop"})
	switch m.phase {
	case phRunning:
		m.endRun(endStop)
	case phStopping:
		if m.end != endExited {
			m.end = endStop
		}
		// A failure being cleaned up is still recorded; then the guard stops.
	case phFailed:
		m.phase, m.code = phDone, exitcode.OK
	default: // waiting for memory, releasing, backing off
		m.finish(exitcode.OK, StateStopped, "stopped on request")
	}
}

// onRequest answers an operator's request.
func (m *machine) onRequest(r request, sink *logSink) {
	s := m.s
	if m.phase == phFailed {
		r.reply <- fmt.Errorf("the guard gave up; restart the guard itself (systemctl restart) after fixing the cause")
		return
	}
	switch r.kind {
	case "restart":
		s.log.Info("operator asked for a restart", zap.String("peer", r.peer))
		r.reply <- nil
		switch m.phase {
		case phRunning:
			m.peer = r.peer
			m.endRun(endRestart)
		case phBackoff, phFree:
			m.disarm(tBackoff)
			m.disarm(tFreeMemory)
			s.update(func(st *Status) { st.NextStartAt = time.Time{} })
			s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: "restarting vLLM on request from " + r.peer})
			m.next(sink)
		}
		// Stopping or waiting for the release: a restart is under way.
	case "reload":
		m.reload(r.cfg)
		r.reply <- nil
	case "reset_profile":
		s.pol.ResetProfile()
		s.savePolicy()
		rung := s.pol.Current()
		s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionProfileReset, Rung: &rung,
			Reason: "operator " + r.peer + " reset the profile: rung 0 at the next start"})
		r.reply <- nil
	default:
		r.reply <- fmt.Errorf("unknown request %q", r.kind)
	}
}

// stopTimeout is how long a graceful stop may take before the tree is
// killed: stop_timeout, or vLLM's own --shutdown-timeout (its drain) plus
// 10 s for it to stop its engine, whichever is longer.
func (s *Supervisor) stopTimeout() time.Duration {
	return EffectiveStopTimeout(s.cfg.VLLM.StopTimeout.Duration, s.shutdownTimeout())
}

// EffectiveStopTimeout is max(stop_timeout, --shutdown-timeout + 10 s)
// when vLLM is given a shutdown timeout (0 when not).
func EffectiveStopTimeout(stopTimeout, vllmShutdown time.Duration) time.Duration {
	if vllmShutdown <= 0 {
		return stopTimeout
	}
	return max(stopTimeout, vllmShutdown+10*time.Second)
}

// shutdownTimeout is vLLM's --shutdown-timeout from the command line in
// force (the last one given wins, as in vLLM's parser), 0 when absent.
func (s *Supervisor) shutdownTimeout() time.Duration {
	return ShutdownTimeout(append(slices.Clone(s.cfg.VLLM.Command), s.extra...))
}

// ShutdownTimeout reads --shutdown-timeout (seconds) from vLLM's argv.
func ShutdownTimeout(argv []string) time.Duration {
	var d time.Duration
	for i, a := range argv {
		v, ok := strings.CutPrefix(a, "--shutdown-timeout=")
		if !ok && (a == "--shutdown-timeout" || a == "--shutdown_timeout") && i+1 < len(argv) {
			v, ok = argv[i+1], true
		}
		if ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 {
				d = time.Duration(f * float64(time.Second))
			} else {
				d = 0
			}
		}
	}
	return d
}

// engineDeadGrace is how long the guard waits, after /health says vLLM's
// engine is dead, for vLLM to exit by itself (its watchdog runs every 5 s,
// and it prints the root cause) before it kills it as hung: one liveness
// interval, between 1 and 10 seconds.
func (s *Supervisor) engineDeadGrace() time.Duration {
	return min(10*time.Second, max(time.Second, s.cfg.Liveness.Interval.Duration))
}

// restoreDue tracks the peak GPU fraction since ready and asks the policy
// whether to step one rung up.
func (m *machine) restoreDue() (policy.Rung, bool) {
	s := m.s
	if s.cfg.Profile.RestoreAfter.Duration <= 0 {
		return policy.Rung{}, false
	}
	if s.gpu != nil {
		for _, f := range s.gpu.RecentFractions(1) {
			m.peak = max(m.peak, f)
		}
	}
	idle := false
	if s.load != nil {
		running, waiting, ok := s.load()
		idle = ok && running == 0 && waiting == 0
	}
	return s.pol.RestoreDue(time.Now(), m.peak, idle)
}

// observeCost feeds the cost model one (running sequences, memory) pair.
func (m *machine) observeCost() {
	s := m.s
	if s.gpu == nil || s.load == nil {
		return
	}
	running, _, ok := s.load()
	used, total, gok := s.gpu.Fullest()
	if !ok || !gok {
		return
	}
	s.pol.ObserveCost(running, used, total)
	m.costObs++
	if m.costObs%10 == 1 {
		m.describeCost()
	}
}

// describeCost puts the cost model's one-line summary in the status.
func (m *machine) describeCost() {
	r := m.s.pol.Current()
	d := m.s.pol.Cost().Describe(r.GPUMemoryUtilization, m.s.cfg.Profile.Headroom)
	m.s.update(func(st *Status) { st.Cost = d })
}
