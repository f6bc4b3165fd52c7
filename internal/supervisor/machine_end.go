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
func (m *core) hung(reason string) {
	m.r.hang = reason
	m.endRun(endExited)
}

// endRun starts ending the run in progress: SIGTERM, then SIGKILL after
// stop_timeout, unless the tree is already gone.
func (m *core) endRun(why ending) {
	if !m.sub.running() {
		return
	}
	m.r.end = why
	m.endProbing()
	reason := m.stopReason()
	if m.facts.treeGone {
		m.enter(subStopTerm, reason, nil) // evTreeGone is on its way
		return
	}
	if m.r.hang != "" || m.r.gpuKilled {
		// vLLM is wedged, or its GPU is gone: a drain would only wait on
		// requests that never end.
		if m.r.hang != "" {
			m.log().Warn("vLLM hung: killing its process tree", zap.String("reason", m.r.hang))
		}
		m.do(fxKill{})
		m.enter(subStopKill, reason, nil)
		return
	}
	if m.facts.apiGone {
		// The API server is gone (the keeper cleans up the rest): nothing
		// drains any more; give the keeper its grace, then kill.
		m.arm(tStopKill, m.cfg.VLLM.StopTimeout.Duration)
		m.enter(subStopTerm, reason, nil)
		return
	}
	if m.drainFirst() {
		return
	}
	m.do(fxStop{})
	m.arm(tStopKill, m.stopTimeout())
	m.enter(subStopTerm, reason, nil)
}

// drainFirst: a planned stop (an operator's stop or restart, a restore)
// with vLLM's --shutdown-timeout and the guard's proxy in front waits for
// the requests in flight through the proxy to end before vLLM gets
// SIGTERM, for at most that timeout. vLLM 0.32.0 (seen on its CPU build)
// cuts the requests in flight a few seconds into its own drain: its
// process manager's SIGTERM reaches the workers. New requests wait in the
// proxy meanwhile (the guard no longer says ready). True when draining.
func (m *core) drainFirst() bool {
	if !m.ports.inFlight || m.facts.shutdownTimeout <= 0 || m.r.end == endExited || m.facts.inFlight == 0 {
		return false
	}
	m.r.drainUntil = m.now.Add(m.facts.shutdownTimeout)
	n := m.facts.inFlight
	m.log().Info("waiting for the requests in flight through the proxy before vLLM gets SIGTERM",
		zap.Int("requests", n), zap.Duration("at_most", m.facts.shutdownTimeout))
	m.enter(subDraining, fmt.Sprintf("%s: waiting for %d requests in flight through the proxy (at most %s)", m.stopReason(), n, m.facts.shutdownTimeout), nil)
	m.arm(tDrain, drainPoll)
	return true
}

// drainPoll is how often the proxy's count is looked at while draining.
const drainPoll = 50 * time.Millisecond

// drainStep: the proxy's requests ended (or the time is up): now SIGTERM.
func (m *core) drainStep() {
	if n := m.facts.inFlight; n > 0 && m.now.Before(m.r.drainUntil) {
		m.arm(tDrain, drainPoll)
		return
	}
	// The whole stop stays within the effective stop timeout that `check`
	// prints (the units' TimeoutStopSec is set from it), leaving vLLM at
	// least 10 s to stop its engine.
	left := max(m.stopTimeout()-(m.facts.shutdownTimeout-m.r.drainUntil.Sub(m.now)), 10*time.Second)
	m.r.drainUntil = time.Time{}
	if m.facts.treeGone {
		return
	}
	m.enter(subStopTerm, m.stopReason(), nil)
	m.do(fxStop{})
	m.arm(tStopKill, left)
}

func (m *core) stopReason() string {
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
func (m *core) finishRun() {
	if m.sub.running() {
		// The tree went before the API server's exit was handled.
		m.r.end = endExited
	}
	m.disarm(tStopKill)
	m.disarm(tDrain)
	m.r.drainUntil = time.Time{}
	m.endProbing()
	m.r.gone = true
	m.enter(subCleaning, m.stopReason(), nil)
	m.r.cleaningSince = m.now
	// A start that failed: its port is tried once the tree is gone (a
	// process of its own that does not die may hold it).
	m.do(fxFinishRun{checkPort: !m.r.ready && m.r.end == endExited})
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
	// How the run ended, what it printed and every process its tree had,
	// read by the executor once the tree is gone.
	exit  exitInfo
	pid   int
	lines []policy.Line
	seen  []int
}

// cleaningStatus says, while the leftovers are being killed, which process
// does not die and where it is stuck.
func (m *core) cleaningStatus() {
	left := m.facts.lingering
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
func (m *core) settleRun(cl cleanup) {
	if len(cl.outlived) > 0 {
		m.log().Warn("vLLM processes outlived their keeper: killed them", zap.Ints("pids", cl.outlived))
	}
	if len(cl.unkillable) > 0 {
		m.log().Error("vLLM processes do not die after every kill round: declared unkillable (stuck in the kernel; a GPU fault or a driver problem: check dmesg and nvidia-smi)",
			zap.Ints("pids", cl.unkillable), zap.Duration("for", m.now.Sub(m.r.cleaningSince).Round(time.Second)))
	}
	killedByGuard := m.r.end != endExited || m.r.hang != ""
	res := outcome{exit: cl.exit, pid: cl.pid, phase: policy.PhaseStarting, hang: m.r.hang, killedByGuard: killedByGuard,
		lines: cl.lines, uptime: m.now.Sub(m.r.startedAt), gpuAfter: cl.gpuAfter, unkillable: cl.unkillable}
	if m.r.ready {
		res.phase = policy.PhaseReady
	}
	// Any end the guard did not cause, after the kernel's OOM killer acted
	// in vLLM's cgroup: it mostly picks the biggest process, the EngineCore
	// or a worker, and the API server then exits by itself.
	res.hostOOM = !killedByGuard && m.r.oomBefore >= 0 && cl.oomAfter > m.r.oomBefore
	m.rel.pids, m.rel.base = cl.seen, m.r.baseline
	dropped := m.facts.dropped
	m.update(func(st *Status) { st.LogDropped = dropped; st.PID = 0 })
	switch m.r.end {
	case endStop:
		m.finish(exitcode.OK, "stopped on request")
	case endRestart:
		m.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: "restarting vLLM on request from " + m.r.peer})
		m.next()
	case endRestore:
		m.do(fxRestore{}) // evRestored goes on
	default:
		m.rel.portHeld = cl.portHeld
		m.fail(res)
	}
}

// onRestored: the policy stepped one rung up; start on it.
func (m *core) onRestored(r policy.Rung) {
	m.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestore, Rung: &r,
		Reason: "stepped one rung up after a stable stretch"})
	m.next()
}

// portTaken: vLLM ended before it was ready while another process holds
// its port (vLLM could not bind it, or the holder took it while vLLM
// loaded): neither vLLM's failure nor a configuration error, whatever
// vLLM printed. The death is recorded as it was read, not counted by the
// policy, and the guard waits for the port as before a launch: as long as
// it takes at a restart, port_wait at the guard's first start.
func (m *core) portTaken(res outcome, holder string, v policy.Verdict) {
	d := policy.Decision{Action: policy.ActionRestart, Rung: m.facts.rung,
		Reason: fmt.Sprintf("vLLM's port is held by %s: waiting for it to be free, then starting vLLM again (not counted as a failure)", holder)}
	f := Failure{Time: m.now, PID: res.pid, Exit: res.exit.String(), ExitCode: res.exit.Code, Signal: res.exit.Signal,
		Phase: res.phase, Verdict: v, Decision: d, RungBefore: m.r.rung, Lines: res.lines, Uptime: res.uptime}
	m.update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	m.publish(events.Event{Kind: events.KindExited, Failure: &f, PID: res.pid})
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

// classify asks the classifier to read one death's evidence into a
// verdict (the executor adds the memory samples and the critical
// fraction); onClassified goes on.
func (m *core) classify(res outcome) {
	exit := policy.Exit{
		Lines:         res.lines,
		ExitCode:      res.exit.Code,
		Signal:        res.exit.Signal,
		SignalByGuard: res.killedByGuard,
		Hang:          res.hang,
		HostOOMKill:   res.hostOOM,
		Phase:         res.phase,
		StartFailure:  res.exit.StartFailure,
		GuardFailure:  res.exit.GuardFailure,
	}
	exit.GPU = m.gpuEvidenceFrom(res.gpuAfter)
	if exit.GPU != nil {
		exit.GPU.Unkillable = res.unkillable
	}
	m.do(fxClassify{exit})
}

// onClassified: the verdict on the death in m.rel.res. A start that
// failed while another process holds its port is recorded, not counted;
// any other death goes to the policy (onDecided goes on).
func (m *core) onClassified(exit policy.Exit, v policy.Verdict) {
	if holder := m.rel.portHeld; holder != "" {
		m.rel.portHeld = ""
		m.portTaken(m.rel.res, holder, v)
		return
	}
	m.rel.exit, m.rel.verdict = exit, v
	m.do(fxDecide{v})
}

// fail classifies a death (onClassified), asks the policy what next
// (onDecided), publishes it, and moves on: give up, or wait for the
// memory, then back off.
func (m *core) fail(res outcome) {
	m.rel.res = res
	m.classify(res)
}

// onDecided: the policy's decision d after the death in m.rel.res.
func (m *core) onDecided(d policy.Decision) {
	now, res, exit, v := m.now, m.rel.res, m.rel.exit, m.rel.verdict
	f := Failure{Time: now, PID: res.pid, Exit: res.exit.String(), ExitCode: res.exit.Code, Signal: res.exit.Signal,
		Phase: res.phase, Verdict: v, Decision: d, RungBefore: m.r.rung, Lines: res.lines, MemFractions: exit.MemFractions, Uptime: res.uptime}
	m.update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	m.publish(events.Event{Kind: events.KindExited, Failure: &f, PID: res.pid})
	m.rel.decision = d
	if d.Action == policy.ActionGiveUp {
		m.giveUp(f)
		return
	}
	if m.stopAsked {
		m.finish(exitcode.OK, "stopped on request")
		return
	}
	if m.ports.gpu && res.pid != 0 {
		m.rel.until = m.now.Add(m.cfg.GPU.ReleaseTimeout.Duration)
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
func (m *core) checkReleased() { m.do(fxReadRelease{m.rel.pids, m.rel.base}) }

func (m *core) onReleaseRead(r gpuRead) {
	if r.released {
		m.backoff()
		return
	}
	now := m.now
	if now.Before(m.rel.until) {
		m.arm(tRelease, min(m.cfg.GPU.SampleInterval.Duration, m.rel.until.Sub(now)))
		return
	}
	if !m.rel.killed {
		m.rel.killed, m.rel.held = true, r.held
		m.killHolders(r.held)
		return
	}
	m.heldAfterAll(r.held)
}

// onKilledHolders: survivors of the old tree that held GPU memory were
// killed: wait once more; none was: back off.
func (m *core) onKilledHolders(killed bool) {
	if killed {
		m.rel.until = m.now.Add(m.cfg.GPU.ReleaseTimeout.Duration)
		m.arm(tRelease, m.cfg.GPU.SampleInterval.Duration)
		return
	}
	m.heldAfterAll(m.rel.held)
}

func (m *core) heldAfterAll(held []Holder) {
	m.log().Warn("GPU memory still held after release_timeout", zap.String("holders", holdersText(held)),
		zap.Duration("release_timeout", m.cfg.GPU.ReleaseTimeout.Duration))
	m.backoff()
}

// killHolders asks for the holders that are processes of the old tree
// to be killed, if they are still the very processes (never a reused
// PID); evKilledHolders says whether any was.
func (m *core) killHolders(held []Holder) {
	ours := map[int]bool{}
	for _, p := range m.rel.pids {
		ours[p] = true
	}
	var kill []Holder
	for _, h := range held {
		if ours[h.PID] {
			kill = append(kill, h)
		}
	}
	m.do(fxKillHolders{kill})
}

func (m *core) backoff() {
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

func (m *core) giveUp(f Failure) {
	code := f.Decision.ExitCode
	stay := m.cfg.Restart.OnGiveUp == "stay"
	if f.Verdict.Cause == policy.CauseGPUFault && code == exitcode.GPUFault {
		stay = m.cfg.GPU.OnGPUFault == "stay" // [gpu] on_gpu_fault decides for a GPU that needs a reset
	}
	to := subFailed // "stay": keep answering status until asked to stop
	if !stay || m.stopAsked {
		to, m.code = subGaveUp, code
	}
	m.enter(to, "gave up: "+f.Decision.Reason, func(st *Status) { st.PID, st.ExitCode = 0, code })
	m.log().Error("gave up on vLLM", zap.String("cause", string(f.Verdict.Cause)), zap.String("reason", f.Decision.Reason),
		zap.Int("exit_code", code))
}

// finish ends Run: stopped, with code.
func (m *core) finish(code int, reason string) {
	for k := range timerKinds {
		m.disarm(k)
	}
	m.code = code
	m.enter(subStopped, reason, func(st *Status) { st.PID, st.ExitCode, st.NextStartAt = 0, code, time.Time{} })
}

// stopTimeout is how long a graceful stop may take before the tree is
// killed: stop_timeout, or vLLM's own --shutdown-timeout (its drain) plus
// 10 s for it to stop its engine, whichever is longer.
func (m *core) stopTimeout() time.Duration {
	return EffectiveStopTimeout(m.cfg.VLLM.StopTimeout.Duration, m.facts.shutdownTimeout)
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

// stopTimeout is the effective stop timeout of the command line in force.
func (s *Supervisor) stopTimeout() time.Duration {
	return EffectiveStopTimeout(s.cfg.VLLM.StopTimeout.Duration, s.shutdownTimeout())
}
