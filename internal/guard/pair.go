package guard

// pair.go is the warm standby ([standby], issue 42). A pair owns the
// supervisors of vLLM "a" (on [vllm] port) and, with a standby, "b" (on
// [standby] port); which of them serves (the proxy's vLLM: the gate's
// address, readiness and rung, the proxy's dial); the standby's first
// start (once a is ready); the failovers and swaps (decide, in
// pairdecide.go); the tagging of their events with the vLLM and its role;
// and the one degrade ladder they share (the policy, behind one mutex,
// saved newest-first). Each supervisor still decides its own vLLM's life:
// launch, readiness, liveness, stop, failure and restart on the ladder's
// rung. Without a standby the pair is vLLM a alone, as before.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/supervisor"
)

// member is one vLLM of the pair and its supervisor.
type member struct {
	sup     *supervisor.Supervisor
	port    int
	running atomic.Bool // its Run has begun and not returned
}

// pair is vLLM a, and with a standby vLLM b, as the guard sees them.
type pair struct {
	log       *zap.Logger
	standby   bool
	sleepMode bool   // [standby] mode = "sleep" (pairsleep.go)
	model     string // the served model name, for the woken standby's check
	apiKey    string
	host      string
	m         []*member // a, then b with a standby
	pol       *policy.Policy
	polMu     *sync.Mutex
	saveMu    sync.Mutex
	out       func(events.Event) // the guard's bus
	// onLost tells the proxy at once that the serving vLLM is going (set
	// by the guard before Run; called on that vLLM's machine goroutine).
	onLost  func()
	serving atomic.Int32    // the index of the serving vLLM
	life    context.Context // Run's: ends the swaps' restarts
	stopped atomic.Bool     // the guard is stopping for good: no more failovers

	firstReady chan struct{} // closed at vLLM a's first ready: the standby starts
	firstOnce  sync.Once

	mu          sync.Mutex
	leftAt      time.Time // when the serving vLLM left ready (zero: it is ready)
	failovers   int
	swaps       int
	last        *events.Failover    // the last failover (not a swap)
	diedServing [2]*events.Failover // a failover away from i, for i's next exit event
	restarting  [2]bool             // a planned restart of i was asked and i has not left ready yet
	sl          sleepState          // sleep mode's (pairsleep.go)
}

// restartOrder is a planned restart the pair asks of vLLM i's supervisor
// (i -1: none).
type restartOrder struct {
	i   int
	why string
}

// pairOptions are what the pair's supervisors get besides their own
// config: the collaborators the guard wires (supervisor.Options without
// Events, Persist, PolicyMu and MayRestore, which the pair sets).
type pairOptions struct {
	opts supervisor.Options
	// serving* are the proxy's and the serving vLLM's readings; a standby
	// (no client traffic) reads none of them.
	awaiting func() (int, float64)
	inFlight func() int
	load     func() (running, waiting float64, ok bool)
	progress func() (running, tokens float64, ok bool)
	persist  func(policy.State)
}

// newPair makes vLLM a's supervisor and, with [standby] mode on, b's.
func newPair(cfg *config.Config, po pairOptions, out func(events.Event), log *zap.Logger) (*pair, error) {
	p := &pair{log: log, standby: cfg.Standby.Mode != config.StandbyOff && cfg.Standby.Mode != "", pol: po.opts.Policy,
		polMu: &sync.Mutex{}, out: out, firstReady: make(chan struct{}), life: context.Background()}
	p.sleepMode, p.host = cfg.Standby.Mode == config.StandbySleep, cfg.VLLM.Host
	if a := po.opts.Args; a != nil {
		if names := cfg.ServedModelNames(a); len(names) > 0 {
			p.model = names[0]
		}
		if len(a.APIKeys) > 0 {
			p.apiKey = a.APIKeys[0]
		}
	}
	cfgs := []*config.Config{cfg}
	if p.standby {
		cfgs = append(cfgs, cfg.StandbyConfig())
	}
	for i, c := range cfgs {
		o := po.opts
		bus := events.NewBus()
		bus.Handle(p.from(i))
		o.Events, o.PolicyMu = bus, p.polMu
		o.Persist = func(policy.State) { p.save(po.persist) }
		o.Awaiting, o.InFlight, o.Load, o.Progress = po.awaiting, po.inFlight, po.load, po.progress
		o.OnDying = func() { p.dying(i) }
		if p.standby {
			o.Log = log.With(zap.String("vllm", vllmName(i)))
			o.MayRestore = func() bool { return p.isServing(i) }
			p.servingOnly(i, &o, po)
			if i == 1 {
				// The monitor watches vLLM a's devices ([gpu] devices, or
				// [vllm] env's CUDA_VISIBLE_DEVICES): b's are its own.
				o.GPU, o.Health, o.Args = nil, nil, nil
			}
			if p.sleepMode {
				p.sleepGPU(i, &o, c)
			}
		}
		sup, err := supervisor.New(c, o)
		if err != nil {
			return nil, err
		}
		p.m = append(p.m, &member{sup: sup, port: c.VLLM.Port})
	}
	return p, nil
}

// servingOnly gives vLLM i the proxy's and the scraper's readings only
// while it serves: a standby has no client traffic (no drain to wait for,
// no work in flight to call stuck) and no scrape of its own.
func (p *pair) servingOnly(i int, o *supervisor.Options, po pairOptions) {
	if po.awaiting != nil {
		o.Awaiting = func() (int, float64) {
			if !p.isServing(i) {
				return 0, 0
			}
			return po.awaiting()
		}
	}
	if po.inFlight != nil {
		o.InFlight = func() int {
			if !p.isServing(i) {
				return 0
			}
			return po.inFlight()
		}
	}
	o.Load = func() (float64, float64, bool) {
		if !p.isServing(i) || po.load == nil {
			return 0, 0, false
		}
		return po.load()
	}
	o.Progress = func() (float64, float64, bool) {
		if !p.isServing(i) || po.progress == nil {
			return 0, 0, false
		}
		return po.progress()
	}
}

func (p *pair) isServing(i int) bool { return int(p.serving.Load()) == i }

// save writes the shared ladder's state newest-first: each supervisor's
// writer calls it, and whichever comes last writes the state as it is
// then, never an older one read earlier by the other.
func (p *pair) save(persist func(policy.State)) {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	p.polMu.Lock()
	st := p.pol.State()
	p.polMu.Unlock()
	persist(st)
}

// current is the ladder's rung now (the next start's).
func (p *pair) current() policy.Rung {
	p.polMu.Lock()
	defer p.polMu.Unlock()
	return p.pol.Current()
}

// from is how vLLM i's events reach the guard: each one may change which
// vLLM serves (decide), and goes on tagged with the vLLM and its role.
func (p *pair) from(i int) func(events.Event) {
	return func(e events.Event) {
		if !p.standby {
			p.out(e)
			return
		}
		if e.Kind == events.KindReady && i == 0 && !p.sleepMode {
			p.firstOnce.Do(func() { close(p.firstReady) })
		}
		p.mu.Lock()
		if p.sleepMode && e.Kind == events.KindState && e.State == string(status.StateReady) {
			// (The state event comes first: the decision below must
			// already see a standby that is to sleep.)
			p.onReadySleepLocked(i)
		}
		// Sleep mode: a vLLM that served backs off once its tree is gone
		// and its memory released: the sleeping standby is woken now, not
		// at the end of the backoff (the free-memory check before the
		// restart wakes it too, when nothing did).
		wake := p.sleepMode && e.Kind == events.KindState && e.State == string(status.StateBackoff)
		fo, restart := p.stepLocked(e.Time)
		e.VLLM, e.Role = vllmName(i), p.roleLocked(i)
		switch {
		case e.Kind == events.KindExited && p.diedServing[i] != nil:
			// It died serving; the standby took over.
			e.Role, e.Failover = events.RoleServing, p.diedServing[i]
			p.diedServing[i] = nil
		case e.Kind == events.KindReady:
			p.diedServing[i] = nil
		}
		p.mu.Unlock()
		if wake {
			p.holdForWake(i)
		}
		// The failover first: the proxy must see the serving vLLM go
		// before anything shows the other one ready (Guard.onFailover).
		p.announce(fo, restart)
		p.out(e)
	}
}

// dying: vLLM i's engine died or its API server finished, its status still
// ready: the proxy is told now (onLost), and the standby takes over now,
// not at the exit.
func (p *pair) dying(i int) {
	if f := p.onLost; f != nil && p.isServing(i) {
		f()
	}
	if !p.standby {
		return
	}
	p.mu.Lock()
	fo, restart := p.stepLocked(time.Now())
	p.mu.Unlock()
	p.announce(fo, restart)
}

// announce publishes a failover or swap and starts a planned restart.
func (p *pair) announce(fo *events.Failover, r restartOrder) {
	if fo != nil {
		p.out(events.Event{Kind: events.KindFailover, Time: fo.At, VLLM: fo.To, Role: events.RoleServing, Reason: fo.Why, Failover: fo})
	}
	if r.i >= 0 {
		go func() {
			if err := p.m[r.i].sup.Restart(p.life, "the guard: "+r.why); err != nil && p.life.Err() == nil {
				p.log.Warn("the planned restart of the standby vLLM was not taken", zap.String("vllm", vllmName(r.i)), zap.Error(err))
			}
		}()
	}
}

func (p *pair) roleLocked(i int) string {
	if p.isServing(i) {
		return events.RoleServing
	}
	return events.RoleStandby
}

// stepLocked reads both vLLMs and the ladder at now and applies the
// decision: the failover or swap it made (nil: none) and the vLLM to
// restart on purpose (once per stretch of readiness).
func (p *pair) stepLocked(now time.Time) (*events.Failover, restartOrder) {
	fo, mv := p.switchLocked(now)
	r := restartOrder{i: -1}
	if mv.Restart >= 0 && !p.restarting[mv.Restart] {
		p.restarting[mv.Restart] = true
		r = restartOrder{i: mv.Restart, why: mv.Why}
	}
	return fo, r
}

// switchLocked reads both vLLMs and the ladder at now and makes the
// decision's failover or swap (nil: none).
func (p *pair) switchLocked(now time.Time) (*events.Failover, pairMove) {
	s := int(p.serving.Load())
	v := pairView{Serving: s, Current: p.current()}
	final := false
	for i, m := range p.m {
		st := m.sup.Status()
		v.V[i] = vllmView{State: st.State, Rung: st.Rung}
		if st.State == status.StateReady && m.sup.Dying() {
			v.V[i].State = stateDying
		}
		p.sleepViewLocked(i, &v.V[i])
		if !v.V[i].ready() {
			p.restarting[i] = false
		}
		final = final || (st.State == status.StateStopping && status.FinalStop(st.Reason))
	}
	switch {
	case v.V[s].ready():
		p.leftAt = time.Time{}
	case p.leftAt.IsZero():
		p.leftAt = now
	}
	if final || p.stopped.Load() {
		return nil, pairMove{Serve: s, Restart: -1} // the guard stops both: the serving one drains where it is
	}
	mv := decide(v)
	if mv.Serve == s {
		return nil, mv
	}
	p.serving.Store(int32(mv.Serve))
	p.sl.served[mv.Serve] = true
	fo := &events.Failover{From: vllmName(s), To: vllmName(mv.Serve), Swap: mv.Swap, Why: mv.Why, Left: now, At: now}
	if mv.Failover {
		fo.Left = p.leftAt
		p.failovers++
		p.last = fo
		p.diedServing[s] = fo
	} else {
		p.swaps++
	}
	fo.Seconds = fo.At.Sub(fo.Left).Seconds()
	p.leftAt = time.Time{}
	return fo, mv
}

// Run runs vLLM a's supervisor, and b's from a's first ready, until ctx
// ends or the serving vLLM's supervisor ends (it gave up with no standby
// ready to take over); it returns the serving one's exit code. A standby
// whose supervisor ends is reported, and the guard serves without one.
func (p *pair) Run(ctx context.Context) int {
	if !p.standby {
		return p.runOne(ctx, 0)
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.life = lctx
	go func() {
		<-lctx.Done() // the guard's stop, or Run's end: never outlives Run
		p.stopped.Store(true)
	}()
	type result struct{ i, code int }
	done := make(chan result, 2)
	first, second := 0, 1
	if p.sleepMode {
		// The standby first: it loads, then sleeps; then vLLM a.
		first, second = 1, 0
	}
	go func() {
		code := p.runOne(lctx, first)
		if p.sleepMode {
			p.startServingOnce() // a standby that ended before it slept
		}
		done <- result{first, code}
	}()
	go func() {
		select {
		case <-p.firstReady:
			if p.sleepMode {
				p.log.Info("the standby vLLM b sleeps: starting vLLM a", zap.Int("port", p.m[0].port))
			} else {
				p.log.Info("vLLM a is ready: starting the standby vLLM b", zap.Int("port", p.m[1].port))
			}
			done <- result{second, p.runOne(lctx, second)}
		case <-lctx.Done():
			done <- result{second, 0}
		}
	}()
	var codes [2]int
	for range 2 {
		r := <-done
		codes[r.i] = r.code
		switch {
		case lctx.Err() != nil:
		case p.isServing(r.i):
			p.log.Warn("the serving vLLM's supervisor ended with no standby ready to take over: the guard stops",
				zap.String("vllm", vllmName(r.i)), zap.Int("exit_code", r.code))
			p.stopped.Store(true)
			cancel()
		default:
			p.log.Warn("the standby vLLM's supervisor ended: the guard serves without a standby",
				zap.String("vllm", vllmName(r.i)), zap.Int("exit_code", r.code), zap.String("reason", p.m[r.i].sup.Status().Reason))
		}
	}
	return codes[p.serving.Load()]
}

func (p *pair) runOne(ctx context.Context, i int) int {
	m := p.m[i]
	m.running.Store(true)
	defer m.running.Store(false)
	return m.sup.Run(ctx)
}

// Status is the serving vLLM's status: the guard's public state.
func (p *pair) Status() status.Status { return p.m[p.serving.Load()].sup.Status() }

// lostView is vLLM name's status as a vLLM that no longer serves (not
// ready, whatever its status still says while it dies), and its port.
func (p *pair) lostView(name string) (status.Status, int) {
	for i, m := range p.m {
		if vllmName(i) == name {
			st := m.sup.Status()
			if st.State == status.StateReady {
				st.State, st.Reason = status.StateStopping, "vLLM "+name+" is dying: its standby takes over"
			}
			return st, m.port
		}
	}
	return p.gateView()
}

// gateView is what the proxy routes by: the serving vLLM's status with
// the ladder's admission bound (a promoted standby still on the old
// flags is held to the rung in force), and its port. A vLLM whose engine
// died or whose API server finished (Dying) is not ready to the proxy,
// whatever its status still says while it exits: what it cut is held and
// continued after the restart, and new requests wait for it.
func (p *pair) gateView() (status.Status, int) {
	m := p.m[p.serving.Load()]
	st := m.sup.Status()
	if st.State == status.StateReady && m.sup.Dying() {
		st.State, st.Reason = status.StateStopping, "vLLM is exiting: its engine died or its API server finished"
	}
	if p.standby {
		st.Rung = admitted(st.Rung, p.current())
	}
	return st, m.port
}

// LastTurn is the older of the running supervisors' last turns.
func (p *pair) LastTurn() time.Time {
	t := p.m[0].sup.LastTurn()
	for _, m := range p.m[1:] {
		if lt := m.sup.LastTurn(); m.running.Load() && lt.Before(t) {
			t = lt
		}
	}
	return t
}

// Kill asks both supervisors to stop waiting (a second stop signal).
func (p *pair) Kill() {
	for _, m := range p.m {
		m.sup.Kill()
	}
}

// Restart restarts the serving vLLM (an operator's restart): with a
// standby ready it serves at once, and the restarted one comes back as
// the standby.
func (p *pair) Restart(ctx context.Context, peer string) error {
	return p.m[p.serving.Load()].sup.Restart(ctx, peer)
}

// ResetProfile resets the one ladder (through the serving supervisor).
// RestartFor restarts the serving vLLM for why (its weight cache daemon
// died: a standby, if ready, takes over).
func (p *pair) RestartFor(ctx context.Context, why string) error {
	return p.m[p.serving.Load()].sup.RestartFor(ctx, why)
}

func (p *pair) ResetProfile(ctx context.Context, peer string) error {
	return p.m[p.serving.Load()].sup.ResetProfile(ctx, peer)
}

// Reload hands the new configuration to both supervisors (b's with its
// port and env); [standby] mode and port themselves apply at the guard's
// next start.
func (p *pair) Reload(ctx context.Context, cfg *config.Config) (pending bool, err error) {
	pending, err = p.m[0].sup.Reload(ctx, cfg)
	if err != nil || len(p.m) < 2 {
		return pending, err
	}
	sc := cfg.StandbyConfig()
	sc.VLLM.Port = p.m[1].port
	pb, err := p.m[1].sup.Reload(ctx, sc)
	return pending || pb, err
}

// DialVLLM dials the vLLM whose port addr names, through that vLLM's own
// supervisor: only a listener of its own process tree is reached.
func (p *pair) DialVLLM(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dials := make([]func(ctx context.Context, network, addr string) (net.Conn, error), len(p.m))
	for i, m := range p.m {
		dials[i] = m.sup.DialVLLM(d)
	}
	if !p.standby {
		return dials[0]
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(port)
		for i, m := range p.m {
			if m.port == n {
				return dials[i](ctx, network, addr)
			}
		}
		return nil, fmt.Errorf("%s is neither vLLM's port nor the standby's: not dialed", addr)
	}
}

// standbyDoc is what status says of the pair (nil without a standby).
func (p *pair) standbyDoc() *control.Standby {
	if !p.standby {
		return nil
	}
	s := int(p.serving.Load())
	d := &control.Standby{Mode: config.StandbyProcess, Serving: vllmName(s)}
	for i, m := range p.m {
		st := m.sup.Status()
		role := events.RoleStandby
		if i == s {
			role = events.RoleServing
		}
		d.VLLMs = append(d.VLLMs, control.StandbyVLLM{Name: vllmName(i), Role: role, Port: m.port, State: st.State, Reason: st.Reason,
			PID: st.PID, Rung: st.Rung.Index, MaxNumSeqs: st.Rung.MaxNumSeqs})
		if i != s {
			d.StandbyReady = st.State == status.StateReady
		}
	}
	st, _ := p.gateView()
	d.AdmittedMaxNumSeqs = st.Rung.MaxNumSeqs
	p.mu.Lock()
	d.Failovers, d.Swaps = p.failovers, p.swaps
	if p.last != nil {
		f := *p.last
		d.LastFailover = &f
	}
	p.mu.Unlock()
	return d
}

// firstToken records, for the last failover, the time from the death to
// the first continued token at; false: none is waiting for one (a second
// stream's, or one long after).
func (p *pair) firstToken(at time.Time) (float64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil || p.last.FirstTokenSeconds != 0 || at.Before(p.last.At) {
		return 0, false
	}
	f := *p.last // the event published holds the old one: never changed
	f.FirstTokenSeconds = max(at.Sub(f.Left).Seconds(), 1e-6)
	p.last = &f
	return f.FirstTokenSeconds, true
}

// sleepGPU gives vLLM i its GPU view in sleep mode: its start waits while
// the standby is woken (gatedGPU); the standby, with no view of its own,
// starts only beside a vLLM that sleeps or has no tree.
func (p *pair) sleepGPU(i int, o *supervisor.Options, c *config.Config) {
	if o.GPU != nil {
		o.GPU = &gatedGPU{GPU: o.GPU, own: true, p: p, i: i}
		return
	}
	_, crit := c.GPU.Thresholds(c.Profile.GPUMemoryUtilization)
	o.GPU = &gatedGPU{GPU: noGPU{critical: crit}, p: p, i: i}
}
