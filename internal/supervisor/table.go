package supervisor

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

// decisionTimer: the timers whose firing decides something (a verdict, a
// kill, a start); the others are periodic samples (the readiness poll,
// liveness, the cost model, the NVML reads while waiting, the drain's
// look at the proxy, a fast retry of a refused probe). A sub-state arms at
// most one decision timer: each wait that decides is a sub-state of its
// own (TestOneDecisionTimerPerSubState).
var decisionTimer = [timerKinds]bool{tDying: true, tExiting: true, tStopKill: true, tBackoff: true, tPortRetry: true}

// cell is one (sub-state, event) of the table.
type cell struct {
	says string
	do   func(m *core, e event)
}

var evNames = [evKinds]string{
	evBegin: "Run begins", evAPIGone: "API server exits", evTreeGone: "tree gone", evStartupComplete: "startup line",
	evProgress: "load phase", evProbe: "probe answer", evCleaned: "cleaned", evGPURead: "NVML read", evPortRead: "trial bind",
	evStop: "stop", evKill: "second stop signal", evRestart: "operator restart", evHeartbeat: "heartbeat", evIORead: "disk I/O read", evOOMRead: "OOM count read",
	evLaunched: "launched", evClassified: "classified", evDecided: "decided", evRestored: "restored", evRestoreDue: "restore due?",
	evRung: "rung", evKilledHolders: "holders killed",
	evTimer + evKind(tPoll): "poll timer", evTimer + evKind(tLive): "liveness timer", evTimer + evKind(tCost): "cost timer",
	evTimer + evKind(tDying): "engine-dead timer", evTimer + evKind(tExiting): "exit timer", evTimer + evKind(tStopKill): "stop timer",
	evTimer + evKind(tRelease): "release timer", evTimer + evKind(tBackoff): "backoff timer", evTimer + evKind(tFreeMemory): "sample timer",
	evTimer + evKind(tFastRetry): "fast-retry timer", evTimer + evKind(tDrain): "drain timer", evTimer + evKind(tPortRetry): "port-retry timer",
}

func (k evKind) String() string { return evNames[k] }

// The cells shared by several sub-states.
var (
	cellFreeRead = cell{"room → `check_port`; no room or a GPU needing a reset → `wait_gpu`", func(m *core, e event) {
		m.onFreeRead(e.gpu) // (the executor drops all but the newest read's answer)
	}}
	cellPortRead = cell{"free → `starting` (launch); held → `wait_port`; held past port_wait at the first start → `starting`, failed as a configuration error", func(m *core, e event) {
		m.onPortRead(e.holder)
	}}
	cellStopWaiting = cell{"→ `stopped`", func(m *core, e event) {
		m.stopAsked = true
		m.sayStop()
		m.finish(exitcode.OK, "stopped on request")
	}}
	cellStopRunning   = cell{"SIGTERM (or a drain first) → `stop_sigterm` / `draining`", func(m *core, e event) { m.stopAsked = true; m.sayStop(); m.endRun(endStop) }}
	cellStopEnding    = cell{"noted: no restart after this end (a failure is still recorded)", func(m *core, e event) { m.stopAsked = true; m.sayStop(); m.stopWhileEnding() }}
	cellRestartRun    = cell{"SIGTERM, then a start → `stop_sigterm`", func(m *core, e event) { m.restartRun(e.req) }}
	cellRestartWait   = cell{"start now → `check_gpu` (or `check_port`)", func(m *core, e event) { m.restartNow(e.req) }}
	cellKill          = cell{"SIGKILL → `stop_sigkill`", func(m *core, e event) { m.onKill() }}
	cellAPIGone       = cell{"→ `stop_sigterm` (the keeper cleans up; SIGKILL after stop_timeout)", func(m *core, e event) { m.endRun(endExited) }}
	cellTreeGone      = cell{"→ `cleaning` (what outlived the keeper is killed off the loop)", func(m *core, e event) { m.treeGone() }}
	cellProbeReady    = func(m *core, e event) { m.r.probing = false; m.onProbe(e.probe) }
	cellLive          = cell{"probe liveness (none while a probe is in flight)", func(m *core, e event) { m.probeLive() }}
	cellCost          = cell{"feed the cost model one sample", func(m *core, e event) { m.observeCost(); m.arm(tCost, m.cfg.GPU.SampleInterval.Duration) }}
	cellBeatEnding    = cell{"a GPU fault → `stop_sigkill`; restore due → `stop_sigterm` (no stuck check: this wait gives the verdict)", func(m *core, e event) { m.beatReady() }}
	cellRung          = cell{"the policy's rung: read NVML → `check_gpu` (or its trial bind → `check_port`)", func(m *core, e event) { m.onRung(e.rung) }}
	cellClassified    = cell{"the verdict: to the policy (a start that failed on a taken port: recorded, not counted → `check_gpu`)", func(m *core, e event) { m.onClassified(e.exit, e.verdict) }}
	cellDecided       = cell{"the decision: `releasing` (NVML), `backoff`, `failed` or `gave_up` (asked to stop: `stopped`)", func(m *core, e event) { m.onDecided(e.decision) }}
	cellRestoreDue    = cell{"due → restore: `stop_sigterm` (or `draining`)", func(m *core, e event) { m.onRestoreDue(e.rung, e.due) }}
	cellTreeGoneEnded = cell{"→ `cleaning`", func(m *core, e event) { m.treeGone() }}
)

// table is the machine: [sub-state][event] → cell.
var table = [subStates][evKinds]cell{
	subIdle: {evBegin: {"ask the policy's rung", func(m *core, e event) { m.next() }}, evRung: cellRung},
	subCheckGPU: {
		evRung:    cellRung,
		evGPURead: cellFreeRead, evStop: cellStopWaiting, evRestart: cellRestartWait,
	},
	subWaitGPU: {
		evRung:    cellRung,
		evGPURead: cellFreeRead, evTimer + evKind(tFreeMemory): {"read NVML again", func(m *core, e event) { m.next() }},
		evStop: cellStopWaiting, evRestart: cellRestartWait,
	},
	subCheckPort: {evPortRead: cellPortRead, evStop: cellStopWaiting},
	subWaitPort: {
		evRung:    cellRung,
		evGPURead: cellFreeRead, evPortRead: cellPortRead,
		evTimer + evKind(tPortRetry): {"read NVML, then try the bind again", func(m *core, e event) { m.clearNextStart(); m.next() }},
		evStop:                       cellStopWaiting, evRestart: cellRestartWait,
	},
	subStarting: {
		evLaunched:   {"launched → poll readiness; the keeper not run, or the port held at the first start → a failure", func(m *core, e event) { m.onLaunched(e.launched) }},
		evClassified: cellClassified, evDecided: cellDecided,
		evAPIGone: cellAPIGone, evTreeGone: cellTreeGone,
		evStartupComplete:            {"probe readiness now, refused probes retried fast for 2 s", func(m *core, e event) { m.onStartupLine() }},
		evProgress:                   {"publish the load phase", func(m *core, e event) { m.onPhase() }},
		evProbe:                      {"ok (vLLM's own) → `ready`; a 4xx for 30 s → hung → `stop_sigkill`", func(m *core, e event) { m.r.probing = false; m.onReadiness(e.probe) }},
		evTimer + evKind(tPoll):      {"read the tree's disk I/O (off the loop)", func(m *core, e event) { m.do(fxReadIO{}) }},
		evIORead:                     {"progress (output, disk I/O); no progress for stall_timeout or past max_start_time → hung → `stop_sigkill`; else probe readiness", func(m *core, e event) { m.onPoll(e.io) }},
		evOOMRead:                    {"note the OOM-kill count before the run", func(m *core, e event) { m.r.oomBefore = e.oom }},
		evTimer + evKind(tFastRetry): {"probe readiness again", func(m *core, e event) { m.probeReady() }},
		evStop:                       cellStopRunning, evRestart: cellRestartRun,
		evHeartbeat: {"a GPU fault (NVML) → `stop_sigkill`; re-read the tree", func(m *core, e event) { m.beatRunning() }},
	},
	subReady: {
		evRestoreDue: cellRestoreDue,
		evAPIGone:    cellAPIGone, evTreeGone: cellTreeGone,
		evProbe:                 {"liveness: failures → hung → `stop_sigkill`; 503/500 → `engine_dead`; refused after the server's last line → `server_exiting`", cellProbeReady},
		evTimer + evKind(tLive): cellLive,
		evTimer + evKind(tCost): cellCost,
		evStop:                  cellStopRunning, evRestart: cellRestartRun,
		evHeartbeat: {"a GPU fault → `stop_sigkill`; stuck → `asking_paused`; restore due → `stop_sigterm`", func(m *core, e event) { m.beatReady() }},
	},
	subEngineDead: {
		evRestoreDue: cellRestoreDue,
		evAPIGone:    cellAPIGone, evTreeGone: cellTreeGone,
		evProbe:                  {"liveness as in `ready` (the grace goes on); refused after the server's last line, ending sooner → `server_exiting`", cellProbeReady},
		evTimer + evKind(tLive):  cellLive,
		evTimer + evKind(tCost):  cellCost,
		evTimer + evKind(tDying): {"the grace is over: hung → `stop_sigkill`", func(m *core, e event) { m.judge() }},
		evStop:                   cellStopRunning, evRestart: cellRestartRun,
		evHeartbeat: cellBeatEnding,
	},
	subServerExiting: {
		evRestoreDue: cellRestoreDue,
		evAPIGone:    cellAPIGone, evTreeGone: cellTreeGone,
		evProbe:                    {"liveness as in `ready` (the wait goes on); 503/500, its grace ending sooner → `engine_dead`", cellProbeReady},
		evTimer + evKind(tLive):    cellLive,
		evTimer + evKind(tCost):    cellCost,
		evTimer + evKind(tExiting): {"stop_timeout is over: hung → `stop_sigkill`", func(m *core, e event) { m.judge() }},
		evStop:                     cellStopRunning, evRestart: cellRestartRun,
		evHeartbeat: cellBeatEnding,
	},
	subAskingPaused: {
		evRestoreDue: cellRestoreDue,
		evAPIGone:    cellAPIGone, evTreeGone: cellTreeGone,
		evProbe:                 {"/is_paused: paused → `ready` (the stuck clock starts again); else hung → `stop_sigkill`", func(m *core, e event) { m.r.probing = false; m.onPausedAnswer(e.probe) }},
		evTimer + evKind(tLive): cellLive,
		evTimer + evKind(tCost): cellCost,
		evStop:                  cellStopRunning, evRestart: cellRestartRun,
		evHeartbeat: {"a GPU fault → `stop_sigkill`; restore due → `stop_sigterm`", func(m *core, e event) { m.beatReady() }},
	},
	subDraining: {
		evTreeGone: cellTreeGoneEnded, evTimer + evKind(tDrain): {"no requests left or the drain's time is up → SIGTERM, `stop_sigterm`", func(m *core, e event) { m.drainStep() }},
		evStop: cellStopEnding, evKill: cellKill,
	},
	subStopTerm: {
		evTreeGone: cellTreeGoneEnded, evTimer + evKind(tStopKill): {"SIGKILL → `stop_sigkill`", func(m *core, e event) { m.stopTimedOut() }},
		evStop: cellStopEnding, evKill: cellKill,
	},
	subStopKill: {evTreeGone: cellTreeGoneEnded, evStop: cellStopEnding, evKill: cellKill},
	subCleaning: {
		evRestored: {"the policy stepped one rung up: say so, ask its rung", func(m *core, e event) { m.onRestored(e.rung) }},
		evRung:     cellRung, evClassified: cellClassified, evDecided: cellDecided,
		evCleaned:   {"classify and decide: `releasing`, `backoff`, `check_gpu` (restart, restore, port taken), `failed`, `gave_up` or `stopped`", func(m *core, e event) { m.settleRun(e.cleaned) }},
		evStop:      cellStopEnding,
		evHeartbeat: {"say which process does not die, and where it is stuck", func(m *core, e event) { m.cleaningStatus() }},
	},
	subReleasing: {
		evKilledHolders:            {"killed some → wait once more; none → `backoff`", func(m *core, e event) { m.onKilledHolders(e.killed) }},
		evGPURead:                  {"released → `backoff`; past release_timeout: kill the old tree's holders once, then `backoff`", func(m *core, e event) { m.onReleaseReadOf(e) }},
		evTimer + evKind(tRelease): {"read NVML again", func(m *core, e event) { m.checkReleased() }},
		evStop:                     cellStopWaiting,
	},
	subBackoff: {
		evRung:                     cellRung,
		evTimer + evKind(tBackoff): {"→ `check_gpu`", func(m *core, e event) { m.clearNextStart(); m.next() }},
		evStop:                     cellStopWaiting, evRestart: cellRestartWait,
	},
	subFailed: {
		evStop: {"→ `gave_up` (exit with the decision's code… 0: asked to stop)", func(m *core, e event) {
			m.stopAsked = true
			m.sayStop()
			m.code = exitcode.OK
			m.enter(subGaveUp, "", nil)
		}},
		evRestart: {"refused: the guard gave up", func(m *core, e event) { m.refuse(e.req) }},
	},
}

func (m *core) sayStop() {
	m.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionStop, Reason: "the guard was asked to stop"})
}

// stopWhileEnding: a stop while the run ends: no restart after it; a
// failure being cleaned up is still recorded, then the guard stops.
func (m *core) stopWhileEnding() {
	if m.r.end != endExited {
		m.r.end = endStop
	}
}

func (m *core) clearNextStart() { m.update(func(st *Status) { st.NextStartAt = time.Time{} }) }

// treeGone: the keeper exited; its tree is settled once what outlived it
// is killed.
func (m *core) treeGone() {
	if !m.r.gone {
		m.finishRun()
	}
}

func (m *core) onReleaseReadOf(e event) {
	m.onReleaseRead(e.gpu)
}

// onStartupLine: uvicorn logs the line, then starts listening: the first
// probe is usually refused, so refused probes retry at a short, bounded
// cadence instead of waiting for the next poll.
func (m *core) onStartupLine() {
	m.r.fastUntil = m.now.Add(fastRetryFor)
	m.probeReady()
}

func (m *core) onPhase() {
	ph := m.pump.phase
	m.update(func(st *Status) { st.Phase, st.Reason = ph, "loading: "+ph })
	m.publish(events.Event{Kind: events.KindProgress, Phase: ph, PID: m.r.pid})
}

func (m *core) stopTimedOut() {
	m.log().Warn("vLLM did not stop within its stop timeout: the keeper kills its whole tree",
		zap.Duration("stop_timeout", m.stopTimeout()))
	m.publish(events.Event{Kind: events.KindDecision, Decision: events.DecisionKill, PID: m.r.pid,
		Reason: fmt.Sprintf("vLLM did not stop within %s", m.stopTimeout())})
	m.do(fxKill{})
	m.enter(subStopKill, fmt.Sprintf("%s; vLLM did not stop within %s: killing its process tree", m.stopReason(), m.stopTimeout()), nil)
}
