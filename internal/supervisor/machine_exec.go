package supervisor

import (
	"context"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The machine's executor: the loop that reads the clock once per event,
// hands the event to the decisions with the readings they may use (facts),
// and turns the effects they return into calls: the status, the event
// bus, the log, the timers, the policy, the launch, the signals, and every
// effect that waits (an NVML read, a probe, the kill of what outlived the
// keeper, the watch on a run's channels), each on its own goroutine, its
// result posted back to the loop as an event with the run's number. An
// effect with an answer (a launch, the classifier, the policy) is answered
// by an event handed to the decisions at once, before the next event. It
// is the only caller of the collaborators; the decisions (core.go and the
// cells of table.go) read no clock, start no goroutine and call nothing:
// TestDecisionsReadNoClock, TestDecisionsCallNoCollaborator.

// Run supervises vLLM until ctx is cancelled (exit 0) or the policy gives
// up (exit 1, or 78 for a configuration error).
func (s *Supervisor) Run(ctx context.Context) int {
	s.startPolicyWriter()
	defer s.stopPolicyWriter()
	sink := newLogSink(s.log)
	sink.filter = s.pumpFilter()
	defer sink.close()
	m := &machine{s: s, ev: make(chan event, 64), quit: make(chan struct{}), sink: sink, c: core{cfg: s.cfg, ports: s.ports()}}
	defer m.shutdown()
	heartbeat := time.NewTicker(time.Second)
	defer heartbeat.Stop()
	stop := ctx.Done()
	m.step(event{kind: evBegin})
	for !m.c.sub.done() {
		var e event
		select {
		case <-stop:
			stop, e = nil, event{kind: evStop}
		case <-s.kill:
			e = event{kind: evKill}
		case e = <-m.ev:
		case r := <-s.reqs:
			e = event{kind: evRequest, req: r}
			if r.kind == "restart" {
				e.kind = evRestart
			}
		case <-heartbeat.C:
			s.beat()
			e = event{kind: evHeartbeat}
		}
		m.step(e)
	}
	code := m.c.code
	s.publish(events.Event{Kind: events.KindStopped, State: string(s.Status().State), Reason: s.Status().Reason, ExitCode: &code})
	return code
}

// ports says which collaborators the decisions may ask for.
func (s *Supervisor) ports() ports {
	return ports{gpu: s.gpu != nil, health: s.health != nil, portHolder: s.portHolder != nil, tokens: s.tokens != nil,
		waiting: s.waiting != nil, load: s.load != nil, inFlight: s.inFlight != nil, extra: s.extra}
}

// step hands one event to the decisions, with what they may read of the
// world: the event's time (the one clock read), the log pump's facts, the
// readings; then it applies the effects they return, and hands over the
// answers, in order, at the same time.
func (m *machine) step(e event) {
	e.at = time.Now()
	queue := []event{e}
	for len(queue) > 0 {
		e, queue = queue[0], queue[1:]
		if !m.take(&e) {
			continue
		}
		if t := m.s.traceCell; t != nil && e.kind != evRequest {
			t(m.c.sub, e.column())
		}
		var fx []effect
		m.at = e.at
		m.c, fx = step(m.c, e)
		for _, f := range fx {
			if a, ok := m.apply(f); ok {
				a.at, a.run = e.at, m.c.runN
				queue = append(queue, a)
			}
		}
	}
}

// take readies e for the decisions, or drops it: a timer re-armed or
// disarmed since, an NVML read or a trial bind a newer one replaced. The
// loop's own events (signals, requests, the heartbeat) belong to the run
// in progress.
func (m *machine) take(e *event) bool {
	switch {
	case e.kind == evTimer:
		if m.timers.slot[e.timer].id != e.id {
			return false
		}
		m.timers.slot[e.timer].t, m.timers.slot[e.timer].id = nil, 0
	case e.kind == evGPURead && e.id != m.gpuReads, e.kind == evPortRead && e.id != m.portReads:
		return false
	case e.kind >= evStop && e.kind <= evHeartbeat || e.kind == evRequest || e.kind == evBegin:
		e.run = m.c.runN
	case e.kind == evCleaned && e.run == m.c.runN && m.c.sub == subCleaning:
		m.unwatch(&e.cleaned)
	}
	if o := m.res.out; o != nil {
		e.pump = pumpFacts{lastLine: o.lastLine.Load(), phase: o.Phase(), serverUp: o.serverUp.Load(), serverDone: o.serverDone.Load()}
	}
	e.facts = m.read(e.kind)
	return true
}

// read takes the readings the decisions may use at an event of kind k.
func (m *machine) read(k evKind) facts {
	s := m.s
	st := s.status.Load()
	f := facts{rung: s.pol.Current(), state: st.State, reason: st.Reason, shutdownTimeout: s.shutdownTimeout(), dropped: m.sink.dropped.Load()}
	if c := m.res.child; c != nil {
		f.treeGone, f.apiGone = closed(c.done()), closed(c.apiGone())
	}
	if s.inFlight != nil {
		f.inFlight = s.inFlight()
	}
	if s.tokens != nil {
		f.running, f.tokens, f.tokensOK = s.tokens()
	}
	if s.waiting != nil {
		f.awaiting, f.prompt = s.waiting()
	}
	if s.load != nil {
		f.loadRunning, f.loadWaiting, f.loadOK = s.load()
	}
	if s.gpu != nil {
		f.fraction = s.gpu.RecentFractions(1)
		f.used, f.total, f.sampledAt, f.sampleOK = s.gpu.Fullest()
	}
	if k == evHeartbeat && s.health != nil && m.c.sub.running() {
		f.gpus = s.health.GPUs(m.res.startedAt, false)
	}
	if k == evHeartbeat && m.c.sub == subCleaning && m.res.child != nil {
		f.lingering = m.res.child.lingering()
	}
	return f
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// unwatch ends what watched the run whose tree is gone (its output, its
// tree for the GPU monitor and vLLM's other clients) and adds to the
// cleanup's report how the run ended, what it printed and every process
// its tree had.
func (m *machine) unwatch(cl *cleanup) {
	s, c := m.s, m.res.child
	m.res.stdout.Close()
	m.res.stderr.Close()
	s.tree.Store(nil)
	if s.gpu != nil {
		s.gpu.SetTree(nil)
		s.gpu.SetLoading(false)
	}
	cl.exit, cl.pid, cl.seen, cl.lines = c.exit(), c.pid(), c.seen(), m.res.out.ring.snapshot()
	m.res.child, m.relChild = nil, c
}

// readIO reads the tree's disk I/O off the loop (a walk of /proc) and
// posts it back.
func (m *machine) readIO() {
	c, run := m.res.child, m.c.runN
	go func() { m.post(event{kind: evIORead, run: run, io: c.io()}) }()
}

// readOOM reads the cgroup's OOM-kill count off the loop and posts it
// back: the count before a run, to tell a host OOM kill at its end.
func (m *machine) readOOM() {
	run, read := m.c.runN, m.s.hostOOM
	go func() { m.post(event{kind: evOOMRead, run: run, oom: read()}) }()
}

// refreshTree re-reads the tree from /proc off the loop, one read at a
// time (the GPU monitor and the probes read the tree as last read).
func (m *machine) refreshTree() {
	c, busy := m.res.child, m.res.refreshing
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
	if m.res.cancel != nil {
		m.res.cancel()
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
	id, run := m.timers.seq, m.c.runN
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
	id, run := m.gpuReads, m.c.runN
	go func() { m.post(event{kind: evGPURead, run: run, id: id, gpu: read()}) }()
}

// checkPort tries vLLM's bind of host:port off the loop (a name may take
// a resolver's time; who holds the port is read from /proc) and posts the
// holder back; only the newest check's answer is taken.
func (m *machine) checkPort(host string, port int) {
	m.portReads++
	id, run, holder := m.portReads, m.c.runN, m.s.portHolder
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
func (m *machine) cleanUp(checkPort bool) {
	c, run, health, since, oom := m.res.child, m.c.runN, m.s.health, m.res.startedAt, m.s.hostOOM
	var holder func(string, int) string
	if checkPort {
		holder = m.s.portHolder // a start that failed: was its port taken?
	}
	host, port := m.res.bindHost, m.res.bindPort
	go func() {
		c.refresh() // every process the tree had, for the release wait
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
	run, out := m.c.runN, m.res.out
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

// probe runs one probe on its own goroutine (the decisions send at most
// one at a time).
func (m *machine) probe(f fxProbe) {
	run, p, ctx := m.c.runN, m.res.prober, m.res.ctx
	go func() {
		var r probeResult
		switch f.kind {
		case probeReady:
			r = p.ready(ctx, f.level, f.timeout)
		case probeHealth:
			r = p.health(ctx, f.timeout)
		case probePaused:
			r = p.paused(ctx, f.timeout)
		}
		m.post(event{kind: evProbe, run: run, probe: r})
	}()
}
