package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Ending a run: the stop (a drain, or a kill for a hang), the tree gone,
// the failure classified and decided, the memory release, backoff, giving up.

// hung ends the run as a hang.
func (m *machine) hung(reason string) {
	m.r.hang = reason
	m.endRun(endExited)
}

// endRun starts ending the run in progress: SIGTERM, then SIGKILL after
// stop_timeout, unless the tree is already gone.
func (m *machine) endRun(why ending) {
	if !m.sub.running() {
		return
	}
	m.r.end = why
	m.endProbing()
	reason := m.stopReason()
	select {
	case <-m.r.child.done():
		m.enter(subStopTerm, reason, nil) // evTreeGone is on its way
		return
	default:
	}
	if m.r.hang != "" || m.r.gpuKilled {
		// vLLM is wedged, or its GPU is gone: a drain would only wait on
		// requests that never end.
		if m.r.hang != "" {
			m.s.log.Warn("vLLM hung: killing its process tree", zap.String("reason", m.r.hang))
		}
		m.r.child.kill()
		m.enter(subStopKill, reason, nil)
		return
	}
	select {
	case <-m.r.child.apiGone():
		// The API server is gone (the keeper cleans up the rest): nothing
		// drains any more; give the keeper its grace, then kill.
		m.arm(tStopKill, m.s.cfg.VLLM.StopTimeout.Duration)
		m.enter(subStopTerm, reason, nil)
		return
	default:
	}
	if m.drainFirst() {
		return
	}
	m.r.child.stop()
	m.arm(tStopKill, m.s.stopTimeout())
	m.enter(subStopTerm, reason, nil)
}

// drainFirst: a planned stop (an operator's stop or restart, a restore)
// with vLLM's --shutdown-timeout and the guard's proxy in front waits for
// the requests in flight through the proxy to end before vLLM gets
// SIGTERM, for at most that timeout. vLLM 0.32.0 (seen on its CPU build)
// cuts the requests in flight a few seconds into its own drain: its
// process manager's SIGTERM reaches the workers. New requests wait in the
// proxy meanwhile (the guard no longer says ready). True when draining.
func (m *machine) drainFirst() bool {
	if m.s.inFlight == nil || m.s.shutdownTimeout() <= 0 || m.r.end == endExited || m.s.inFlight() == 0 {
		return false
	}
	m.r.drainUntil = m.now.Add(m.s.shutdownTimeout())
	n := m.s.inFlight()
	m.s.log.Info("waiting for the requests in flight through the proxy before vLLM gets SIGTERM",
		zap.Int("requests", n), zap.Duration("at_most", m.s.shutdownTimeout()))
	m.enter(subDraining, fmt.Sprintf("%s: waiting for %d requests in flight through the proxy (at most %s)", m.stopReason(), n, m.s.shutdownTimeout()), nil)
	m.arm(tDrain, drainPoll)
	return true
}

// drainPoll is how often the proxy's count is looked at while draining.
const drainPoll = 50 * time.Millisecond

// drainStep: the proxy's requests ended (or the time is up): now SIGTERM.
func (m *machine) drainStep() {
	if n := m.s.inFlight(); n > 0 && m.now.Before(m.r.drainUntil) {
		m.arm(tDrain, drainPoll)
		return
	}
	// The whole stop stays within the effective stop timeout that `check`
	// prints (the units' TimeoutStopSec is set from it), leaving vLLM at
	// least 10 s to stop its engine.
	left := max(m.s.stopTimeout()-(m.s.shutdownTimeout()-m.r.drainUntil.Sub(m.now)), 10*time.Second)
	m.r.drainUntil = time.Time{}
	select {
	case <-m.r.child.done():
		return
	default:
	}
	m.enter(subStopTerm, m.stopReason(), nil)
	m.r.child.stop()
	m.arm(tStopKill, left)
}

func (m *machine) stopReason() string {
	switch {
	case m.r.hang != "":
		return "vLLM hung: " + m.r.hang
	case m.r.gpuKilled:
		return "the GPU failed under vLLM: killing its process tree"
	case m.r.end == endRestart:
		return "restart requested"
	case m.r.end == endRestore:
		return "restoring one rung up after a stable stretch"
	case m.r.end == endExited:
		return "vLLM exited: cleaning up its process tree"
	default:
		return stopRequested
	}
}

// stopRequested begins the reason of the guard's own stop: vLLM is not
// restarted after it (status.FinalStop reads it).
const stopRequested = status.StopRequested

// finishRun: the keeper is gone. What outlived it (a process stuck in the
// kernel, as after a GPU fault, does not die at once; the tree kill can take
// up to killRounds × killWait) is killed off the loop, so the loop keeps
// turning (status, /livez, signals); settleRun goes on when that reports.
func (m *machine) finishRun() {
	c := m.r.child
	if m.sub.running() {
		// The tree went before the API server's exit was handled.
		m.r.end = endExited
	}
	m.disarm(tStopKill)
	m.disarm(tDrain)
	m.r.drainUntil = time.Time{}
	m.endProbing()
	m.r.prober.close()
	c.refresh()
	m.enter(subCleaning, m.stopReason(), nil)
	m.r.cleaningSince = m.now
	m.cleanUp(c)
}

// cleanup is what the kill of a run's leftovers reports.
type cleanup struct {
	outlived   []int              // processes that outlived the keeper
	unkillable []int              // of those, still alive after every kill round
	gpuAfter   []policy.GPUDevice // the GPUs' hardware state once the tree was gone
	// portHeld: for a run that was never ready, who holds its port now
	// that its tree is gone ("": the bind works, or not checked).
	portHeld string
	oomAfter int64 // the cgroup's OOM-kill count once the tree was gone (-1: unknown)
}

// cleaningStatus says, while the leftovers are being killed, which process
// does not die and where it is stuck.
func (m *machine) cleaningStatus() {
	left := m.r.child.lingering()
	if len(left) == 0 {
		return
	}
	for_ := m.now.Sub(m.r.cleaningSince).Round(time.Second)
	m.update(func(st *Status) {
		st.Reason = fmt.Sprintf("cleaning up the old vLLM: %s for %s (killed, waiting for the kernel to let it go; the next start waits for it)",
			lingeringText(left), for_)
	})
}

// settleRun: the whole tree is gone, or what is left was declared
// unkillable. Decide what comes next.
func (m *machine) settleRun(cl cleanup) {
	s := m.s
	c := m.r.child
	if len(cl.outlived) > 0 {
		s.log.Warn("vLLM processes outlived their keeper: killed them", zap.Ints("pids", cl.outlived))
	}
	if len(cl.unkillable) > 0 {
		s.log.Error("vLLM processes do not die after every kill round: declared unkillable (stuck in the kernel; a GPU fault or a driver problem: check dmesg and nvidia-smi)",
			zap.Ints("pids", cl.unkillable), zap.Duration("for", m.now.Sub(m.r.cleaningSince).Round(time.Second)))
	}
	m.unwatch()
	exit := c.exit()
	killedByGuard := m.r.end != endExited || m.r.hang != ""
	res := outcome{exit: exit, pid: c.pid(), phase: policy.PhaseStarting, hang: m.r.hang, killedByGuard: killedByGuard,
		lines: m.r.out.ring.snapshot(), uptime: m.now.Sub(m.r.startedAt), gpuAfter: cl.gpuAfter, unkillable: cl.unkillable}
	if m.r.ready {
		res.phase = policy.PhaseReady
	}
	// Any end the guard did not cause, after the kernel's OOM killer acted
	// in vLLM's cgroup: it mostly picks the biggest process, the EngineCore
	// or a worker, and the API server then exits by itself.
	res.hostOOM = !killedByGuard && m.r.oomBefore >= 0 && cl.oomAfter > m.r.oomBefore
	m.rel.pids, m.rel.base = c.seen(), m.r.baseline
	m.update(func(st *Status) { st.LogDropped = m.sink.dropped.Load(); st.PID = 0 })
	end := m.r.end
	m.r.child, m.rel.child = nil, c
	switch end {
	case endStop:
		m.finish(exitcode.OK, "stopped on request")
	case endRestart:
		s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: "restarting vLLM on request from " + m.r.peer})
		m.next()
	case endRestore:
		s.pol.OnRestore(m.now)
		s.savePolicy()
		r := s.pol.Current()
		s.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestore, Rung: &r,
			Reason: "stepped one rung up after a stable stretch"})
		m.next()
	default:
		if cl.portHeld != "" {
			m.portTaken(res, cl.portHeld)
			return
		}
		m.fail(res)
	}
}

// unwatch ends what watched the run whose tree is gone: its output, its
// tree for the GPU monitor and vLLM's other clients.
func (m *machine) unwatch() {
	s := m.s
	m.r.stdout.Close()
	m.r.stderr.Close()
	s.tree.Store(nil)
	if s.gpu != nil {
		s.gpu.SetTree(nil)
		s.gpu.SetLoading(false)
	}
}

// portTaken: vLLM ended before it was ready while another process holds
// its port (vLLM could not bind it, or the holder took it while vLLM
// loaded): neither vLLM's failure nor a configuration error, whatever
// vLLM printed. The death is recorded as it was read, not counted by the
// policy, and the guard waits for the port as before a launch: as long as
// it takes at a restart, port_wait at the guard's first start.
func (m *machine) portTaken(res outcome, holder string) {
	s := m.s
	_, v := m.classify(res)
	d := policy.Decision{Action: policy.ActionRestart, Rung: s.pol.Current(),
		Reason: fmt.Sprintf("vLLM's port is held by %s: waiting for it to be free, then starting vLLM again (not counted as a failure)", holder)}
	f := Failure{Time: m.now, PID: res.pid, Exit: res.exit.String(), ExitCode: res.exit.Code, Signal: res.exit.Signal,
		Phase: res.phase, Verdict: v, Decision: d, RungBefore: m.r.rung, Lines: res.lines, Uptime: res.uptime}
	m.update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	s.publish(events.Event{Kind: events.KindExited, Failure: &f, PID: res.pid})
	if m.stopAsked {
		m.finish(exitcode.OK, "stopped on request")
		return
	}
	if m.pw.since.IsZero() {
		m.pw = portWait{since: m.now, bounded: m.runN == 1 && !m.everReady}
	}
	m.next()
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
	gpuAfter      []policy.GPUDevice // NVML's word once the tree was gone (nil: none)
	unkillable    []int              // processes of the tree still alive after every kill round
}

// classify reads one death's evidence into a verdict.
func (m *machine) classify(res outcome) (policy.Exit, policy.Verdict) {
	s := m.s
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
	exit.GPU = m.gpuEvidenceFrom(res.gpuAfter)
	if exit.GPU != nil {
		exit.GPU.Unkillable = res.unkillable
	}
	return exit, policy.Classify(exit)
}

// fail classifies a death, asks the policy what next, publishes it, and
// moves on: give up, or wait for the memory, then back off.
func (m *machine) fail(res outcome) {
	s := m.s
	now := m.now
	exit, v := m.classify(res)
	d := s.pol.OnFailure(now, v)
	s.savePolicy()
	m.describeCost()
	f := Failure{Time: now, PID: res.pid, Exit: res.exit.String(), ExitCode: res.exit.Code, Signal: res.exit.Signal,
		Phase: res.phase, Verdict: v, Decision: d, RungBefore: m.r.rung, Lines: res.lines, MemFractions: exit.MemFractions, Uptime: res.uptime}
	m.update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	s.publish(events.Event{Kind: events.KindExited, Failure: &f, PID: res.pid})
	m.rel.decision = d
	if d.Action == policy.ActionGiveUp {
		m.giveUp(f)
		return
	}
	if m.stopAsked {
		m.finish(exitcode.OK, "stopped on request")
		return
	}
	if s.gpu != nil && res.pid != 0 {
		m.rel.until = m.now.Add(s.cfg.GPU.ReleaseTimeout.Duration)
		m.rel.killed = false
		m.enter(subReleasing, "waiting for the old vLLM's GPU memory to be released", nil)
		m.checkReleased()
		return
	}
	m.backoff()
}

// checkReleased reads NVML once, off the loop; onReleaseRead goes on:
// released → back off; not yet → read again at the next sample; after
// release_timeout, survivors of the old tree that still hold memory are
// killed (they would make the next start fail vLLM's free-memory check) and
// the wait starts once more.
func (m *machine) checkReleased() {
	gpu, pids, base := m.s.gpu, m.rel.pids, m.rel.base
	m.readGPU(func() gpuRead {
		released, held := gpu.Released(pids, base)
		return gpuRead{released: released, held: held}
	})
}

func (m *machine) onReleaseRead(r gpuRead) {
	s := m.s
	if r.released {
		m.backoff()
		return
	}
	now := m.now
	if now.Before(m.rel.until) {
		m.arm(tRelease, min(s.cfg.GPU.SampleInterval.Duration, m.rel.until.Sub(now)))
		return
	}
	if !m.rel.killed {
		m.rel.killed = true
		if m.killHolders(r.held) {
			m.rel.until = now.Add(s.cfg.GPU.ReleaseTimeout.Duration)
			m.arm(tRelease, s.cfg.GPU.SampleInterval.Duration)
			return
		}
	}
	s.log.Warn("GPU memory still held after release_timeout", zap.String("holders", holdersText(r.held)),
		zap.Duration("release_timeout", s.cfg.GPU.ReleaseTimeout.Duration))
	m.backoff()
}

// killHolders kills the holders that are still the very processes of the
// old tree (never a reused PID), and says whether it killed any.
func (m *machine) killHolders(held []Holder) bool {
	ours := map[int]bool{}
	for _, p := range m.rel.pids {
		ours[p] = true
	}
	killed := false
	for _, h := range held {
		if ours[h.PID] && m.rel.child != nil && m.rel.child.killIfOurs(h.PID) {
			m.s.log.Warn("killed a survivor of the old vLLM that still held GPU memory",
				zap.Int("pid", h.PID), zap.String("command", h.Command), zap.Uint64("bytes", h.Bytes))
			killed = true
		}
	}
	return killed
}

func (m *machine) backoff() {
	if m.stopAsked {
		m.finish(exitcode.OK, "stopped on request")
		return
	}
	d := m.rel.decision
	next := m.now.Add(d.Delay)
	m.enter(subBackoff, fmt.Sprintf("restarting in %s on rung %d: %s", d.Delay.Round(time.Millisecond), d.Rung.Index, d.Reason),
		func(st *Status) { st.NextStartAt, st.Rung = next, d.Rung })
	m.arm(tBackoff, d.Delay)
}

func (m *machine) giveUp(f Failure) {
	s := m.s
	code := f.Decision.ExitCode
	stay := s.cfg.Restart.OnGiveUp == "stay"
	if f.Verdict.Cause == policy.CauseGPUFault && code == exitcode.GPUFault {
		stay = s.cfg.GPU.OnGPUFault == "stay" // [gpu] on_gpu_fault decides for a GPU that needs a reset
	}
	to := subFailed // "stay": keep answering status until asked to stop
	if !stay || m.stopAsked {
		to, m.code = subGaveUp, code
	}
	m.enter(to, "gave up: "+f.Decision.Reason, func(st *Status) { st.PID, st.ExitCode = 0, code })
	s.log.Error("gave up on vLLM", zap.String("cause", string(f.Verdict.Cause)), zap.String("reason", f.Decision.Reason),
		zap.Int("exit_code", code))
}

// finish ends Run: stopped, with code.
func (m *machine) finish(code int, reason string) {
	for k := range m.timers.slot {
		m.disarm(timerKind(k))
	}
	m.code = code
	m.enter(subStopped, reason, func(st *Status) { st.PID, st.ExitCode, st.NextStartAt = 0, code, time.Time{} })
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

// shutdownTimeout is vLLM's --shutdown-timeout as its parser reads the
// command line in force (internal/vllmargs: every spelling, a --config
// file, the extra arguments), 0 when absent.
func (s *Supervisor) shutdownTimeout() time.Duration { return s.args.ShutdownTimeout }
