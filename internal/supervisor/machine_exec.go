package supervisor

import (
	"context"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The machine's executor: the loop that reads the clock once per event,
// the timers, and every effect that waits (an NVML read, a probe, the kill
// of what outlived the keeper, the watch on a run's channels), each on its
// own goroutine, its result posted back to the loop as an event with the
// run's number. The decisions (machine.go, machine_start.go,
// machine_ready.go, machine_end.go, machine_ops.go, gpufault.go) read no
// clock and start no goroutine: TestDecisionsReadNoClock.

// Run supervises vLLM until ctx is cancelled (exit 0) or the policy gives
// up (exit 1, or 78 for a configuration error).
func (s *Supervisor) Run(ctx context.Context) int {
	s.startPolicyWriter()
	defer s.stopPolicyWriter()
	sink := newLogSink(s.log)
	sink.filter = s.pumpFilter()
	defer sink.close()
	m := &machine{s: s, ev: make(chan event, 64), quit: make(chan struct{}), sink: sink}
	defer m.shutdown()
	heartbeat := time.NewTicker(time.Second)
	defer heartbeat.Stop()
	stop := ctx.Done()
	m.step(event{kind: evBegin})
	for !m.sub.done() {
		var e event
		select {
		case <-stop:
			stop, e = nil, event{kind: evStop}
		case <-s.kill:
			e = event{kind: evKill}
		case e = <-m.ev:
		case r := <-s.reqs:
			e = event{kind: evRequest, req: r}
		case <-heartbeat.C:
			s.beat()
			e = event{kind: evHeartbeat}
		}
		m.step(e)
	}
	code := m.code
	s.publish(events.Event{Kind: events.KindStopped, State: string(s.Status().State), Reason: s.Status().Reason, ExitCode: &code})
	return code
}

// step hands one event to the decisions, with what they may read of the
// world: the event's time (the one clock read), the log pump's facts.
// The loop's own events (signals, requests, the heartbeat) belong to the
// run in progress.
func (m *machine) step(e event) {
	e.at = time.Now()
	if e.kind >= evStop && e.kind <= evHeartbeat || e.kind == evRequest {
		e.run = m.runN
	}
	if o := m.r.out; o != nil {
		e.pump = pumpFacts{lastLine: o.lastLine.Load(), phase: o.Phase(), serverUp: o.serverUp.Load(), serverDone: o.serverDone.Load()}
	}
	m.handle(e)
}

// readIO reads the tree's disk I/O off the loop (a walk of /proc) and
// posts it back.
func (m *machine) readIO() {
	c, run := m.r.child, m.runN
	go func() { m.post(event{kind: evIORead, run: run, io: c.io()}) }()
}

// readOOM reads the cgroup's OOM-kill count off the loop and posts it
// back: the count before a run, to tell a host OOM kill at its end.
func (m *machine) readOOM() {
	run, read := m.runN, m.s.hostOOM
	go func() { m.post(event{kind: evOOMRead, run: run, oom: read()}) }()
}

// refreshTree re-reads the tree from /proc off the loop, one read at a
// time (the GPU monitor and the probes read the tree as last read).
func (m *machine) refreshTree() {
	c, busy := m.r.child, m.r.refreshing
	if !busy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer busy.Store(false)
		c.refresh()
	}()
}

// shutdown releases what the machine holds when Run returns.
func (m *machine) shutdown() {
	for k := range m.timers.slot {
		m.disarm(timerKind(k))
	}
	if m.r.cancel != nil {
		m.r.cancel()
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
	m.timers.seq++
	id, run := m.timers.seq, m.runN
	m.timers.slot[k].id = id
	m.timers.slot[k].t = time.AfterFunc(d, func() { m.post(event{kind: evTimer, timer: k, id: id, run: run}) })
}

func (m *machine) disarm(k timerKind) {
	if t := m.timers.slot[k].t; t != nil {
		t.Stop()
	}
	m.timers.slot[k].t, m.timers.slot[k].id = nil, 0
}

// readGPU runs read (an NVML read) on its own goroutine and posts its
// answer back; only the newest read's answer is taken. An NVML call cannot
// be cancelled: one still running when Run returns ends in its own time,
// and its answer goes nowhere (post gives up once the loop has ended).
func (m *machine) readGPU(read func() gpuRead) {
	m.gpuReads++
	id, run := m.gpuReads, m.runN
	go func() { m.post(event{kind: evGPURead, run: run, id: id, gpu: read()}) }()
}

// checkPort tries vLLM's bind of host:port off the loop (a name may take
// a resolver's time; who holds the port is read from /proc) and posts the
// holder back; only the newest check's answer is taken.
func (m *machine) checkPort(host string, port int) {
	m.portReads++
	id, run, holder := m.portReads, m.runN, m.s.portHolder
	go func() { m.post(event{kind: evPortRead, run: run, id: id, holder: holder(host, port)}) }()
}

// readFree is the NVML read before a start, off the loop: hardware health
// first (a GPU lost, asking for a reset or with a row remap pending or
// failed is not started on; read fresh: a reset clears it), then free
// memory for rung.
func readFree(gpu GPU, health GPUHealth, rung policy.Rung, since time.Time) gpuRead {
	r := gpuRead{rung: rung, free: true}
	if health != nil {
		r.gpus = health.GPUs(since, true)
		if r.blocked = policy.StartBlock(r.gpus); r.blocked != "" {
			return r
		}
	}
	if gpu != nil {
		r.free, r.why, r.holders = gpu.CheckFree(rung)
	}
	return r
}

// cleanUp kills what outlived c's keeper, off the loop (a process stuck in
// the kernel, as after a GPU fault, does not die at once; the tree kill
// can take up to killRounds × killWait), then reads NVML's word on the
// run (the classifier's first evidence) and posts evCleaned.
func (m *machine) cleanUp(c proc) {
	run, health, since, oom := m.runN, m.s.health, m.r.startedAt, m.s.hostOOM
	var holder func(string, int) string
	if !m.r.ready && m.r.end == endExited {
		holder = m.s.portHolder // a start that failed: was its port taken?
	}
	host, port := m.r.bindHost, m.r.bindPort
	go func() {
		outlived, unkillable := c.killLeftovers()
		cl := cleanup{outlived: outlived, unkillable: unkillable}
		if holder != nil && len(unkillable) == 0 { // (a process of its own that does not die may hold it)
			cl.portHeld = holder(host, port)
		}
		if health != nil {
			cl.gpuAfter = health.GPUs(since, true)
		}
		cl.oomAfter = oom()
		m.post(event{kind: evCleaned, run: run, cleaned: cl})
	}()
}

// forward turns the run's channels into events for the loop, until the
// tree is gone.
func (m *machine) forward(c proc) {
	run, out := m.runN, m.r.out
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
	if m.r.probing {
		return
	}
	m.r.probing = true
	run, p, ctx := m.runN, m.r.prober, m.r.ctx
	go func() { m.post(event{kind: evProbe, run: run, probe: f(ctx, p)}) }()
}
