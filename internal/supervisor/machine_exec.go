package supervisor

import (
	"context"
	"sync"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
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
// is the only caller of the collaborators; the decisions (package heart)
// read no clock, start no goroutine and call nothing:
// TestTheHeartReachesNothing.

// Run supervises vLLM until ctx is cancelled (exit 0) or the policy gives
// up (exit 1, or 78 for a configuration error).
func (s *Supervisor) Run(ctx context.Context) int {
	s.startPolicyWriter()
	defer s.stopPolicyWriter()
	sink := newLogSink(s.log)
	sink.filter = s.pumpFilter()
	defer sink.close()
	m := &machine{s: s, ev: make(chan event, 64), quit: make(chan struct{}), sink: sink, c: core{Cfg: s.cfg, Ports: s.ports()}}
	defer m.shutdown()
	heartbeat := time.NewTicker(time.Second)
	defer heartbeat.Stop()
	stop := ctx.Done()
	m.step(event{Kind: evBegin})
	for !m.c.Sub.Done() {
		var e event
		select {
		case <-stop:
			stop, e = nil, event{Kind: evStop}
		case <-s.kill:
			e = event{Kind: evKill}
		case e = <-m.ev:
		case e = <-s.groupEv:
			e = s.followLeader(e)
		case r := <-s.reqs:
			e = event{Kind: evRequest, Req: r}
			if r.Kind == "restart" {
				e.Kind = evRestart
			}
		case <-heartbeat.C:
			s.beat()
			e = event{Kind: evHeartbeat}
		}
		m.step(e)
	}
	code := m.c.Code
	s.publish(events.Event{Kind: events.KindStopped, State: string(s.Status().State), Reason: s.Status().Reason, ExitCode: &code})
	return code
}

// ports says which collaborators the decisions may ask for.
func (s *Supervisor) ports() ports {
	return ports{GPU: s.gpu != nil, Health: s.health != nil, PortHolder: s.portHolder != nil, Tokens: s.tokens != nil,
		Waiting: s.waiting != nil, Load: s.load != nil, InFlight: s.inFlight != nil, Extra: s.extra}
}

// step hands one event to the decisions, with what they may read of the
// world: the event's time (the one clock read), the log pump's facts, the
// readings; then it applies the effects they return, and hands over the
// answers, in order, at the same time.
func (m *machine) step(e event) {
	e.At = time.Now()
	queue := []event{e}
	for len(queue) > 0 {
		e, queue = queue[0], queue[1:]
		if !m.take(&e) {
			continue
		}
		m.groupTook(e)
		if t := m.s.traceCell; t != nil && e.Kind < evRequest {
			t(m.c.Sub, e.Column())
		}
		var fx []effect
		m.at = e.At
		m.c, fx = step(m.c, e)
		for _, f := range fx {
			if a, ok := m.apply(f); ok {
				a.At, a.Run = e.At, m.c.RunN
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
	case e.Kind == evTimer:
		if m.timers.slot[e.Timer].id != e.ID {
			return false
		}
		m.timers.slot[e.Timer].t, m.timers.slot[e.Timer].id = nil, 0
	case e.Kind == evGPURead && e.ID != m.gpuReads, e.Kind == evPortRead && e.ID != m.portReads:
		return false
	case e.Kind >= evStop && e.Kind <= evHeartbeat || e.Kind == evRequest || e.Kind == evBegin:
		e.Run = m.c.RunN
	case e.Kind == evCleaned && e.Run == m.c.RunN && m.c.Sub == subCleaning:
		m.unwatch(&e.Cleaned)
	}
	if o := m.res.out; o != nil {
		e.Pump = pumpFacts{LastLine: o.lastLine.Load(), Phase: o.Phase(), Progress: o.Bar(), ServerUp: o.serverUp.Load(), ServerDone: o.serverDone.Load()}
	}
	e.Facts = m.read(e.Kind)
	return true
}

// read takes the readings the decisions may use at an event of kind k.
func (m *machine) read(k evKind) facts {
	s := m.s
	st := s.status.Load()
	f := facts{Rung: s.rung(), State: st.State, Reason: st.Reason, ShutdownTimeout: s.shutdownTimeout(), Dropped: m.sink.dropped.Load()}
	if c := m.res.child; c != nil {
		f.TreeGone, f.APIGone = closed(c.Done()), closed(c.APIGone())
	}
	if s.inFlight != nil {
		f.InFlight = s.inFlight()
	}
	if s.tokens != nil {
		f.Running, f.Tokens, f.TokensOK = s.tokens()
	}
	if s.waiting != nil {
		f.Awaiting, f.Prompt = s.waiting()
	}
	if s.load != nil {
		f.LoadRunning, f.LoadWaiting, f.LoadOK = s.load()
	}
	if s.gpu != nil {
		f.Fraction = s.gpu.RecentFractions(1)
		f.Used, f.Total, f.SampledAt, f.SampleOK = s.gpu.Fullest()
	}
	if k == evHeartbeat && s.health != nil && m.c.Sub.Running() {
		f.GPUs = s.health.GPUs(m.res.startedAt, false)
	}
	if k == evHeartbeat && m.c.Sub == subCleaning && m.res.child != nil {
		f.Lingering = m.res.child.Lingering()
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
	x := c.Exit()
	cl.Exit = heart.ExitInfo{Code: x.Code, Signal: x.Signal, StartFailure: x.StartFailure, GuardFailure: x.GuardFailure}
	cl.PID, cl.Seen, cl.Lines = c.PID(), c.Seen(), m.res.out.ring.snapshot()
	m.res.child, m.relChild = nil, c
}

// readIO reads the tree's disk I/O off the loop (a walk of /proc) and
// posts it back.
func (m *machine) readIO() {
	c, run := m.res.child, m.c.RunN
	go func() { m.post(event{Kind: evIORead, Run: run, IO: c.IO()}) }()
}

// readOOM reads the cgroup's OOM-kill count off the loop and posts it
// back: the count before a run, to tell a host OOM kill at its end.
func (m *machine) readOOM() {
	run, read := m.c.RunN, m.s.hostOOM
	go func() { m.post(event{Kind: evOOMRead, Run: run, OOM: read()}) }()
}

// refreshTree re-reads the tree from /proc off the loop, one read at a
// time (the GPU monitor and the probes read the tree as last read); the
// cleanup waits for a read on its way (the tree's record of every process
// seen is written by one at a time).
func (m *machine) refreshTree() {
	c, mu := m.res.child, m.res.treeMu
	if !mu.TryLock() {
		return // one is on its way
	}
	go func() {
		defer mu.Unlock()
		c.Refresh()
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
	id, run := m.timers.seq, m.c.RunN
	m.timers.slot[k].id = id
	m.timers.slot[k].t = time.AfterFunc(d, func() { m.post(event{Kind: evTimer, Timer: k, ID: id, Run: run}) })
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
	id, run := m.gpuReads, m.c.RunN
	go func() { m.post(event{Kind: evGPURead, Run: run, ID: id, GPU: read()}) }()
}

// checkPort tries vLLM's bind of host:port off the loop (a name may take
// a resolver's time; who holds the port is read from /proc) and posts the
// holder back; only the newest check's answer is taken.
func (m *machine) checkPort(host string, port int) {
	m.portReads++
	id, run, holder, before := m.portReads, m.c.RunN, m.s.portHolder, m.s.before
	go func() {
		if before != nil {
			m.waitBefore(before)
		}
		m.post(event{Kind: evPortRead, Run: run, ID: id, Holder: holder(host, port)})
	}()
}

// waitBefore waits for what vLLM needs running first (Options.BeforeLaunch),
// until it is ready or the loop has ended.
func (m *machine) waitBefore(before func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.quit:
		case <-ctx.Done():
		}
		cancel()
	}()
	_ = before(ctx)
}

// readFree is the NVML read before a start, off the loop: hardware health
// first (a GPU lost, asking for a reset or with a row remap pending or
// failed is not started on; read fresh: a reset clears it), then free
// memory for rung.
func readFree(gpu GPU, health GPUHealth, rung policy.Rung, since time.Time) gpuRead {
	r := gpuRead{Rung: rung, Free: true}
	if health != nil {
		r.GPUs = health.GPUs(since, true)
		if r.Blocked = cause.StartBlock(r.GPUs); r.Blocked != "" {
			return r
		}
	}
	if gpu != nil {
		r.Free, r.Why, r.Holders = gpu.CheckFree(rung)
	}
	return r
}

// cleanUp kills what outlived c's keeper, off the loop (a process stuck in
// the kernel, as after a GPU fault, does not die at once; the tree kill
// can take up to killRounds × killWait), then reads NVML's word on the
// run (the classifier's first evidence) and posts evCleaned.
func (m *machine) cleanUp(checkPort bool) {
	c, run, health, since, oom := m.res.child, m.c.RunN, m.s.health, m.res.startedAt, m.s.hostOOM
	var holder func(string, int) string
	if checkPort {
		holder = m.s.portHolder // a start that failed: was its port taken?
	}
	host, port, mu := m.res.bindHost, m.res.bindPort, m.res.treeMu
	go func() {
		mu.Lock()   // (a re-read of the tree on its way ends first)
		c.Refresh() // every process the tree had, for the release wait
		outlived, unkillable := c.KillLeftovers()
		mu.Unlock()
		cl := cleanup{Outlived: outlived, Unkillable: unkillable}
		if holder != nil && len(unkillable) == 0 { // (a process of its own that does not die may hold it)
			cl.PortHeld = holder(host, port)
		}
		if health != nil {
			cl.GPUAfter = health.GPUs(since, true)
		}
		cl.OOMAfter = oom()
		m.post(event{Kind: evCleaned, Run: run, Cleaned: cl})
	}()
}

// forward turns the run's channels into events for the loop, until the
// tree is gone.
func (m *machine) forward(c proc) {
	run, out := m.c.RunN, m.res.out
	go func() {
		apiGone := c.APIGone()
		for {
			select {
			case <-apiGone:
				apiGone = nil
				m.post(event{Kind: evAPIGone, Run: run})
			case <-out.startupEnd:
				m.post(event{Kind: evStartupComplete, Run: run})
			case <-out.progress:
				m.post(event{Kind: evProgress, Run: run})
			case <-c.Done():
				m.post(event{Kind: evTreeGone, Run: run})
				return
			}
		}
	}()
}

// probe runs one probe on its own goroutine (the decisions send at most
// one at a time).
func (m *machine) probe(f fxProbe) {
	run, p, ctx := m.c.RunN, m.res.prober, m.res.ctx
	go func() {
		var r probeResult
		switch f.Kind {
		case probeReady:
			r = p.Ready(ctx, f.Level, f.Timeout)
		case probeHealth:
			r = p.Health(ctx, f.Timeout)
		case probePaused:
			r = p.Paused(ctx, f.Timeout)
		}
		m.post(event{Kind: evProbe, Run: run, Probe: r})
	}()
}

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
	child     proc // nil once its tree is gone and settled
	out       *output
	stdout    *streamWriter
	stderr    *streamWriter
	prober    checker
	ctx       context.Context // cancelled when the run ends: in-flight probes stop
	cancel    context.CancelFunc
	treeMu    *sync.Mutex // held by the re-read of the tree on its way, and by the cleanup
	startedAt time.Time
	bindHost  string
	bindPort  int
	checkPort bool // at its cleanup, try its port (a start that failed)
	cold      bool // the first start of its model since the host booted (starts.go)
}

// timerSet holds the machine's timers, at most one of each kind armed.
type timerSet struct {
	slot [timerKinds]struct {
		t  *time.Timer
		id uint64
	}
	seq uint64
}
