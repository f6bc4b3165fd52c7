package supervisor

import (
	"context"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The step machine. One goroutine (Run) owns every field below and turns
// one event at a time into a new state plus effects: launch, signal, probe,
// arm a timer, persist, publish. Nothing in it blocks: a probe runs on its
// own goroutine and comes back as an event; every wait (the stop timeout,
// the memory release, backoff, free memory before a start) is a state with
// a timer, so the heartbeat turns all the while.
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
	fastRetryEvery = time.Millisecond
	fastRetryFor   = 2 * time.Second
)

// refusedProbeLimit: a start whose readiness probe vLLM answers with a 4xx
// for this long ends (as a hang, with the probe's answer as the reason)
// instead of waiting for max_start_time, which may be unbounded. vLLM
// registers every route before it listens, so a 4xx does not heal.
const refusedProbeLimit = 30 * time.Second

// timerKind names what a timer is for; each kind has at most one armed.
type timerKind int

const (
	tPoll       timerKind = iota // readiness poll and stall check while starting
	tLive                        // liveness probe while ready
	tCost                        // a cost-model sample while ready
	tDying                       // grace after /health said the engine is dead
	tExiting                     // grace after vLLM's server finished, for its process to exit
	tStopKill                    // SIGTERM sent: SIGKILL when it fires
	tRelease                     // read NVML again while waiting for the release
	tBackoff                     // the decided delay before the next start
	tFreeMemory                  // read NVML again while waiting for free memory
	tFastRetry                   // a refused probe right after the startup line, tried again
	tDrain                       // the proxy's requests in flight looked at again before SIGTERM
	tPortRetry                   // vLLM's port was held: try its bind again
	timerKinds
)

// evKind is what an event says: the columns of the machine's table
// (table.go). A timer's firing is the event of its kind, evTimer + its
// timerKind.
type evKind int

const (
	evBegin           evKind = iota // Run begins
	evAPIGone                       // vLLM's API server exited
	evTreeGone                      // the whole tree is gone (the keeper exited)
	evStartupComplete               // "Application startup complete." was printed
	evProgress                      // a new load phase was recognised
	evProbe                         // a probe answered
	evCleaned                       // what outlived the keeper was killed (or declared unkillable)
	evGPURead                       // an NVML read made off the loop (free memory, the release) answered
	evPortRead                      // the trial bind of vLLM's port answered
	evStop                          // the guard was asked to stop (SIGTERM, SIGINT)
	evKill                          // asked to stop again: no more waiting
	evRestart                       // an operator asked for a restart
	evHeartbeat                     // the loop's one-second beat
	evIORead                        // the tree's disk I/O, read off the loop at a readiness poll, answered
	evOOMRead                       // the cgroup's OOM-kill count at a launch, read off the loop, answered
	evLaunched                      // the launch answered
	evClassified                    // the classifier answered
	evDecided                       // the restart policy decided after a failure
	evRestored                      // the restart policy stepped one rung up
	evRestoreDue                    // the restart policy said whether a restore is due
	evRung                          // the restart policy said the rung of the next start
	evKilledHolders                 // the old tree's survivors holding GPU memory were killed (or not)
	evTimer                         // a timer fired: its column is evTimer + its timerKind
	evKinds           = evTimer + evKind(timerKinds)
	evRequest         = evKinds // an operator's request: answered by onRequest, no column of the table
)

// pumpFacts is what the log pump knows of the run at an event, read by
// the loop with the event's time: the decisions read these, never the
// pump's atomics.
type pumpFacts struct {
	lastLine   time.Time // when the last line came (load progress)
	phase      string    // the load phase recognised last
	serverUp   bool      // this run printed a line of its server's start
	serverDone bool      // its API server printed uvicorn's "Finished server process [its pid]"
}

type event struct {
	kind  evKind
	run   int // the run of vLLM it belongs to; events of an older run are dropped
	timer timerKind
	id    uint64 // the timer's arming; a re-armed or disarmed timer's event is dropped
	probe probeResult
	// cleaned: evCleaned's report.
	cleaned cleanup
	// gpu: evGPURead's answer; id is its read's number (a newer read
	// makes it stale).
	gpu gpuRead
	// holder: evPortRead's answer, who holds vLLM's port ("": the bind
	// works); id is its check's number.
	holder string
	// req: evRestart's and evRequest's request, answered by the cell.
	req request
	// io: evIORead's answer, each process's disk I/O; oom: evOOMRead's,
	// the OOM-kill count (-1: unknown).
	io  map[int]uint64
	oom int64
	// at and pump: the event's time and the log pump's facts, read by the
	// loop as the event is taken.
	at    time.Time
	pump  pumpFacts
	facts facts
	// The answers to the decisions' effects: evLaunched's (pid 0 and err:
	// no launch; lines: what it printed, baseline: the GPUs' memory before
	// it), evClassified's, evDecided's, evRestored's and evRung's rung,
	// evRestoreDue's, evKilledHolders'.
	launched launched
	exit     policy.Exit
	verdict  policy.Verdict
	decision policy.Decision
	rung     policy.Rung
	due      bool
	killed   bool
}

// launched is a launch's answer.
type launched struct {
	pid      int
	err      error
	lines    []policy.Line
	baseline []uint64
}

// column is the event's column in the machine's table.
func (e event) column() evKind {
	if e.kind == evTimer {
		return evTimer + evKind(e.timer)
	}
	return e.kind
}

// gpuRead is one NVML read made off the loop: a free-memory check before a
// start, or a release check after a death.
type gpuRead struct {
	free     bool // free-memory check: enough room on every device
	why      string
	holders  []Holder
	rung     policy.Rung
	released bool // release check: none of the old tree's memory held
	held     []Holder
	gpus     []policy.GPUDevice // the GPUs' hardware state, read with the free-memory check
	blocked  string             // a GPU that must not be started on, and why
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

// machine is the executor's side: the loop, the timers, the reads on
// their way, and what a run holds of the world (its tree, its output, its
// prober); c is the decisions' state (core.go).
type machine struct {
	s         *Supervisor
	ev        chan event
	sink      *logSink // the log pump's sink: every run's output goes through it
	quit      chan struct{}
	timers    timerSet
	gpuReads  uint64    // NVML reads made off the loop; only the newest one's answer counts
	portReads uint64    // trial binds of vLLM's port; only the newest one's answer counts
	res       runRes    // the run in progress (or the last one)
	relChild  proc      // the run that ended last, while its memory is waited for (its survivors may be killed)
	at        time.Time // the time of the event being handled
	c         core
}

// runRes is what one run holds of the world.
type runRes struct {
	child      proc // nil once its tree is gone and settled
	out        *output
	stdout     *streamWriter
	stderr     *streamWriter
	prober     checker
	ctx        context.Context // cancelled when the run ends: in-flight probes stop
	cancel     context.CancelFunc
	refreshing *atomic.Bool // a re-read of the tree is on its way (refreshTree)
	startedAt  time.Time
	bindHost   string
	bindPort   int
	checkPort  bool // at its cleanup, try its port (a start that failed)
}

// timerSet holds the machine's timers, at most one of each kind armed.
type timerSet struct {
	slot [timerKinds]struct {
		t  *time.Timer
		id uint64
	}
	seq uint64
}

// run is everything that belongs to one run of vLLM, from its launch to
// the decision after its end. launch replaces it whole, so nothing of the
// run before leaks into the next.
type run struct {
	rung      policy.Rung
	pid       int    // vLLM's API server (0: none)
	bindHost  string // where vLLM binds (its --host) and its port: tried again when it fails before ready
	bindPort  int
	probing   bool
	startedAt time.Time
	ready     bool
	end       ending
	hang      string // why the guard called it hung ("": it did not)
	peer      string // who asked for the restart that ends it
	baseline  []uint64
	oomBefore int64              // the cgroup's OOM-kill count before the launch (-1: not known, or not yet)
	gone      bool               // its tree is gone (being cleaned up, or settled)
	heldBy    string             // the guard\'s first start gave up waiting for its port, held by this: not launched
	gpuBefore []policy.GPUDevice // the GPUs' hardware state at the launch (gpufault.go)
	gpuKilled bool               // the run was ended for a GPU fault

	// Starting: load progress and the stall check.
	lastLine     time.Time      // the last output line's time seen by the stall check (monotonic)
	fastUntil    time.Time      // refused probes retry fast until then (uvicorn listens just after its line)
	refusedSince time.Time      // since when every readiness probe got a 4xx (zero: the last did not)
	refusal      probeResult    // the last such answer
	refusedLast  time.Time      // and when it came
	ioSeen       map[int]uint64 // per process: storage I/O at the last poll
	ioBytes      uint64         // storage I/O of the tree since launch
	lastIO       time.Time      // when the tree's I/O last grew
	ioAnnounced  time.Time      // when I/O progress was last published

	// Ready: liveness, stuck detection, restore and the cost model.
	failures     int       // consecutive liveness failures
	lastErr      string    // the last liveness failure's error
	engineDeadAt time.Time // /health said the engine is dead (zero: it did not)
	serverDoneAt time.Time // the server finished and its port closed; its process did not exit yet
	stuck        string    // a stuck verdict /is_paused did not excuse
	peak         float64   // highest GPU fraction since ready (restore)
	costObs      int
	costAt       time.Time // the GPU reading the cost model last observed
	stuckTokens  float64   // the token counters' sum seen last while ready
	stuckSince   time.Time // since when they stand still with requests running
	stuckProbe   bool      // the probe in flight is the stuck check's request
	stuckAsked   time.Time // when that request was last sent
	stuckVerdict string    // a stuck verdict waiting on vLLM's /is_paused ("": none asked)
	pausedSaid   bool      // "vLLM is paused" was logged for this pause

	// Ending.
	drainUntil    time.Time // a planned stop waits for the proxy's requests until then (zero: not draining)
	cleaningSince time.Time // when the kill of what outlived the keeper began
}

// releaseWait is the wait, after a failure, for the ended run's GPU memory
// to come back before the backoff.
type releaseWait struct {
	decision policy.Decision
	res      outcome        // how it ended, while the classifier and the policy answer
	exit     policy.Exit    // the classifier's evidence
	verdict  policy.Verdict // and its verdict
	portHeld string         // who holds its port (a start that failed): recorded, not counted
	held     []Holder       // what held memory at release_timeout
	pids     []int          // every process its tree had
	base     []uint64       // the GPUs' memory in use before its launch
	until    time.Time
	killed   bool // survivors holding memory were killed once
}

// handle turns one event into the next state: the cell of the table
// (table.go) for the sub-state and the event does it; an empty cell
// ignores the event.
func (m *core) handle(e event) {
	m.now, m.pump, m.facts = e.at, e.pump, e.facts
	if e.kind == evRequest {
		m.onRequest(e.req)
		return
	}
	if e.kind != evTimer && e.run != m.runN {
		return // an older run's (the executor drops a timer re-armed or disarmed since)
	}
	if e.kind == evRestart && m.sub != subFailed {
		m.log().Info("operator asked for a restart", zap.String("peer", e.req.peer))
	}
	if c := table[m.sub][e.column()]; c.do != nil {
		c.do(m, e)
	} else if e.kind == evRestart {
		m.do(fxReply{e.req.reply, nil}) // stopping, releasing or checking the port: a start is under way
	}
}
