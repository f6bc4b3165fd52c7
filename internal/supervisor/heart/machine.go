package heart

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// The step machine's events and a run's data. The executor's one
// goroutine (supervisor.Run) hands one event at a time to Step, which
// turns it into a new state plus effects: launch, signal, probe, arm a
// timer, persist, publish. Nothing in it blocks: every wait (the stop
// timeout, the memory release, backoff, free memory before a start) is a
// sub-state with a timer, so the heartbeat turns all the while.
//
//	check_gpu → wait_gpu (no room) → check_port → wait_port (held) → starting → ready
//	    ↑                               ↓ exit, hang, stop, restart, restore
//	 backoff ← releasing ← cleaning ← draining, stop_sigterm, stop_sigkill
//	failed / gave_up (gave up)   stopped (asked to)
//
// substate.go names the sub-states and the public State each shows.

// After "Application startup complete." a refused readiness probe is tried
// again every fastRetryEvery, for fastRetryFor.
const (
	FastRetryEvery = time.Millisecond
	FastRetryFor   = 2 * time.Second
)

// RefusedProbeLimit: a start whose readiness probe vLLM answers with a 4xx
// for this long ends (as a hang, with the probe's answer as the reason)
// instead of waiting for max_start_time, which may be unbounded. vLLM
// registers every route before it listens, so a 4xx does not heal.
const RefusedProbeLimit = 30 * time.Second

// TimerKind names what a timer is for; each kind has at most one armed.
type TimerKind int

const (
	TPoll       TimerKind = iota // readiness poll and stall check while starting
	TLive                        // liveness probe while ready
	TCost                        // a cost-model sample while ready
	TDying                       // grace after /health said the engine is dead
	TExiting                     // grace after vLLM's server finished, for its process to exit
	TStopKill                    // SIGTERM sent: SIGKILL when it fires
	TRelease                     // read NVML again while waiting for the release
	TBackoff                     // the decided delay before the next start
	TFreeMemory                  // read NVML again while waiting for free memory
	TFastRetry                   // a refused probe right after the startup line, tried again
	TDrain                       // the proxy's requests in flight looked at again before SIGTERM
	TPortRetry                   // vLLM's port was held: try its bind again
	TimerKinds
)

// EvKind is what an event says: the columns of the machine's table
// (table.go). A timer's firing is the event of its kind, evTimer + its
// timerKind.
type EvKind int

const (
	EvBegin           EvKind = iota // Run begins
	EvAPIGone                       // vLLM's API server exited
	EvTreeGone                      // the whole tree is gone (the keeper exited)
	EvStartupComplete               // "Application startup complete." was printed
	EvProgress                      // a new load phase was recognised
	EvProbe                         // a probe answered
	EvCleaned                       // what outlived the keeper was killed (or declared unkillable)
	EvGPURead                       // an NVML read made off the loop (free memory, the release) answered
	EvPortRead                      // the trial bind of vLLM's port answered
	EvStop                          // the guard was asked to stop (SIGTERM, SIGINT)
	EvKill                          // asked to stop again: no more waiting
	EvRestart                       // an operator asked for a restart
	EvHeartbeat                     // the loop's one-second beat
	EvIORead                        // the tree's disk I/O, read off the loop at a readiness poll, answered
	EvOOMRead                       // the cgroup's OOM-kill count at a launch, read off the loop, answered
	EvLaunched                      // the launch answered
	EvClassified                    // the classifier answered
	EvDecided                       // the restart policy decided after a failure
	EvRestored                      // the restart policy stepped one rung up
	EvRestoreDue                    // the restart policy said whether a restore is due
	EvRung                          // the restart policy said the rung of the next start
	EvKilledHolders                 // the old tree's survivors holding GPU memory were killed (or not)
	EvTimer                         // a timer fired: its column is evTimer + its timerKind
	EvKinds           = EvTimer + EvKind(TimerKinds)
	EvRequest         = EvKinds // an operator's request: answered by onRequest, no column of the table
	// The group's word ([group]; heart/group.go), alike in every
	// sub-state, so no column: this host's vLLM may start (go), or the
	// group's epoch ended (its tree is killed).
	EvGroupGo  = EvKinds + 1
	EvGroupEnd = EvKinds + 2
)

// PumpFacts is what the log pump knows of the run at an event, read by
// the loop with the event's time: the decisions read these, never the
// pump's atomics.
type PumpFacts struct {
	LastLine   time.Time           // when the last line came (load progress)
	Phase      string              // the load phase recognised last
	Progress   status.LoadProgress // the last progress bar vLLM printed while loading (Total 0: none yet)
	ServerUp   bool                // this run printed a line of its server's start
	ServerDone bool                // its API server printed uvicorn's "Finished server process [its pid]"
}

type Event struct {
	Kind  EvKind
	Run   int // the run of vLLM it belongs to; events of an older run are dropped
	Timer TimerKind
	ID    uint64 // the timer's arming; a re-armed or disarmed timer's event is dropped
	Probe ProbeResult
	// Cleaned: evCleaned's report.
	Cleaned Cleanup
	// GPU: evGPURead's answer; id is its read's number (a newer read
	// makes it stale).
	GPU GPURead
	// Holder: evPortRead's answer, who holds vLLM's port ("": the bind
	// works); id is its check's number.
	Holder string
	// Req: evRestart's and evRequest's request, answered by the cell.
	Req Request
	// IO: evIORead's answer, each process's disk I/O; oom: evOOMRead's,
	// the OOM-kill count (-1: unknown).
	IO  map[int]uint64
	OOM int64
	// At and pump: the event's time and the log pump's facts, read by the
	// loop as the event is taken.
	At    time.Time
	Pump  PumpFacts
	Facts Facts
	// The answers to the decisions' effects: evLaunched's (pid 0 and err:
	// no launch; lines: what it printed, baseline: the GPUs' memory before
	// it), evClassified's, evDecided's, evRestored's and evRung's rung,
	// evRestoreDue's, evKilledHolders'.
	Launched Launched
	GroupEnd cause.GroupEnd // EvGroupEnd: why the group's epoch ended
	// Led: EvGroupGo that brings the rung the start takes: on a follower
	// the leader's (its policy already follows it), on the leader its
	// ladder's answer to member Member's end (Verdict, Decision).
	Led      bool
	Member   int
	Exit     cause.Exit
	Verdict  cause.Verdict
	Decision policy.Decision
	Rung     policy.Rung
	Due      bool
	Killed   bool
}

// Launched is a launch's answer.
type Launched struct {
	PID      int
	Err      error
	Lines    []cause.Line
	Baseline []uint64
}

// Column is the event's column in the machine's table.
func (e Event) Column() EvKind {
	if e.Kind == EvTimer {
		return EvTimer + EvKind(e.Timer)
	}
	return e.Kind
}

// GPURead is one NVML read made off the loop: a free-memory check before a
// start, or a release check after a death.
type GPURead struct {
	Free     bool // free-memory check: enough room on every device
	Why      string
	Holders  []Holder
	Rung     policy.Rung
	Released bool // release check: none of the old tree's memory held
	Held     []Holder
	GPUs     []cause.GPUDevice // the GPUs' hardware state, read with the free-memory check
	Blocked  string            // a GPU that must not be started on, and why
}

// Ending is why the run in progress ends.
type Ending int

const (
	EndNone    Ending = iota
	EndExited         // vLLM exited by itself, or hung and is being killed: a failure
	EndStop           // the guard was asked to stop
	EndRestart        // an operator asked for a restart
	EndRestore        // a stable stretch on a lower rung: one rung up
)

// Run is everything that belongs to one run of vLLM, from its launch to
// the decision after its end. launch replaces it whole, so nothing of the
// run before leaks into the next.
type Run struct {
	Rung      policy.Rung
	PID       int    // vLLM's API server (0: none)
	BindHost  string // where vLLM binds (its --host) and its port: tried again when it fails before ready
	BindPort  int
	Probing   bool
	StartedAt time.Time
	Ready     bool
	End       Ending
	Hang      string // why the guard called it hung ("": it did not)
	// Group: the group's epoch ended it ([group]): the classifier's group
	// cause, not a hang.
	Group     *cause.GroupEnd
	Peer      string // who asked for the restart that ends it
	Why       string // why the guard itself restarts it ("": an operator asked)
	Baseline  []uint64
	OOMBefore int64             // the cgroup's OOM-kill count before the launch (-1: not known, or not yet)
	Gone      bool              // its tree is gone (being cleaned up, or settled)
	HeldBy    string            // the guard\'s first start gave up waiting for its port, held by this: not launched
	GPUBefore []cause.GPUDevice // the GPUs' hardware state at the launch (gpufault.go)
	GPUKilled bool              // the run was ended for a GPU fault

	// Starting: load progress and the stall check.
	LastLine     time.Time           // the last output line's time seen by the stall check (monotonic)
	FastUntil    time.Time           // refused probes retry fast until then (uvicorn listens just after its line)
	RefusedSince time.Time           // since when every readiness probe got a 4xx (zero: the last did not)
	Refusal      ProbeResult         // the last such answer
	RefusedLast  time.Time           // and when it came
	IOSeen       map[int]uint64      // per process: storage I/O at the last poll
	IOBytes      uint64              // storage I/O of the tree since launch
	LastIO       time.Time           // when the tree's I/O last grew
	IOAnnounced  time.Time           // when I/O progress was last published
	Progress     status.LoadProgress // the load phase's progress, as vLLM last reported it (Total 0: none)
	Phases       []PhaseMark         // the load phases seen, in order, with when each began

	// Ready: liveness, stuck detection, restore and the cost model.
	Failures     int       // consecutive liveness failures
	LastErr      string    // the last liveness failure's error
	EngineDeadAt time.Time // /health said the engine is dead (zero: it did not)
	ServerDoneAt time.Time // the server finished and its port closed; its process did not exit yet
	Stuck        string    // a stuck verdict /is_paused did not excuse
	Peak         float64   // highest GPU fraction since ready (restore)
	CostObs      int
	CostAt       time.Time // the GPU reading the cost model last observed
	StuckTokens  float64   // the token counters' sum seen last while ready
	StuckSince   time.Time // since when they stand still with requests running
	StuckProbe   bool      // the probe in flight is the stuck check's request
	StuckAsked   time.Time // when that request was last sent
	StuckVerdict string    // a stuck verdict waiting on vLLM's /is_paused ("": none asked)
	PausedSaid   bool      // "vLLM is paused" was logged for this pause

	// Ending.
	DrainUntil    time.Time // a planned stop waits for the proxy's requests until then (zero: not draining)
	CleaningSince time.Time // when the kill of what outlived the keeper began
}

// ReleaseWait is the wait, after a failure, for the ended run's GPU memory
// to come back before the backoff.
type ReleaseWait struct {
	Decision policy.Decision
	Res      Outcome       // how it ended, while the classifier and the policy answer
	Exit     cause.Exit    // the classifier's evidence
	Verdict  cause.Verdict // and its verdict
	PortHeld string        // who holds its port (a start that failed): recorded, not counted
	Held     []Holder      // what held memory at release_timeout
	PIDs     []int         // every process its tree had
	Base     []uint64      // the GPUs' memory in use before its launch
	Until    time.Time
	Killed   bool // survivors holding memory were killed once
}

// Handle turns one event into the next state: the cell of the table
// (table.go) for the sub-state and the event does it; an empty cell
// ignores the event.
func (m *Core) Handle(e Event) {
	m.Now, m.Pump, m.Facts = e.At, e.Pump, e.Facts
	if e.Kind == EvRequest {
		m.OnRequest(e.Req)
		return
	}
	if e.Kind == EvGroupGo || e.Kind == EvGroupEnd {
		m.OnGroup(e)
		return
	}
	if e.Kind != EvTimer && e.Run != m.RunN {
		return // an older run's (the executor drops a timer re-armed or disarmed since)
	}
	if e.Kind == EvRestart && m.StopAsked && m.Sub != SubFailed {
		// The final stop: nothing will start again, so saying "will be
		// restarted" would be a lie.
		m.Do(FxReply{e.Req.Reply, fmt.Errorf("the guard is stopping (asked to stop); vLLM will not be restarted: start the guard again (systemctl start) once it has stopped")})
		return
	}
	if e.Kind == EvRestart && m.Sub != SubFailed {
		if e.Req.Why != "" {
			m.Log().Warn("restarting vLLM", zap.String("why", e.Req.Why))
		} else {
			m.Log().Info("operator asked for a restart", zap.String("peer", e.Req.Peer))
		}
	}
	if c := Table[m.Sub][e.Column()]; c.Do != nil {
		c.Do(m, e)
	} else if e.Kind == EvRestart {
		m.Do(FxReply{e.Req.Reply, nil}) // stopping, releasing or checking the port: a start is under way
	}
}
