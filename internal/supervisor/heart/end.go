package heart

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Ending a run: the stop (a drain, or a kill for a hang), the tree gone,
// the failure classified and decided, the memory release, backoff, giving up.

// Hung ends the run as a hang.
func (m *Core) Hung(reason string) {
	m.R.Hang = reason
	m.EndRun(EndExited)
}

// EndRun starts ending the run in progress: SIGTERM, then SIGKILL after
// stop_timeout, unless the tree is already gone.
func (m *Core) EndRun(why Ending) {
	if !m.Sub.Running() {
		return
	}
	m.R.End = why
	m.EndProbing()
	reason := m.StopReason()
	if m.Facts.TreeGone {
		m.Enter(SubStopTerm, reason, nil) // evTreeGone is on its way
		return
	}
	if m.R.Hang != "" || m.R.GPUKilled {
		// vLLM is wedged, or its GPU is gone: a drain would only wait on
		// requests that never end.
		if m.R.Hang != "" {
			m.Log().Warn("vLLM hung: killing its process tree", zap.String("reason", m.R.Hang))
		}
		m.Do(FxKill{})
		m.Enter(SubStopKill, reason, nil)
		return
	}
	if m.Facts.APIGone {
		// The API server is gone (the keeper cleans up the rest): nothing
		// drains any more; give the keeper its grace, then kill.
		m.Arm(TStopKill, m.Cfg.VLLM.StopTimeout.Duration)
		m.Enter(SubStopTerm, reason, nil)
		return
	}
	if m.DrainFirst() {
		return
	}
	m.Do(FxStop{})
	m.Arm(TStopKill, m.StopTimeout())
	m.Enter(SubStopTerm, reason, nil)
}

// DrainFirst: a planned stop (an operator's stop or restart, a restore)
// with vLLM's --shutdown-timeout and the guard's proxy in front waits for
// the requests in flight through the proxy to end before vLLM gets
// SIGTERM, for at most that timeout. vLLM 0.32.0 (seen on its CPU build)
// cuts the requests in flight a few seconds into its own drain: its
// process manager's SIGTERM reaches the workers. New requests wait in the
// proxy meanwhile (the guard no longer says ready). True when draining.
func (m *Core) DrainFirst() bool {
	if !m.Ports.InFlight || m.Facts.ShutdownTimeout <= 0 || m.R.End == EndExited || m.Facts.InFlight == 0 {
		return false
	}
	m.R.DrainUntil = m.Now.Add(m.Facts.ShutdownTimeout)
	n := m.Facts.InFlight
	m.Log().Info("waiting for the requests in flight through the proxy before vLLM gets SIGTERM",
		zap.Int("requests", n), zap.Duration("at_most", m.Facts.ShutdownTimeout))
	m.Enter(SubDraining, fmt.Sprintf("%s: waiting for %d requests in flight through the proxy (at most %s)", m.StopReason(), n, m.Facts.ShutdownTimeout), nil)
	m.Arm(TDrain, DrainPoll)
	return true
}

// DrainPoll is how often the proxy's count is looked at while draining.
const DrainPoll = 50 * time.Millisecond

// DrainStep: the proxy's requests ended (or the time is up): now SIGTERM.
func (m *Core) DrainStep() {
	if n := m.Facts.InFlight; n > 0 && m.Now.Before(m.R.DrainUntil) {
		m.Arm(TDrain, DrainPoll)
		return
	}
	// The whole stop stays within the effective stop timeout that `check`
	// prints (the units' TimeoutStopSec is set from it), leaving vLLM at
	// least 10 s to stop its engine.
	left := max(m.StopTimeout()-(m.Facts.ShutdownTimeout-m.R.DrainUntil.Sub(m.Now)), 10*time.Second)
	m.R.DrainUntil = time.Time{}
	if m.Facts.TreeGone {
		return
	}
	m.Enter(SubStopTerm, m.StopReason(), nil)
	m.Do(FxStop{})
	m.Arm(TStopKill, left)
}

func (m *Core) StopReason() string {
	switch {
	case m.R.Hang != "":
		return "vLLM hung: " + m.R.Hang
	case m.R.GPUKilled:
		return "the GPU failed under vLLM: killing its process tree"
	case m.R.End == EndRestart && m.R.Why != "":
		return "restarting: " + m.R.Why
	case m.R.End == EndRestart:
		return "restart requested"
	case m.R.End == EndRestore:
		return "restoring one rung up after a stable stretch"
	case m.R.End == EndExited:
		return "vLLM exited: cleaning up its process tree"
	default:
		return StopRequested
	}
}

// StopRequested begins the reason of the guard's own stop: vLLM is not
// restarted after it (status.FinalStop reads it).
const StopRequested = status.StopRequested

// FinishRun: the keeper is gone. What outlived it (a process stuck in the
// kernel, as after a GPU fault, does not die at once; the tree kill can take
// up to killRounds × killWait) is killed off the loop, so the loop keeps
// turning (status, /livez, signals); settleRun goes on when that reports.
func (m *Core) FinishRun() {
	if m.Sub.Running() {
		// The tree went before the API server's exit was handled.
		m.R.End = EndExited
	}
	m.Disarm(TStopKill)
	m.Disarm(TDrain)
	m.R.DrainUntil = time.Time{}
	m.EndProbing()
	m.R.Gone = true
	m.Enter(SubCleaning, m.StopReason(), nil)
	m.R.CleaningSince = m.Now
	// A start that failed: its port is tried once the tree is gone (a
	// process of its own that does not die may hold it).
	m.Do(FxFinishRun{CheckPort: !m.R.Ready && m.R.End == EndExited})
}

// Cleanup is what the kill of a run's leftovers reports.
type Cleanup struct {
	Outlived   []int             // processes that outlived the keeper
	Unkillable []int             // of those, still alive after every kill round
	GPUAfter   []cause.GPUDevice // the GPUs' hardware state once the tree was gone
	// PortHeld: for a run that was never ready, who holds its port now
	// that its tree is gone ("": the bind works, or not checked).
	PortHeld string
	OOMAfter int64 // the cgroup's OOM-kill count once the tree was gone (-1: unknown)
	// How the run ended, what it printed and every process its tree had,
	// read by the executor once the tree is gone.
	Exit  ExitInfo
	PID   int
	Lines []cause.Line
	Seen  []int
}

// CleaningStatus says, while the leftovers are being killed, which process
// does not die and where it is stuck.
func (m *Core) CleaningStatus() {
	left := m.Facts.Lingering
	if len(left) == 0 {
		return
	}
	for_ := m.Now.Sub(m.R.CleaningSince).Round(time.Second)
	m.Update(func(st *Status) {
		st.Reason = fmt.Sprintf("cleaning up the old vLLM: %s for %s (killed, waiting for the kernel to let it go; the next start waits for it)",
			LingeringText(left), for_)
	})
}

// SettleRun: the whole tree is gone, or what is left was declared
// unkillable. Decide what comes next.
func (m *Core) SettleRun(cl Cleanup) {
	if len(cl.Outlived) > 0 {
		m.Log().Warn("vLLM processes outlived their keeper: killed them", zap.Ints("pids", cl.Outlived))
	}
	if len(cl.Unkillable) > 0 {
		m.Log().Error("vLLM processes do not die after every kill round: declared unkillable (stuck in the kernel; a GPU fault or a driver problem: check dmesg and nvidia-smi)",
			zap.Ints("pids", cl.Unkillable), zap.Duration("for", m.Now.Sub(m.R.CleaningSince).Round(time.Second)))
	}
	killedByGuard := m.R.End != EndExited || m.R.Hang != ""
	res := Outcome{Exit: cl.Exit, PID: cl.PID, Phase: cause.PhaseStarting, Hang: m.R.Hang, KilledByGuard: killedByGuard,
		Lines: cl.Lines, Uptime: m.Now.Sub(m.R.StartedAt), GPUAfter: cl.GPUAfter, Unkillable: cl.Unkillable}
	if m.R.Ready {
		res.Phase = cause.PhaseReady
	}
	// Any end the guard did not cause, after the kernel's OOM killer acted
	// in vLLM's cgroup: it mostly picks the biggest process, the EngineCore
	// or a worker, and the API server then exits by itself.
	res.HostOOM = !killedByGuard && m.R.OOMBefore >= 0 && cl.OOMAfter > m.R.OOMBefore
	m.Rel.PIDs, m.Rel.Base = cl.Seen, m.R.Baseline
	dropped := m.Facts.Dropped
	m.Update(func(st *Status) { st.LogDropped = dropped; st.PID = 0 })
	switch m.R.End {
	case EndStop:
		m.Finish(exitcode.OK, "stopped on request")
	case EndRestart:
		m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestart, Reason: RestartText(m.R.Peer, m.R.Why)})
		m.Next()
	case EndRestore:
		m.Do(FxRestore{}) // evRestored goes on
	default:
		m.Rel.PortHeld = cl.PortHeld
		m.Fail(res)
	}
}

// OnRestored: the policy stepped one rung up; start on it.
func (m *Core) OnRestored(r policy.Rung) {
	m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionRestore, Rung: &r,
		Reason: "stepped one rung up after a stable stretch"})
	m.Next()
}

// PortTaken: vLLM ended before it was ready while another process holds
// its port (vLLM could not bind it, or the holder took it while vLLM
// loaded): neither vLLM's failure nor a configuration error, whatever
// vLLM printed. The death is recorded as it was read, not counted by the
// policy, and the guard waits for the port as before a launch: as long as
// it takes at a restart, port_wait at the guard's first start.
func (m *Core) PortTaken(res Outcome, holder string, v cause.Verdict) {
	d := policy.Decision{Action: policy.ActionRestart, Rung: m.Facts.Rung,
		Reason: fmt.Sprintf("vLLM's port is held by %s: waiting for it to be free, then starting vLLM again (not counted as a failure)", holder)}
	f := Failure{Time: m.Now, PID: res.PID, Exit: res.Exit.String(), ExitCode: res.Exit.Code, Signal: res.Exit.Signal,
		Phase: res.Phase, Verdict: v, Decision: d, RungBefore: m.R.Rung, Lines: res.Lines, Uptime: res.Uptime}
	m.Update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	m.Publish(events.Event{Kind: events.KindExited, Failure: &f, PID: res.PID})
	if m.StopAsked {
		m.Finish(exitcode.OK, "stopped on request")
		return
	}
	if m.Pw.Since.IsZero() {
		m.Pw = PortWait{Since: m.Now, Bounded: m.RunN == 1 && !m.EverReady}
	}
	m.Next()
}

// Outcome is how one run of vLLM ended, as the classifier needs it.
type Outcome struct {
	Exit          ExitInfo
	PID           int
	Phase         cause.Phase
	Hang          string
	KilledByGuard bool
	HostOOM       bool
	Lines         []cause.Line
	Uptime        time.Duration
	GPUAfter      []cause.GPUDevice // NVML's word once the tree was gone (nil: none)
	Unkillable    []int             // processes of the tree still alive after every kill round
}

// Classify asks the classifier to read one death's evidence into a
// verdict (the executor adds the memory samples and the critical
// fraction); onClassified goes on.
func (m *Core) Classify(res Outcome) {
	exit := cause.Exit{
		Lines:         res.Lines,
		ExitCode:      res.Exit.Code,
		Signal:        res.Exit.Signal,
		SignalByGuard: res.KilledByGuard,
		Hang:          res.Hang,
		HostOOMKill:   res.HostOOM,
		Group:         m.R.Group,
		Phase:         res.Phase,
		StartFailure:  res.Exit.StartFailure,
		GuardFailure:  res.Exit.GuardFailure,
	}
	exit.GPU = m.GPUEvidenceFrom(res.GPUAfter)
	if exit.GPU != nil {
		exit.GPU.Unkillable = res.Unkillable
	}
	m.Do(FxClassify{exit})
}

// OnClassified: the verdict on the death in m.rel.res. A start that
// failed while another process holds its port is recorded, not counted;
// any other death goes to the policy (onDecided goes on).
func (m *Core) OnClassified(exit cause.Exit, v cause.Verdict) {
	if holder := m.Rel.PortHeld; holder != "" {
		m.Rel.PortHeld = ""
		m.PortTaken(m.Rel.Res, holder, v)
		return
	}
	if v.BindFailed() && (m.EverReady || m.RunN > 1) {
		// At a restart vLLM's port served before: a process that held it
		// while vLLM bound, and let go before the guard looked, is a port
		// to wait for, not a configuration to fix (issue 41).
		m.PortTaken(m.Rel.Res, "another process (it held the port while vLLM bound it, and let it go)", v)
		return
	}
	m.Rel.Exit, m.Rel.Verdict = exit, v
	if d, ok := m.FollowerDecision(v); ok {
		m.OnDecided(d)
		return
	}
	m.Do(FxDecide{v})
}

// Fail classifies a death (onClassified), asks the policy what next
// (onDecided), publishes it, and moves on: give up, or wait for the
// memory, then back off.
func (m *Core) Fail(res Outcome) {
	m.Rel.Res = res
	m.Classify(res)
}

// OnDecided: the policy's decision d after the death in m.rel.res.
func (m *Core) OnDecided(d policy.Decision) {
	now, res, exit, v := m.Now, m.Rel.Res, m.Rel.Exit, m.Rel.Verdict
	f := Failure{Time: now, PID: res.PID, Exit: res.Exit.String(), ExitCode: res.Exit.Code, Signal: res.Exit.Signal,
		Phase: res.Phase, Verdict: v, Decision: d, RungBefore: m.R.Rung, Lines: res.Lines, MemFractions: exit.MemFractions, Uptime: res.Uptime}
	m.Update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	m.Publish(events.Event{Kind: events.KindExited, Failure: &f, PID: res.PID})
	m.Rel.Decision = d
	if d.Action == policy.ActionGiveUp {
		m.GiveUp(f)
		return
	}
	if m.StopAsked {
		m.Finish(exitcode.OK, "stopped on request")
		return
	}
	if m.Ports.GPU && res.PID != 0 {
		m.Rel.Until = m.Now.Add(m.Cfg.GPU.ReleaseTimeout.Duration)
		m.Rel.Killed = false
		m.Enter(SubReleasing, "waiting for the old vLLM's GPU memory to be released", nil)
		m.CheckReleased()
		return
	}
	m.Backoff()
}

// CheckReleased reads NVML once, off the loop; onReleaseRead goes on:
// released → back off; not yet → read again at the next sample; after
// release_timeout, survivors of the old tree that still hold memory are
// killed (they would make the next start fail vLLM's free-memory check) and
// the wait starts once more.
func (m *Core) CheckReleased() { m.Do(FxReadRelease{m.Rel.PIDs, m.Rel.Base}) }

func (m *Core) OnReleaseRead(r GPURead) {
	if r.Released {
		m.Backoff()
		return
	}
	now := m.Now
	if now.Before(m.Rel.Until) {
		m.Arm(TRelease, min(m.Cfg.GPU.SampleInterval.Duration, m.Rel.Until.Sub(now)))
		return
	}
	if !m.Rel.Killed {
		m.Rel.Killed, m.Rel.Held = true, r.Held
		m.KillHolders(r.Held)
		return
	}
	m.HeldAfterAll(r.Held)
}

// OnKilledHolders: survivors of the old tree that held GPU memory were
// killed: wait once more; none was: back off.
func (m *Core) OnKilledHolders(killed bool) {
	if killed {
		m.Rel.Until = m.Now.Add(m.Cfg.GPU.ReleaseTimeout.Duration)
		m.Arm(TRelease, m.Cfg.GPU.SampleInterval.Duration)
		return
	}
	m.HeldAfterAll(m.Rel.Held)
}

func (m *Core) HeldAfterAll(held []Holder) {
	m.Log().Warn("GPU memory still held after release_timeout", zap.String("holders", HoldersText(held)),
		zap.Duration("release_timeout", m.Cfg.GPU.ReleaseTimeout.Duration))
	m.Backoff()
}

// KillHolders asks for the holders that are processes of the old tree
// to be killed, if they are still the very processes (never a reused
// PID); evKilledHolders says whether any was.
func (m *Core) KillHolders(held []Holder) {
	ours := map[int]bool{}
	for _, p := range m.Rel.PIDs {
		ours[p] = true
	}
	var kill []Holder
	for _, h := range held {
		if ours[h.PID] {
			kill = append(kill, h)
		}
	}
	m.Do(FxKillHolders{kill})
}

func (m *Core) Backoff() {
	if m.StopAsked {
		m.Finish(exitcode.OK, "stopped on request")
		return
	}
	d := m.Rel.Decision
	next := m.Now.Add(d.Delay)
	m.Enter(SubBackoff, fmt.Sprintf("restarting in %s on rung %d: %s", d.Delay.Round(time.Millisecond), d.Rung.Index, d.Reason),
		func(st *Status) { st.NextStartAt, st.Rung = next, d.Rung })
	m.Arm(TBackoff, d.Delay)
}

func (m *Core) GiveUp(f Failure) {
	code := f.Decision.ExitCode
	stay := m.Cfg.Restart.OnGiveUp == "stay"
	if f.Verdict.Cause == cause.CauseGPUFault && code == exitcode.GPUFault {
		stay = m.Cfg.GPU.OnGPUFault == "stay" // [gpu] on_gpu_fault decides for a GPU that needs a reset
	}
	to := SubFailed // "stay": keep answering status until asked to stop
	if !stay || m.StopAsked {
		to, m.Code = SubGaveUp, code
	}
	m.Enter(to, "gave up: "+f.Decision.Reason, func(st *Status) { st.PID, st.ExitCode = 0, code })
	m.Log().Error("gave up on vLLM", zap.String("cause", string(f.Verdict.Cause)), zap.String("reason", f.Decision.Reason),
		zap.Int("exit_code", code))
}

// Finish ends Run: stopped, with code.
func (m *Core) Finish(code int, reason string) {
	for k := range TimerKinds {
		m.Disarm(k)
	}
	m.Code = code
	m.Enter(SubStopped, reason, func(st *Status) { st.PID, st.ExitCode, st.NextStartAt = 0, code, time.Time{} })
}

// StopTimeout is how long a graceful stop may take before the tree is
// killed: stop_timeout, or vLLM's own --shutdown-timeout (its drain) plus
// 10 s for it to stop its engine, whichever is longer.
func (m *Core) StopTimeout() time.Duration {
	return EffectiveStopTimeout(m.Cfg.VLLM.StopTimeout.Duration, m.Facts.ShutdownTimeout)
}

// EffectiveStopTimeout is max(stop_timeout, --shutdown-timeout + 10 s)
// when vLLM is given a shutdown timeout (0 when not).
func EffectiveStopTimeout(stopTimeout, vllmShutdown time.Duration) time.Duration {
	if vllmShutdown <= 0 {
		return stopTimeout
	}
	return max(stopTimeout, vllmShutdown+10*time.Second)
}
