package supervisor

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
)

// The machine as a table: each row is one cell (sub-state × event) that
// does something, and says the sub-state the event leads to. A cell not
// listed is an event the sub-state ignores. Each row reaches its sub-state
// through the machine's own events (over the fakes of machine_test.go, in
// fake time), fires the one event, and checks the first sub-state the
// machine entered after it (to == from: it stays, entering none) and
// every effect. Every non-empty cell of the table (table.go) has a row.
type row struct {
	from  subState
	event string
	on    []evKind // the cells of from the event passes through (a timer's, then the read it asked for, an answer)
	then  []at     // and the cells of later sub-states it passes through
	to    subState
	edit  func(c *config.Config) // the configuration (nil: the scenario's)
	setup func(s *scenario)      // before Run starts
	reach func(s *scenario)      // after Run started: bring the machine to from
	fire  func(s *scenario)      // the event
	// effects: what the event did (effectsSince's words), all of it.
	effects []string
}

// cells are the cells the row passes through.
func (c row) cells() []at {
	out := slices.Clone(c.then)
	for _, k := range c.on {
		out = append(out, at{c.from, k})
	}
	return out
}

// at is a cell of the table.
type at struct {
	sub subState
	k   evKind
}

// tally counts what the machine did, to tell one cell's effects.
type tally struct {
	launches              int
	last                  *fakeVLLM
	stops, kills          int32
	ready, health, paused int64
	nvml                  int
	binds                 int64
	events                int
}

func takeTally(s *scenario) tally {
	t := tally{launches: s.l.n(), ready: s.pr.calls.Load(), health: s.pr.healths.Load(), paused: s.pr.pauses.Load(), binds: s.binds.Load()}
	if t.launches > 0 {
		t.last = s.l.last()
		t.stops, t.kills = t.last.stops.Load(), t.last.kills.Load()
	}
	s.gpu.mu.Lock()
	t.nvml = s.gpu.freeChecks + s.gpu.relChecks
	s.gpu.mu.Unlock()
	s.mu.Lock()
	t.events = len(s.events)
	s.mu.Unlock()
	return t
}

// effectsSince says what the machine did since t0, in the rows' words:
// to vLLM ("SIGTERM", "SIGKILL", "launch"), what it asked ("readiness
// probe", "liveness probe", "/is_paused", "NVML read", "trial bind"),
// and what it published (each kind once, a decision by its name; the
// state changes are the rows' sub-states).
func effectsSince(s *scenario, t0 tally) []string {
	t := takeTally(s)
	out := []string{}
	add := func(cond bool, what string) {
		if cond && !slices.Contains(out, what) {
			out = append(out, what)
		}
	}
	add(t0.last != nil && t0.last.stops.Load() > t0.stops, "SIGTERM")
	add(t0.last != nil && t0.last.kills.Load() > t0.kills, "SIGKILL")
	add(t.launches > t0.launches, "launch")
	add(t.ready > t0.ready, "readiness probe")
	add(t.health > t0.health, "liveness probe")
	add(t.paused > t0.paused, "/is_paused")
	add(t.nvml > t0.nvml, "NVML read")
	add(t.binds > t0.binds, "trial bind")
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events[t0.events:] {
		switch e.Kind {
		case events.KindState, events.KindStarting, events.KindStopped:
		case events.KindDecision:
			add(true, "decision "+string(e.Decision))
		default:
			add(true, string(e.Kind))
		}
	}
	return out
}

const shutdown20 = "--shutdown-timeout"

func withDrain(c *config.Config) { c.VLLM.Command = []string{"vllm", "serve", "m", shutdown20, "20"} }

// stuckLeftovers: processes of the last run outlive its keeper and take a
// minute to die (stuck in the kernel), so the machine is seen cleaning.
func stuckLeftovers(s *scenario) {
	p := s.l.last()
	p.survivors, p.stuckFor = []int{4242}, time.Minute
}

// vanish ends the last run's tree with no word of its API server's exit
// first (the keeper itself killed, by the OOM killer or an operator).
func vanish(s *scenario) {
	p := s.l.last()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gone.Do(func() {
		p.exitv = exitInfo{Code: -1, Signal: "SIGKILL"}
		close(p.doneC)
	})
}

// crash ends the last run's vLLM by itself, exit 1.
func crash(s *scenario) { s.l.last().end(exitInfo{Code: 1}) }

func badFlag(s *scenario) {
	s.l.last().print("stderr:vllm serve: error: unrecognized arguments: --bogus")
	s.l.last().end(exitInfo{Code: 2})
}

func restart(s *scenario) {
	if err := s.sup.Restart(context.Background(), "uid 0"); err != nil {
		s.t.Fatal(err)
	}
}

// slowPort makes every trial bind of vLLM's port take a minute, with no
// NVML view, so the machine can be seen while the check is on its way.
func slowPort(s *scenario) { s.noGPU, s.slowPort = true, time.Minute }

// slowNVML makes every NVML read take a minute, so the machine can be
// seen while a read is on its way.
func slowNVML(s *scenario) { s.gpu.slow = time.Minute }

// slowHealth is a GPU health view whose first read takes a minute.
type slowHealth struct {
	GPUHealth
	slowed *atomic.Bool
}

func (h slowHealth) GPUs(since time.Time, fresh bool) []cause.GPUDevice {
	if h.slowed.CompareAndSwap(false, true) {
		time.Sleep(time.Minute)
	}
	return h.GPUHealth.GPUs(since, fresh)
}

var rows = []row{
	{from: subIdle, event: "Run begins (NVML)", on: []evKind{evBegin, evRung}, effects: []string{"launch", "NVML read", "trial bind"}, to: subCheckGPU},
	{from: subIdle, event: "Run begins (no NVML)", on: []evKind{evBegin, evRung}, then: []at{{subStarting, evLaunched}}, effects: []string{"launch", "trial bind"}, to: subCheckPort, setup: func(s *scenario) { s.noGPU = true }},
	{from: subCheckGPU, event: "NVML read: room", on: []evKind{evGPURead}, effects: []string{"launch", "NVML read", "trial bind"}, to: subCheckPort, setup: slowNVML,
		fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckGPU, event: "NVML read: no room", on: []evKind{evGPURead}, effects: []string{"NVML read"}, to: subWaitGPU,
		setup: func(s *scenario) { slowNVML(s); s.gpu.free = false },
		fire:  func(s *scenario) { s.advance(time.Minute); s.gpu.set(func(g *fakeGPU) { g.slow = 0 }) }},
	{from: subCheckGPU, event: "NVML read: a GPU needs a reset", on: []evKind{evGPURead}, effects: []string{}, to: subWaitGPU,
		setup: func(s *scenario) {
			h := newFakeHealth()
			h.dev.Lost = true
			s.health = slowHealth{h, new(atomic.Bool)}
		}, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckGPU, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopped, setup: slowNVML, fire: func(s *scenario) { s.cancel() }},
	{from: subWaitGPU, event: "sample timer, NVML read: room", on: []evKind{evTimer + evKind(tFreeMemory), evGPURead, evRung}, effects: []string{"launch", "NVML read", "trial bind"}, to: subCheckPort,
		setup: func(s *scenario) { s.gpu.free = false },
		fire: func(s *scenario) {
			s.gpu.set(func(g *fakeGPU) { g.free = true })
			s.advance(s.cfg.GPU.SampleInterval.Duration)
		}},
	{from: subWaitGPU, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopped, setup: func(s *scenario) { s.gpu.free = false }, fire: func(s *scenario) { s.cancel() }},
	{from: subCheckPort, event: "trial bind: free", on: []evKind{evPortRead}, then: []at{{subStarting, evLaunched}}, effects: []string{"launch"}, to: subStarting, setup: slowPort,
		fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckPort, event: "trial bind: held", on: []evKind{evPortRead}, effects: []string{}, to: subWaitPort,
		setup: func(s *scenario) { slowPort(s); s.holder = squatter }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckPort, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopped, setup: slowPort, fire: func(s *scenario) { s.cancel() }},
	{from: subWaitPort, event: "retry timer, trial bind: free", on: []evKind{evTimer + evKind(tPortRetry), evPortRead, evRung}, effects: []string{"launch", "trial bind"}, to: subStarting,
		setup: func(s *scenario) { s.noGPU, s.holder = true, squatter },
		fire:  func(s *scenario) { s.setHolder(""); s.advance(portRetryFirst) }},
	{from: subWaitPort, event: "retry timer past port_wait at the first start: held", on: []evKind{evTimer + evKind(tPortRetry), evPortRead, evRung}, then: []at{{subStarting, evLaunched}, {subStarting, evClassified}, {subStarting, evDecided}}, effects: []string{"trial bind", "exited"}, to: subStarting,
		edit:  func(c *config.Config) { c.VLLM.PortWait = config.Duration{Duration: time.Second} },
		setup: func(s *scenario) { s.noGPU, s.holder = true, squatter }, fire: func(s *scenario) { s.advance(time.Second) }},
	{from: subWaitPort, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopped, setup: func(s *scenario) { s.noGPU, s.holder = true, squatter },
		fire: func(s *scenario) { s.cancel() }},
	{from: subWaitGroup, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopped, edit: func(c *config.Config) { c.Group.Enabled = true },
		fire: func(s *scenario) { s.cancel() }},
	{from: subStarting, event: "readiness probe answered", on: []evKind{evProbe}, effects: []string{"readiness probe", "progress", "ready"}, to: subReady, fire: func(s *scenario) { s.ready() }},
	{from: subStarting, event: "vLLM's API server exits", on: []evKind{evAPIGone}, effects: []string{"NVML read", "trial bind", "exited"}, to: subStopTerm, fire: crash},
	{from: subStarting, event: "stall timer: no output, no I/O", on: []evKind{evTimer + evKind(tPoll), evIORead}, effects: []string{"SIGKILL", "readiness probe", "NVML read", "trial bind", "exited"}, to: subStopKill,
		edit: func(c *config.Config) { c.Readiness.StallTimeout = config.Duration{Duration: time.Minute} },
		fire: func(s *scenario) { s.advance(time.Minute + time.Second) }},
	{from: subStarting, event: "stop", on: []evKind{evStop}, effects: []string{"SIGTERM", "decision stop"}, to: subStopTerm, fire: func(s *scenario) { s.cancel() }},
	{from: subReady, event: "stop (no proxy)", on: []evKind{evStop}, effects: []string{"SIGTERM", "decision stop"}, to: subStopTerm, reach: func(s *scenario) { s.ready() }, fire: func(s *scenario) { s.cancel() }},
	{from: subReady, event: "stop (requests in flight through the proxy)", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subDraining, edit: withDrain,
		setup: func(s *scenario) { s.inFlight = func() int { return 1 } }, reach: func(s *scenario) { s.ready() }, fire: func(s *scenario) { s.cancel() }},
	{from: subReady, event: "operator restart", on: []evKind{evRestart}, effects: []string{"SIGTERM", "launch", "NVML read", "trial bind", "decision restart"}, to: subStopTerm, reach: func(s *scenario) { s.ready() }, fire: restart},
	{from: subReady, event: "liveness failures", on: []evKind{evTimer + evKind(tLive), evProbe}, effects: []string{"SIGKILL", "launch", "readiness probe", "liveness probe", "NVML read", "trial bind", "probe_failed", "exited"}, to: subStopKill, reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) {
			s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Err: "timeout"} })
			s.advance(time.Duration(s.cfg.Liveness.Failures+1) * s.cfg.Liveness.Interval.Duration)
		}},
	{from: subReady, event: "probe refused after the server's last line", on: []evKind{evTimer + evKind(tLive), evProbe}, effects: []string{"liveness probe"}, to: subServerExiting, reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) {
			p := s.l.last()
			p.print(fmt.Sprintf("stderr:INFO:     Finished server process [%d]", p.apiPID))
			s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Err: "connection refused"} })
			s.advance(s.cfg.Liveness.Interval.Duration)
		}},
	{from: subReady, event: "heartbeat: XID 79", on: []evKind{evHeartbeat}, effects: []string{"SIGKILL", "decision kill", "exited"}, to: subStopKill,
		setup: func(s *scenario) { s.health = newFakeHealth() }, reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) { s.health.(*fakeHealth).xid(79); s.advance(time.Second) }},
	{from: subReady, event: "heartbeat: restore due", on: []evKind{evHeartbeat, evRestoreDue}, effects: []string{"SIGTERM", "launch", "readiness probe", "liveness probe", "NVML read", "trial bind", "decision restore"}, to: subStopTerm,
		edit: func(c *config.Config) { c.Profile.RestoreAfter = config.Duration{Duration: 10 * time.Minute} },
		setup: func(s *scenario) {
			s.pstate.Rung = 1
			s.load = func() (float64, float64, bool) { return 0, 0, true }
			s.gpu.fractions = []float64{0.5}
		},
		reach: func(s *scenario) { s.ready() }, fire: func(s *scenario) { s.advance(10*time.Minute + 2*time.Second) }},
	drainEnds(),
	{from: subDraining, event: "a second stop signal", on: []evKind{evKill}, effects: []string{"SIGKILL", "decision kill"}, to: subStopKill, edit: withDrain,
		setup: func(s *scenario) { s.inFlight = func() int { return 1 } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.sup.Kill() }},
	{from: subStopTerm, event: "stop timer", on: []evKind{evTimer + evKind(tStopKill)}, effects: []string{"SIGKILL", "decision kill"}, to: subStopKill,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.advance(s.cfg.VLLM.StopTimeout.Duration) }},
	{from: subStopTerm, event: "a second stop signal", on: []evKind{evKill}, effects: []string{"SIGKILL", "decision kill"}, to: subStopKill,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.sup.Kill() }},
	{from: subStopTerm, event: "the tree is gone", on: []evKind{evTreeGone}, effects: []string{}, to: subCleaning,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.l.last().end(exitInfo{Code: 0}) }},
	{from: subStopKill, event: "the tree is gone", on: []evKind{evTreeGone}, effects: []string{}, to: subCleaning,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM, p.outlivesKill = true, true } },
		reach: func(s *scenario) { s.ready(); s.cancel(); s.advance(s.cfg.VLLM.StopTimeout.Duration) },
		fire:  func(s *scenario) { s.l.last().end(exitInfo{Code: -1, Signal: "SIGKILL"}) }},
	{from: subCleaning, event: "cleaned: a failure, NVML watching", on: []evKind{evCleaned, evClassified, evDecided}, effects: []string{"NVML read", "trial bind", "exited"}, to: subReleasing,
		reach: func(s *scenario) { stuckLeftovers(s); crash(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a failure, no NVML", on: []evKind{evCleaned, evClassified, evDecided}, effects: []string{"trial bind", "exited"}, to: subBackoff,
		setup: func(s *scenario) { s.noGPU = true },
		reach: func(s *scenario) { stuckLeftovers(s); crash(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a failure that gives up", on: []evKind{evCleaned, evClassified, evDecided}, effects: []string{"trial bind", "exited"}, to: subGaveUp,
		reach: func(s *scenario) { stuckLeftovers(s); badFlag(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a failure that gives up, on_give_up = stay", on: []evKind{evCleaned, evClassified, evDecided}, effects: []string{"trial bind", "exited"}, to: subFailed,
		edit:  func(c *config.Config) { c.Restart.OnGiveUp = "stay" },
		reach: func(s *scenario) { stuckLeftovers(s); badFlag(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a start that failed before ready, its port taken", on: []evKind{evCleaned, evClassified, evRung}, effects: []string{"NVML read", "trial bind", "exited"}, to: subCheckGPU,
		reach: func(s *scenario) { stuckLeftovers(s); s.setHolder(squatter); bindFails(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: asked to stop", on: []evKind{evCleaned}, effects: []string{}, to: subStopped,
		reach: func(s *scenario) { s.ready(); stuckLeftovers(s); s.cancel() }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: an operator restart", on: []evKind{evCleaned, evRung}, effects: []string{"launch", "NVML read", "trial bind", "decision restart"}, to: subCheckGPU,
		reach: func(s *scenario) { s.ready(); stuckLeftovers(s); restart(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subReleasing, event: "NVML read: released", on: []evKind{evTimer + evKind(tRelease), evGPURead}, effects: []string{"NVML read"}, to: subBackoff,
		setup: func(s *scenario) { s.gpu.released = false }, reach: crash,
		fire: func(s *scenario) {
			s.gpu.set(func(g *fakeGPU) { g.released = true })
			s.advance(s.cfg.GPU.SampleInterval.Duration)
		}},
	{from: subReleasing, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopped, setup: func(s *scenario) { s.gpu.released = false }, reach: crash,
		fire: func(s *scenario) { s.cancel() }},
	{from: subBackoff, event: "backoff timer", on: []evKind{evTimer + evKind(tBackoff), evRung}, effects: []string{"launch", "NVML read", "trial bind"}, to: subCheckGPU, reach: crash,
		fire: func(s *scenario) { s.advance(s.cfg.Restart.InitialDelay.Duration) }},
	{from: subBackoff, event: "operator restart", on: []evKind{evRestart, evRung}, effects: []string{"launch", "NVML read", "trial bind", "decision restart"}, to: subCheckGPU, reach: crash, fire: restart},
	{from: subBackoff, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopped, reach: crash, fire: func(s *scenario) { s.cancel() }},
	{from: subFailed, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subGaveUp, edit: func(c *config.Config) { c.Restart.OnGiveUp = "stay" }, reach: badFlag,
		fire: func(s *scenario) { s.cancel() }},
	// The cells issue 43 named, and every other non-empty one.
	{from: subCheckGPU, event: "operator restart", on: []evKind{evRestart, evRung}, effects: []string{"decision restart"}, to: subCheckGPU, setup: slowNVML, fire: restart},
	{from: subWaitGPU, event: "operator restart", on: []evKind{evRestart, evRung}, effects: []string{"NVML read", "decision restart"}, to: subWaitGPU, setup: func(s *scenario) { s.gpu.free = false }, fire: restart},
	{from: subWaitPort, event: "retry timer, NVML read: room, trial bind: free", on: []evKind{evTimer + evKind(tPortRetry), evGPURead, evPortRead, evRung}, effects: []string{"launch", "NVML read", "trial bind"}, to: subStarting,
		setup: func(s *scenario) { s.holder = squatter }, fire: func(s *scenario) { s.setHolder(""); s.advance(portRetryFirst) }},
	{from: subWaitPort, event: "operator restart, still held", on: []evKind{evRestart, evRung}, effects: []string{"trial bind", "decision restart"}, to: subWaitPort,
		setup: func(s *scenario) { s.noGPU, s.holder = true, squatter }, fire: restart},
	{from: subStarting, event: "the tree is gone (the keeper killed)", on: []evKind{evTreeGone}, effects: []string{"NVML read", "trial bind", "exited"}, to: subCleaning, fire: vanish},
	{from: subStarting, event: "the startup line, vLLM listening", on: []evKind{evStartupComplete, evProbe}, effects: []string{"readiness probe", "progress", "ready"}, to: subReady,
		fire: func(s *scenario) {
			p := s.l.last()
			p.listening.Store(true)
			p.print("stderr:INFO:     Application startup complete.")
		}},
	{from: subStarting, event: "the OOM-kill count read before the launch answers", on: []evKind{evOOMRead}, effects: []string{"readiness probe"}, to: subStarting,
		setup: func(s *scenario) { s.slowOOM = time.Minute }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subStarting, event: "a load phase", on: []evKind{evProgress}, effects: []string{"progress"}, to: subStarting,
		fire: func(s *scenario) {
			s.l.last().print("INFO 10-14 12:00:00 [loader.py:1] Loading weights took 1.13 seconds")
		}},
	{from: subStarting, event: "operator restart", on: []evKind{evRestart}, effects: []string{"SIGTERM", "launch", "NVML read", "trial bind", "decision restart"}, to: subStopTerm, fire: restart},
	{from: subStarting, event: "heartbeat: XID 79", on: []evKind{evHeartbeat}, effects: []string{"SIGKILL", "readiness probe", "trial bind", "decision kill", "exited"}, to: subStopKill,
		setup: func(s *scenario) { s.health = newFakeHealth() },
		fire:  func(s *scenario) { s.health.(*fakeHealth).xid(79); s.advance(time.Second) }},
	{from: subStarting, event: "fast-retry timer after a refused probe", on: []evKind{evTimer + evKind(tFastRetry), evProbe}, effects: []string{"readiness probe", "ready"}, to: subReady,
		reach: func(s *scenario) { s.l.last().print("stderr:INFO:     Application startup complete.") },
		fire:  func(s *scenario) { s.l.last().listening.Store(true); s.advance(fastRetryEvery) }},
	{from: subStarting, event: "the readiness probe refused with a 4xx for 30 s", on: []evKind{evTimer + evKind(tPoll), evIORead, evProbe}, effects: []string{"SIGKILL", "readiness probe", "NVML read", "trial bind", "probe_failed", "exited"}, to: subStopKill,
		setup: func(s *scenario) {
			s.pr.setReady(func() probeResult { return probeResult{Step: "completion", Status: 404, Err: "model not found"} })
		},
		fire: func(s *scenario) { s.l.last().listening.Store(true); s.advance(refusedProbeLimit + time.Second) }},
	{from: subStarting, event: "poll timer past max_start_time", on: []evKind{evTimer + evKind(tPoll), evIORead}, effects: []string{"SIGKILL", "readiness probe", "NVML read", "trial bind", "exited"}, to: subStopKill,
		edit: func(c *config.Config) { c.Readiness.MaxStartTime = config.Duration{Duration: time.Minute} },
		fire: func(s *scenario) { s.advance(time.Minute + time.Second) }},
	{from: subReady, event: "vLLM's API server exits", on: []evKind{evAPIGone}, effects: []string{"NVML read", "exited"}, to: subStopTerm, reach: func(s *scenario) { s.ready() }, fire: crash},
	{from: subReady, event: "the tree is gone (the keeper killed)", on: []evKind{evTreeGone}, effects: []string{"NVML read", "exited"}, to: subCleaning, reach: func(s *scenario) { s.ready() }, fire: vanish},
	{from: subReady, event: "cost timer", on: []evKind{evTimer + evKind(tCost)}, effects: []string{}, to: subReady,
		setup: func(s *scenario) {
			s.load = func() (float64, float64, bool) { return 8, 0, true }
			s.gpu.used = 60 << 30
		},
		reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) {
			s.gpu.set(func(g *fakeGPU) { g.readAt = time.Now() })
			s.advance(s.cfg.GPU.SampleInterval.Duration)
		}},
	{from: subReady, event: "/health says 503", on: []evKind{evTimer + evKind(tLive), evProbe}, effects: []string{"liveness probe"}, to: subEngineDead,
		reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) {
			s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Status: 503, Err: "503"} })
			s.advance(s.cfg.Liveness.Interval.Duration)
		}},
	{from: subReady, event: "heartbeat: stuck", on: []evKind{evHeartbeat}, effects: []string{"liveness probe", "/is_paused"}, to: subAskingPaused,
		setup: stuckSlowPaused,
		reach: func(s *scenario) { s.ready() },
		fire:  func(s *scenario) { s.advance(s.cfg.Liveness.StuckTimeout.Duration + 2*time.Second) }},
	{from: subDraining, event: "the tree is gone", on: []evKind{evTreeGone}, effects: []string{}, to: subCleaning, edit: withDrain,
		setup: func(s *scenario) { s.inFlight = func() int { return 1 } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: crash},
	{from: subDraining, event: "stop while a restart drains", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subDraining, edit: withDrain,
		setup: func(s *scenario) { s.inFlight = func() int { return 1 } },
		reach: func(s *scenario) { s.ready(); restart(s) }, fire: func(s *scenario) { s.cancel() }},
	{from: subStopTerm, event: "stop while a restart stops vLLM", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopTerm,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } },
		reach: func(s *scenario) { s.ready(); restart(s) }, fire: func(s *scenario) { s.cancel() }},
	{from: subStopKill, event: "stop while a restart kills vLLM", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subStopKill,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM, p.outlivesKill = true, true } },
		reach: func(s *scenario) { s.ready(); restart(s); s.advance(s.cfg.VLLM.StopTimeout.Duration) },
		fire:  func(s *scenario) { s.cancel() }},
	{from: subStopKill, event: "a second stop signal", on: []evKind{evKill}, effects: []string{"SIGKILL", "decision kill"}, to: subStopKill,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM, p.outlivesKill = true, true } },
		reach: func(s *scenario) { s.ready(); s.cancel(); s.advance(s.cfg.VLLM.StopTimeout.Duration) },
		fire:  func(s *scenario) { s.sup.Kill() }},
	{from: subCleaning, event: "stop", on: []evKind{evStop}, effects: []string{"decision stop"}, to: subCleaning,
		reach: func(s *scenario) { stuckLeftovers(s); crash(s) }, fire: func(s *scenario) { s.cancel() }},
	{from: subCleaning, event: "heartbeat: a leftover does not die", on: []evKind{evHeartbeat}, effects: []string{}, to: subCleaning,
		reach: func(s *scenario) { stuckLeftovers(s); crash(s) }, fire: func(s *scenario) { s.advance(time.Second) }},
	{from: subCleaning, event: "cleaned: a restore", on: []evKind{evCleaned, evRestored, evRung}, effects: []string{"launch", "readiness probe", "NVML read", "trial bind", "decision restore"}, to: subCheckGPU,
		edit: func(c *config.Config) { c.Profile.RestoreAfter = config.Duration{Duration: 10 * time.Minute} },
		setup: func(s *scenario) {
			s.pstate.Rung = 1
			s.load = func() (float64, float64, bool) { return 0, 0, true }
			s.gpu.fractions = []float64{0.5}
		},
		reach: func(s *scenario) { s.ready(); stuckLeftovers(s); s.advance(10*time.Minute + 2*time.Second) },
		fire:  func(s *scenario) { s.advance(time.Minute) }},
	{from: subReleasing, event: "release timer past release_timeout, still held", on: []evKind{evTimer + evKind(tRelease), evGPURead, evKilledHolders}, effects: []string{"NVML read"}, to: subBackoff,
		setup: func(s *scenario) { s.gpu.released = false }, reach: crash,
		fire: func(s *scenario) { s.advance(s.cfg.GPU.ReleaseTimeout.Duration) }},
	{from: subFailed, event: "operator restart: refused", on: []evKind{evRestart}, effects: []string{}, to: subFailed,
		edit: func(c *config.Config) { c.Restart.OnGiveUp = "stay" }, reach: badFlag,
		fire: func(s *scenario) {
			if err := s.sup.Restart(context.Background(), "uid 0"); err == nil || !strings.Contains(err.Error(), "gave up") {
				s.t.Errorf("a restart of a guard that gave up: %v, want refused", err)
			}
		}},
}

// The waits of a ready vLLM that decide something, each a sub-state: how
// a row reaches each, and holds it there.
var (
	health503 = func() probeResult {
		time.Sleep(time.Second)
		return probeResult{Step: "health", Status: 503, Err: "503"}
	}
	toEngineDead = func(s *scenario) {
		s.ready()
		s.pr.setHealth(health503)
		s.advance(s.cfg.Liveness.Interval.Duration + time.Second)
	}
	toServerExiting = func(s *scenario) {
		s.ready()
		p := s.l.last()
		p.print(fmt.Sprintf("stderr:INFO:     Finished server process [%d]", p.apiPID))
		s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Err: "connection refused"} })
		s.advance(s.cfg.Liveness.Interval.Duration)
	}
	stuckSlowPaused = func(s *scenario) {
		s.progress = func() (float64, float64, bool) { return 12, 100, true }
		s.pr.mu.Lock()
		s.pr.pausedR = func() probeResult {
			time.Sleep(time.Minute)
			if s.pr.nowPaused.Load() {
				return probeResult{OK: true, Step: "paused", Status: 200, Paused: true}
			}
			return probeResult{Step: "paused", Status: 404, Err: "404"}
		}
		s.pr.mu.Unlock()
	}
	toAskingPaused = func(s *scenario) { s.ready(); s.advance(s.cfg.Liveness.StuckTimeout.Duration + 2*time.Second) }
	xid79          = func(s *scenario) { s.health.(*fakeHealth).xid(79); s.advance(time.Second) }
	withHealth     = func(s *scenario) { s.health = newFakeHealth() }
	restoreOn      = func(c *config.Config) { c.Profile.RestoreAfter = config.Duration{Duration: 10 * time.Minute} }
	stop           = func(s *scenario) { s.cancel() }
)

var waitRows = []row{
	{from: subEngineDead, event: "vLLM's API server exits", on: []evKind{evAPIGone}, effects: []string{"NVML read", "exited"}, to: subStopTerm, reach: toEngineDead, fire: crash},
	{from: subEngineDead, event: "the tree is gone", on: []evKind{evTreeGone}, effects: []string{"NVML read", "exited"}, to: subCleaning, reach: toEngineDead, fire: vanish},
	{from: subEngineDead, event: "liveness timer, 503 again", on: []evKind{evTimer + evKind(tLive), evProbe}, effects: []string{"liveness probe"}, to: subEngineDead, reach: toEngineDead,
		fire: func(s *scenario) {
			s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Status: 503, Err: "503"} })
			s.advance(s.cfg.Liveness.Interval.Duration - time.Second)
		}},
	{from: subEngineDead, event: "probe refused after the server's last line, its wait ending sooner", on: []evKind{evTimer + evKind(tLive), evProbe}, effects: []string{"liveness probe"}, to: subServerExiting,
		edit: func(c *config.Config) { c.VLLM.StopTimeout = config.Duration{Duration: 500 * time.Millisecond} }, reach: toEngineDead,
		fire: func(s *scenario) {
			p := s.l.last()
			p.print(fmt.Sprintf("stderr:INFO:     Finished server process [%d]", p.apiPID))
			s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Err: "connection refused"} })
			s.advance(s.cfg.Liveness.Interval.Duration - time.Second)
		}},
	{from: subEngineDead, event: "cost timer", on: []evKind{evTimer + evKind(tCost)}, effects: []string{}, to: subEngineDead, reach: toEngineDead,
		fire: func(s *scenario) { s.advance(s.cfg.GPU.SampleInterval.Duration) }},
	{from: subEngineDead, event: "engine-dead timer: vLLM did not exit", on: []evKind{evTimer + evKind(tDying)}, effects: []string{"SIGKILL", "liveness probe", "NVML read", "exited"}, to: subStopKill, reach: toEngineDead,
		fire: func(s *scenario) { s.advance(s.sup.engineDeadGrace()) }},
	{from: subEngineDead, event: "stop", on: []evKind{evStop}, effects: []string{"SIGTERM", "decision stop"}, to: subStopTerm, reach: toEngineDead, fire: stop},
	{from: subEngineDead, event: "operator restart", on: []evKind{evRestart}, effects: []string{"SIGTERM", "launch", "NVML read", "trial bind", "decision restart"}, to: subStopTerm, reach: toEngineDead, fire: restart},
	{from: subEngineDead, event: "heartbeat: XID 79", on: []evKind{evHeartbeat}, effects: []string{"SIGKILL", "decision kill", "exited"}, to: subStopKill, setup: withHealth, reach: toEngineDead, fire: xid79},

	{from: subServerExiting, event: "vLLM's API server exits", on: []evKind{evAPIGone}, effects: []string{"NVML read", "exited"}, to: subStopTerm, reach: toServerExiting, fire: crash},
	{from: subServerExiting, event: "the tree is gone", on: []evKind{evTreeGone}, effects: []string{"NVML read", "exited"}, to: subCleaning, reach: toServerExiting, fire: vanish},
	{from: subServerExiting, event: "liveness timer, refused again", on: []evKind{evTimer + evKind(tLive), evProbe}, effects: []string{"liveness probe"}, to: subServerExiting, reach: toServerExiting,
		fire: func(s *scenario) { s.advance(s.cfg.Liveness.Interval.Duration) }},
	{from: subServerExiting, event: "/health says 503, its grace ending sooner", on: []evKind{evTimer + evKind(tLive), evProbe}, effects: []string{"liveness probe"}, to: subEngineDead, reach: toServerExiting,
		fire: func(s *scenario) {
			s.pr.setHealth(health503)
			s.advance(s.cfg.Liveness.Interval.Duration + time.Second)
		}},
	{from: subServerExiting, event: "cost timer", on: []evKind{evTimer + evKind(tCost)}, effects: []string{}, to: subServerExiting, reach: toServerExiting,
		fire: func(s *scenario) { s.advance(s.cfg.GPU.SampleInterval.Duration) }},
	{from: subServerExiting, event: "exit timer: its process did not exit", on: []evKind{evTimer + evKind(tExiting)}, effects: []string{"SIGKILL", "liveness probe", "NVML read", "exited"}, to: subStopKill, reach: toServerExiting,
		fire: func(s *scenario) { s.advance(s.cfg.VLLM.StopTimeout.Duration) }},
	{from: subServerExiting, event: "stop", on: []evKind{evStop}, effects: []string{"SIGTERM", "decision stop"}, to: subStopTerm, reach: toServerExiting, fire: stop},
	{from: subServerExiting, event: "operator restart", on: []evKind{evRestart}, effects: []string{"SIGTERM", "launch", "NVML read", "trial bind", "decision restart"}, to: subStopTerm, reach: toServerExiting, fire: restart},
	{from: subServerExiting, event: "heartbeat: XID 79", on: []evKind{evHeartbeat}, effects: []string{"SIGKILL", "decision kill", "exited"}, to: subStopKill, setup: withHealth, reach: toServerExiting, fire: xid79},

	{from: subAskingPaused, event: "vLLM's API server exits", on: []evKind{evAPIGone}, effects: []string{"NVML read", "exited"}, to: subStopTerm, setup: stuckSlowPaused, reach: toAskingPaused, fire: crash},
	{from: subAskingPaused, event: "the tree is gone", on: []evKind{evTreeGone}, effects: []string{"NVML read", "exited"}, to: subCleaning, setup: stuckSlowPaused, reach: toAskingPaused, fire: vanish},
	{from: subAskingPaused, event: "/is_paused: not paused", on: []evKind{evProbe}, effects: []string{"SIGKILL", "NVML read", "exited"}, to: subStopKill, setup: stuckSlowPaused, reach: toAskingPaused,
		fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subAskingPaused, event: "/is_paused: paused", on: []evKind{evProbe}, effects: []string{}, to: subReady, setup: stuckSlowPaused, reach: toAskingPaused,
		fire: func(s *scenario) {
			s.pr.nowPaused.Store(true)
			s.advance(time.Minute)
		}},
	{from: subAskingPaused, event: "liveness timer (the /is_paused probe in flight)", on: []evKind{evTimer + evKind(tLive)}, effects: []string{}, to: subAskingPaused, setup: stuckSlowPaused, reach: toAskingPaused,
		fire: func(s *scenario) { s.advance(s.cfg.Liveness.Interval.Duration) }},
	{from: subAskingPaused, event: "cost timer", on: []evKind{evTimer + evKind(tCost)}, effects: []string{}, to: subAskingPaused, setup: stuckSlowPaused, reach: toAskingPaused,
		fire: func(s *scenario) { s.advance(s.cfg.GPU.SampleInterval.Duration) }},
	{from: subAskingPaused, event: "stop", on: []evKind{evStop}, effects: []string{"SIGTERM", "decision stop"}, to: subStopTerm, setup: stuckSlowPaused, reach: toAskingPaused, fire: stop},
	{from: subAskingPaused, event: "operator restart", on: []evKind{evRestart}, effects: []string{"SIGTERM", "launch", "NVML read", "trial bind", "decision restart"}, to: subStopTerm, setup: stuckSlowPaused, reach: toAskingPaused, fire: restart},
	{from: subAskingPaused, event: "heartbeat: XID 79", on: []evKind{evHeartbeat}, effects: []string{"SIGKILL", "decision kill", "exited"}, to: subStopKill,
		setup: func(s *scenario) { stuckSlowPaused(s); withHealth(s) }, reach: toAskingPaused, fire: xid79},
	{from: subEngineDead, event: "heartbeat: a restore not due", on: []evKind{evHeartbeat, evRestoreDue}, effects: []string{}, to: subEngineDead, edit: restoreOn, reach: toEngineDead,
		fire: func(s *scenario) { s.advance(time.Second) }},
	{from: subServerExiting, event: "heartbeat: a restore not due", on: []evKind{evHeartbeat, evRestoreDue}, effects: []string{}, to: subServerExiting, edit: restoreOn, reach: toServerExiting,
		fire: func(s *scenario) { s.advance(time.Second) }},
	{from: subAskingPaused, event: "heartbeat: a restore not due", on: []evKind{evHeartbeat, evRestoreDue}, effects: []string{}, to: subAskingPaused, edit: restoreOn,
		setup: stuckSlowPaused, reach: toAskingPaused, fire: func(s *scenario) { s.advance(time.Second) }},
}

// drainEnds: the requests in flight through the proxy end while draining.
func drainEnds() row {
	var inFlight atomic.Int64
	inFlight.Store(1)
	return row{from: subDraining, event: "drain timer: no requests left", on: []evKind{evTimer + evKind(tDrain)}, to: subStopTerm, effects: []string{"SIGTERM"}, edit: withDrain,
		setup: func(s *scenario) { inFlight.Store(1); s.inFlight = func() int { return int(inFlight.Load()) } },
		reach: func(s *scenario) { s.ready(); s.cancel() },
		fire:  func(s *scenario) { inFlight.Store(0); s.advance(time.Second) }}
}

func TestMachineTable(t *testing.T) {
	covered := map[[2]int]bool{}
	for _, c := range append(slices.Clone(rows), waitRows...) {
		for _, a := range c.cells() {
			if table[a.sub][a.k].Do == nil {
				t.Errorf("%s × %s: the row names the cell %s × %s, which is empty", c.from, c.event, a.sub, a.k)
			}
			covered[[2]int{int(a.sub), int(a.k)}] = true
		}
		t.Run(c.from.String()+" × "+c.event, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newScenario(t, c.edit)
				if c.setup != nil {
					c.setup(s)
				}
				n := 0
				if c.from != subIdle {
					s.start()
					if c.reach != nil {
						c.reach(s)
					}
					synctest.Wait()
					s.mu.Lock()
					n = len(s.subs)
					now := s.subs[n-1]
					s.mu.Unlock()
					if now != c.from {
						t.Fatalf("reached %s, want %s (sub-states %v)", now, c.from, s.subs)
					}
				}
				t0 := takeTally(s)
				s.mu.Lock()
				c0 := len(s.cells)
				s.mu.Unlock()
				if c.fire != nil {
					c.fire(s)
				} else {
					s.start()
				}
				synctest.Wait()
				s.mu.Lock()
				after := slices.Clone(s.subs[n:])
				s.mu.Unlock()
				if c.from == subIdle {
					after = after[1:]
				}
				switch {
				case c.to == c.from && len(after) != 0:
					t.Fatalf("%s × %s: entered %v, want to stay in %s", c.from, c.event, after, c.from)
				case c.to != c.from && (len(after) == 0 || after[0] != c.to):
					t.Fatalf("%s × %s: entered %v, want %s first", c.from, c.event, after, c.to)
				}
				if got := effectsSince(s, t0); !slices.Equal(got, c.effects) {
					t.Errorf("%s × %s: effects %#v, want %#v", c.from, c.event, got, c.effects)
				}
				s.mu.Lock()
				visited := slices.Clone(s.cells[c0:])
				s.mu.Unlock()
				for _, a := range c.cells() {
					if !slices.Contains(visited, [2]int{int(a.sub), int(a.k)}) {
						t.Errorf("%s × %s: the event did not pass through the cell %s × %s", c.from, c.event, a.sub, a.k)
					}
				}
				if st := s.sup.Status(); slices.Equal(after, []subState{c.to}) && st.State != publicState[c.to] {
					t.Errorf("in %s the status says %s, want %s", c.to, st.State, publicState[c.to])
				}
				s.advance(2 * time.Minute) // reads still on their way end (NVML calls are not cancelled)
			})
		})
	}
	// Every non-empty cell of the table has a row.
	for sub := range subStates {
		for k := range evKinds {
			if table[sub][k].Do != nil && !covered[[2]int{int(sub), int(k)}] {
				t.Errorf("no row for the cell %s × %s (%s)", sub, k, table[sub][k].Says)
			}
		}
	}
}

// Every sub-state has a name and shows a public State.
func TestEverySubStateShowsAState(t *testing.T) {
	for sub := range subStates {
		if subStateNames[sub] == "" || publicState[sub] == "" {
			t.Errorf("sub-state %d: name %q, public state %q", sub, subStateNames[sub], publicState[sub])
		}
	}
}

// parseSources parses the non-test Go files of dirs.
func parseSources(t *testing.T, fset *token.FileSet, dirs ...string) []*ast.File {
	t.Helper()
	var out []*ast.File
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, f)
		}
	}
	return out
}

// The public State is set in one place: enter, from the table. No other
// code of the package assigns a status's State.
func TestOnlyEnterSetsTheState(t *testing.T) {
	fset := token.NewFileSet()
	for _, f := range parseSources(t, fset, ".", "heart") {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || fn.Name.Name == "Enter" {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				as, ok := n.(*ast.AssignStmt)
				if !ok {
					return true
				}
				for _, l := range as.Lhs {
					if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name == "State" {
						t.Errorf("%s: %s assigns a State; use enter with a sub-state", fset.Position(as.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
}

// designTable is the rows of docs/design.md's table whose header starts
// with header (its separator row left out), as written.
func designTable(t *testing.T, header string) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, header) {
			in = true
			continue
		}
		if !in || strings.HasPrefix(l, "|---") {
			continue
		}
		if !strings.HasPrefix(l, "|") {
			break
		}
		rows = append(rows, l)
	}
	return rows
}

// docs/design.md's table of sub-states says what the code says: every
// sub-state, in order, with the public State it shows.
func TestDesignTableIsTheCode(t *testing.T) {
	var rows [][2]string
	for _, l := range designTable(t, "| sub-state | shows |") {
		f := strings.Split(l, "|")
		rows = append(rows, [2]string{strings.Trim(strings.TrimSpace(f[1]), "`"), strings.Trim(strings.TrimSpace(f[2]), "`")})
	}
	var want [][2]string
	for sub := range subStates {
		want = append(want, [2]string{sub.String(), string(publicState[sub])})
	}
	if !slices.Equal(rows, want) {
		t.Errorf("docs/design.md's sub-state table:\n%v\nthe code (substate.go):\n%v", rows, want)
	}
}

// No function of the supervisor or its heart (their tests aside) is over 50 lines: a
// decision that needs more is two.
func TestNoFunctionOver50Lines(t *testing.T) {
	fset := token.NewFileSet()
	for _, f := range parseSources(t, fset, ".", "heart") {
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				body = fn.Body
			case *ast.FuncLit:
				body = fn.Body
			}
			if body != nil {
				if lines := fset.Position(body.End()).Line - fset.Position(n.Pos()).Line + 1; lines > 50 {
					t.Errorf("%s: a function of %d lines (at most 50)", fset.Position(n.Pos()), lines)
				}
			}
			return true
		})
	}
}

// Each sub-state has at most one decision timer's cell (the others are
// periodic samples), so no wait that decides hides in a timer beside
// another: it is a sub-state.
func TestOneDecisionTimerPerSubState(t *testing.T) {
	for sub := range subStates {
		var timers []string
		for k := range timerKinds {
			if decisionTimer[k] && table[sub][evTimer+evKind(k)].Do != nil {
				timers = append(timers, (evTimer + evKind(k)).String())
			}
		}
		if len(timers) > 1 {
			t.Errorf("sub-state %s waits on %d decision timers: %v", sub, len(timers), timers)
		}
	}
}

// docs/design.md's table of cells is the code's: every non-empty cell, in
// the order of the sub-states and the events, with what it does.
func TestDesignCellsAreTheCode(t *testing.T) {
	doc := designTable(t, "| in | on | does |")
	if want := cellRows(); !slices.Equal(doc, want) {
		t.Errorf("docs/design.md's table of cells is not the code's (table.go); it should read:\n| in | on | does |\n|---|---|---|\n%s", strings.Join(want, "\n"))
	}
}

// cellRows is the table as docs/design.md shows it.
func cellRows() []string {
	var rows []string
	for sub := range subStates {
		for k := range evKinds {
			if c := table[sub][k]; c.Do != nil {
				rows = append(rows, fmt.Sprintf("| `%s` | %s | %s |", sub, k, c.Says))
			}
		}
	}
	return rows
}
