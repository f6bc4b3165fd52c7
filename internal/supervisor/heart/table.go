package heart

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

// The machine's table: for each sub-state, what each event does. A cell
// names what it does in the operator's words (docs/design.md's table of
// cells is this one: TestDesignCellsAreTheCode) and does it; an empty
// cell ignores the event. Operators' reload and reset_profile are
// answered alike in every sub-state (onRequest), so they are no column.

// DecisionTimer: the timers whose firing decides something (a verdict, a
// kill, a start); the others are periodic samples (the readiness poll,
// liveness, the cost model, the NVML reads while waiting, the drain's
// look at the proxy, a fast retry of a refused probe). A sub-state arms at
// most one decision timer: each wait that decides is a sub-state of its
// own (TestOneDecisionTimerPerSubState).
var DecisionTimer = [TimerKinds]bool{TDying: true, TExiting: true, TStopKill: true, TBackoff: true, TPortRetry: true}

// Cell is one (sub-state, event) of the table.
type Cell struct {
	Says string
	Do   func(m *Core, e Event)
}

var EvNames = [EvKinds]string{
	EvBegin: "Run begins", EvAPIGone: "API server exits", EvTreeGone: "tree gone", EvStartupComplete: "startup line",
	EvProgress: "load phase", EvProbe: "probe answer", EvCleaned: "cleaned", EvGPURead: "NVML read", EvPortRead: "trial bind",
	EvStop: "stop", EvKill: "second stop signal", EvRestart: "operator restart", EvHeartbeat: "heartbeat", EvIORead: "disk I/O read", EvOOMRead: "OOM count read",
	EvLaunched: "launched", EvClassified: "classified", EvDecided: "decided", EvRestored: "restored", EvRestoreDue: "restore due?",
	EvRung: "rung", EvKilledHolders: "holders killed",
	EvTimer + EvKind(TPoll): "poll timer", EvTimer + EvKind(TLive): "liveness timer", EvTimer + EvKind(TCost): "cost timer",
	EvTimer + EvKind(TDying): "engine-dead timer", EvTimer + EvKind(TExiting): "exit timer", EvTimer + EvKind(TStopKill): "stop timer",
	EvTimer + EvKind(TRelease): "release timer", EvTimer + EvKind(TBackoff): "backoff timer", EvTimer + EvKind(TFreeMemory): "sample timer",
	EvTimer + EvKind(TFastRetry): "fast-retry timer", EvTimer + EvKind(TDrain): "drain timer", EvTimer + EvKind(TPortRetry): "port-retry timer",
}

func (k EvKind) String() string { return EvNames[k] }

// The cells shared by several sub-states.
var (
	CellFreeRead = Cell{"room → `check_port`; no room or a GPU needing a reset → `wait_gpu`", func(m *Core, e Event) {
		m.OnFreeRead(e.GPU) // (the executor drops all but the newest read's answer)
	}}
	CellPortRead = Cell{"free → `starting` (launch); held → `wait_port`; held past port_wait at the first start → `starting`, failed as a configuration error", func(m *Core, e Event) {
		m.OnPortRead(e.Holder)
	}}
	CellStopWaiting = Cell{"→ `stopped`", func(m *Core, e Event) {
		m.StopAsked = true
		m.SayStop()
		m.Finish(exitcode.OK, "stopped on request")
	}}
	CellStopRunning   = Cell{"SIGTERM (or a drain first) → `stop_sigterm` / `draining`", func(m *Core, e Event) { m.StopAsked = true; m.SayStop(); m.EndRun(EndStop) }}
	CellStopEnding    = Cell{"noted: no restart after this end (a failure is still recorded)", func(m *Core, e Event) { m.StopAsked = true; m.SayStop(); m.StopWhileEnding() }}
	CellRestartRun    = Cell{"SIGTERM, then a start → `stop_sigterm`", func(m *Core, e Event) { m.RestartRun(e.Req) }}
	CellRestartWait   = Cell{"start now → `check_gpu` (or `check_port`)", func(m *Core, e Event) { m.RestartNow(e.Req) }}
	CellKill          = Cell{"SIGKILL → `stop_sigkill`", func(m *Core, e Event) { m.OnKill() }}
	CellAPIGone       = Cell{"→ `stop_sigterm` (the keeper cleans up; SIGKILL after stop_timeout)", func(m *Core, e Event) { m.EndRun(EndExited) }}
	CellTreeGone      = Cell{"→ `cleaning` (what outlived the keeper is killed off the loop)", func(m *Core, e Event) { m.TreeGone() }}
	CellProbeReady    = func(m *Core, e Event) { m.R.Probing = false; m.OnProbe(e.Probe) }
	CellLive          = Cell{"probe liveness (none while a probe is in flight)", func(m *Core, e Event) { m.ProbeLive() }}
	CellCost          = Cell{"feed the cost model one sample", func(m *Core, e Event) { m.ObserveCost(); m.Arm(TCost, m.Cfg.GPU.SampleInterval.Duration) }}
	CellBeatEnding    = Cell{"a GPU fault → `stop_sigkill`; restore due → `stop_sigterm` (no stuck check: this wait gives the verdict)", func(m *Core, e Event) { m.BeatReady() }}
	CellRung          = Cell{"the policy's rung: read NVML → `check_gpu` (or its trial bind → `check_port`)", func(m *Core, e Event) { m.OnRung(e.Rung) }}
	CellClassified    = Cell{"the verdict: to the policy (a start that failed on a taken port: recorded, not counted → `check_gpu`)", func(m *Core, e Event) { m.OnClassified(e.Exit, e.Verdict) }}
	CellDecided       = Cell{"the decision: `releasing` (NVML), `backoff`, `failed` or `gave_up` (asked to stop: `stopped`)", func(m *Core, e Event) { m.OnDecided(e.Decision) }}
	CellRestoreDue    = Cell{"due → restore: `stop_sigterm` (or `draining`)", func(m *Core, e Event) { m.OnRestoreDue(e.Rung, e.Due) }}
	CellTreeGoneEnded = Cell{"→ `cleaning`", func(m *Core, e Event) { m.TreeGone() }}
)

// Table is the machine: [sub-state][event] → cell.
var Table = [SubStates][EvKinds]Cell{
	SubIdle: {EvBegin: {"ask the policy's rung", func(m *Core, e Event) { m.Next() }}, EvRung: CellRung},
	SubCheckGPU: {
		EvRung:    CellRung,
		EvGPURead: CellFreeRead, EvStop: CellStopWaiting, EvRestart: CellRestartWait,
	},
	SubWaitGPU: {
		EvRung:    CellRung,
		EvGPURead: CellFreeRead, EvTimer + EvKind(TFreeMemory): {"read NVML again", func(m *Core, e Event) { m.Next() }},
		EvStop: CellStopWaiting, EvRestart: CellRestartWait,
	},
	SubCheckPort: {EvPortRead: CellPortRead, EvStop: CellStopWaiting},
	SubWaitPort: {
		EvRung:    CellRung,
		EvGPURead: CellFreeRead, EvPortRead: CellPortRead,
		EvTimer + EvKind(TPortRetry): {"read NVML, then try the bind again", func(m *Core, e Event) { m.ClearNextStart(); m.Next() }},
		EvStop:                       CellStopWaiting, EvRestart: CellRestartWait,
	},
	SubWaitGroup: {EvStop: CellStopWaiting},
	SubStarting: {
		EvLaunched:   {"launched → poll readiness; the keeper not run, or the port held at the first start → a failure", func(m *Core, e Event) { m.OnLaunched(e.Launched) }},
		EvClassified: CellClassified, EvDecided: CellDecided,
		EvAPIGone: CellAPIGone, EvTreeGone: CellTreeGone,
		EvStartupComplete:            {"probe readiness now, refused probes retried fast for 2 s", func(m *Core, e Event) { m.OnStartupLine() }},
		EvProgress:                   {"publish the load phase and its progress", func(m *Core, e Event) { m.OnPhase() }},
		EvProbe:                      {"ok (vLLM's own) → `ready`; a 4xx for 30 s → hung → `stop_sigkill`", func(m *Core, e Event) { m.R.Probing = false; m.OnReadiness(e.Probe) }},
		EvTimer + EvKind(TPoll):      {"read the tree's disk I/O (off the loop)", func(m *Core, e Event) { m.Do(FxReadIO{}) }},
		EvIORead:                     {"progress (output, disk I/O); no progress for stall_timeout or past max_start_time → hung → `stop_sigkill`; else probe readiness", func(m *Core, e Event) { m.OnPoll(e.IO) }},
		EvOOMRead:                    {"note the OOM-kill count before the run", func(m *Core, e Event) { m.R.OOMBefore = e.OOM }},
		EvTimer + EvKind(TFastRetry): {"probe readiness again", func(m *Core, e Event) { m.ProbeReady() }},
		EvStop:                       CellStopRunning, EvRestart: CellRestartRun,
		EvHeartbeat: {"a GPU fault (NVML) → `stop_sigkill`; re-read the tree", func(m *Core, e Event) { m.BeatRunning() }},
	},
	SubReady: {
		EvRestoreDue: CellRestoreDue,
		EvAPIGone:    CellAPIGone, EvTreeGone: CellTreeGone,
		EvProbe:                 {"liveness: failures → hung → `stop_sigkill`; 503/500 → `engine_dead`; refused after the server's last line → `server_exiting`", CellProbeReady},
		EvTimer + EvKind(TLive): CellLive,
		EvTimer + EvKind(TCost): CellCost,
		EvStop:                  CellStopRunning, EvRestart: CellRestartRun,
		EvHeartbeat: {"a GPU fault → `stop_sigkill`; stuck → `asking_paused`; restore due → `stop_sigterm`", func(m *Core, e Event) { m.BeatReady() }},
	},
	SubEngineDead: {
		EvRestoreDue: CellRestoreDue,
		EvAPIGone:    CellAPIGone, EvTreeGone: CellTreeGone,
		EvProbe:                  {"liveness as in `ready` (the grace goes on); refused after the server's last line, ending sooner → `server_exiting`", CellProbeReady},
		EvTimer + EvKind(TLive):  CellLive,
		EvTimer + EvKind(TCost):  CellCost,
		EvTimer + EvKind(TDying): {"the grace is over: hung → `stop_sigkill`", func(m *Core, e Event) { m.Judge() }},
		EvStop:                   CellStopRunning, EvRestart: CellRestartRun,
		EvHeartbeat: CellBeatEnding,
	},
	SubServerExiting: {
		EvRestoreDue: CellRestoreDue,
		EvAPIGone:    CellAPIGone, EvTreeGone: CellTreeGone,
		EvProbe:                    {"liveness as in `ready` (the wait goes on); 503/500, its grace ending sooner → `engine_dead`", CellProbeReady},
		EvTimer + EvKind(TLive):    CellLive,
		EvTimer + EvKind(TCost):    CellCost,
		EvTimer + EvKind(TExiting): {"stop_timeout is over: hung → `stop_sigkill`", func(m *Core, e Event) { m.Judge() }},
		EvStop:                     CellStopRunning, EvRestart: CellRestartRun,
		EvHeartbeat: CellBeatEnding,
	},
	SubAskingPaused: {
		EvRestoreDue: CellRestoreDue,
		EvAPIGone:    CellAPIGone, EvTreeGone: CellTreeGone,
		EvProbe:                 {"/is_paused: paused → `ready` (the stuck clock starts again); else hung → `stop_sigkill`", func(m *Core, e Event) { m.R.Probing = false; m.OnPausedAnswer(e.Probe) }},
		EvTimer + EvKind(TLive): CellLive,
		EvTimer + EvKind(TCost): CellCost,
		EvStop:                  CellStopRunning, EvRestart: CellRestartRun,
		EvHeartbeat: {"a GPU fault → `stop_sigkill`; restore due → `stop_sigterm`", func(m *Core, e Event) { m.BeatReady() }},
	},
	SubDraining: {
		EvTreeGone: CellTreeGoneEnded, EvTimer + EvKind(TDrain): {"no requests left or the drain's time is up → SIGTERM, `stop_sigterm`", func(m *Core, e Event) { m.DrainStep() }},
		EvStop: CellStopEnding, EvKill: CellKill,
	},
	SubStopTerm: {
		EvTreeGone: CellTreeGoneEnded, EvTimer + EvKind(TStopKill): {"SIGKILL → `stop_sigkill`", func(m *Core, e Event) { m.StopTimedOut() }},
		EvStop: CellStopEnding, EvKill: CellKill,
	},
	SubStopKill: {EvTreeGone: CellTreeGoneEnded, EvStop: CellStopEnding, EvKill: CellKill},
	SubCleaning: {
		EvRestored: {"the policy stepped one rung up: say so, ask its rung", func(m *Core, e Event) { m.OnRestored(e.Rung) }},
		EvRung:     CellRung, EvClassified: CellClassified, EvDecided: CellDecided,
		EvCleaned:   {"classify and decide: `releasing`, `backoff`, `check_gpu` (restart, restore, port taken), `failed`, `gave_up` or `stopped`", func(m *Core, e Event) { m.SettleRun(e.Cleaned) }},
		EvStop:      CellStopEnding,
		EvHeartbeat: {"say which process does not die, and where it is stuck", func(m *Core, e Event) { m.CleaningStatus() }},
	},
	SubReleasing: {
		EvKilledHolders:            {"killed some → wait once more; none → `backoff`", func(m *Core, e Event) { m.OnKilledHolders(e.Killed) }},
		EvGPURead:                  {"released → `backoff`; past release_timeout: kill the old tree's holders once, then `backoff`", func(m *Core, e Event) { m.OnReleaseReadOf(e) }},
		EvTimer + EvKind(TRelease): {"read NVML again", func(m *Core, e Event) { m.CheckReleased() }},
		EvStop:                     CellStopWaiting,
	},
	SubBackoff: {
		EvRung:                     CellRung,
		EvTimer + EvKind(TBackoff): {"→ `check_gpu`", func(m *Core, e Event) { m.ClearNextStart(); m.Next() }},
		EvStop:                     CellStopWaiting, EvRestart: CellRestartWait,
	},
	SubFailed: {
		EvStop: {"→ `gave_up` (exit with the decision's code… 0: asked to stop)", func(m *Core, e Event) {
			m.StopAsked = true
			m.SayStop()
			m.Code = exitcode.OK
			m.Enter(SubGaveUp, "", nil)
		}},
		EvRestart: {"refused: the guard gave up", func(m *Core, e Event) { m.Refuse(e.Req) }},
	},
}

func (m *Core) SayStop() {
	m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionStop, Reason: "the guard was asked to stop"})
}

// StopWhileEnding: a stop while the run ends: no restart after it; a
// failure being cleaned up is still recorded, then the guard stops.
func (m *Core) StopWhileEnding() {
	if m.R.End != EndExited {
		m.R.End = EndStop
	}
}

func (m *Core) ClearNextStart() { m.Update(func(st *Status) { st.NextStartAt = time.Time{} }) }

// TreeGone: the keeper exited; its tree is settled once what outlived it
// is killed.
func (m *Core) TreeGone() {
	if !m.R.Gone {
		m.FinishRun()
	}
}

func (m *Core) OnReleaseReadOf(e Event) {
	m.OnReleaseRead(e.GPU)
}

// OnStartupLine: uvicorn logs the line, then starts listening: the first
// probe is usually refused, so refused probes retry at a short, bounded
// cadence instead of waiting for the next poll.
func (m *Core) OnStartupLine() {
	m.R.FastUntil = m.Now.Add(FastRetryFor)
	m.ProbeReady()
}

// OnPhase: a new load phase, or a new state of its progress bar: kept in
// the run's data (load.go) and published.
func (m *Core) OnPhase() {
	ph := m.NotePhase()
	shown := m.NoteProgress(ph)
	reason := "loading: " + ph
	if shown != nil {
		reason += " " + shown.String()
	}
	m.Update(func(st *Status) { st.Phase, st.Reason, st.Progress = ph, reason, shown })
	m.Publish(events.Event{Kind: events.KindProgress, Phase: ph, PID: m.R.PID, Progress: shown})
}

func (m *Core) StopTimedOut() {
	m.Log().Warn("vLLM did not stop within its stop timeout: the keeper kills its whole tree",
		zap.Duration("stop_timeout", m.StopTimeout()))
	m.Publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.R.PID,
		Reason: fmt.Sprintf("vLLM did not stop within %s", m.StopTimeout())})
	m.Do(FxKill{})
	m.Enter(SubStopKill, fmt.Sprintf("%s; vLLM did not stop within %s: killing its process tree", m.StopReason(), m.StopTimeout()), nil)
}
