package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
)

// The step machine's scenarios, in fake time (testing/synctest), with no
// process, socket or GPU: a fake vLLM tree, a fake prober and a fake GPU
// stand behind the machine's ports. Each scenario drives events and checks
// the states, the effects and the published events.

// fakeVLLM is one launched "vLLM tree".
type fakeVLLM struct {
	spec     launchSpec
	apiPID   int
	apiGoneC chan struct{}
	doneC    chan struct{}
	exitv    exitInfo
	gone     sync.Once

	listening    atomic.Bool  // the fake prober answers only when set
	ioBytes      atomic.Int64 // storage I/O so far
	stops        atomic.Int32 // SIGTERMs received
	kills        atomic.Int32 // SIGKILLs received
	ignoreTERM   bool         // a vLLM that ignores SIGTERM
	outlivesKill bool         // a tree that SIGKILL does not end at once (its end is the test's)
	survivors    []int        // PIDs that outlive the keeper (killLeftovers)
	// stuckFor: the survivors take this long to die (stuck in the kernel);
	// unkillable: they never do (killLeftovers reports them after its rounds).
	stuckFor   time.Duration
	unkillable bool
	cleaning   atomic.Bool  // killLeftovers is in progress
	ours       map[int]bool // PIDs still ours (killIfOurs)
	killed     []int        // PIDs killIfOurs killed
	mu         sync.Mutex
}

func (p *fakeVLLM) PID() int                 { return p.apiPID }
func (p *fakeVLLM) APIGone() <-chan struct{} { return p.apiGoneC }
func (p *fakeVLLM) Done() <-chan struct{}    { return p.doneC }
func (p *fakeVLLM) Exit() exitInfo           { return p.exitv }
func (p *fakeVLLM) Refresh()                 {}
func (p *fakeVLLM) Tree() []int              { return []int{p.apiPID} }
func (p *fakeVLLM) Seen() []int              { return []int{p.apiPID, p.apiPID + 1} }

func (p *fakeVLLM) KillLeftovers() (outlived, unkillable []int) {
	p.cleaning.Store(true)
	defer p.cleaning.Store(false)
	time.Sleep(p.stuckFor) // fake time (synctest): what a wait in the kernel costs
	if p.unkillable {
		return p.survivors, p.survivors
	}
	return p.survivors, nil
}

func (p *fakeVLLM) Lingering() []lingerer {
	if !p.cleaning.Load() {
		return nil
	}
	var out []lingerer
	for _, pid := range p.survivors {
		out = append(out, lingerer{PID: pid, State: 'D', WChan: "nvidia_wait_for_gpu"})
	}
	return out
}

// io is the tree's storage I/O: ioBytes grows while the fake "downloads".
func (p *fakeVLLM) IO() map[int]uint64 { return map[int]uint64{p.apiPID: uint64(p.ioBytes.Load())} }

func (p *fakeVLLM) KillIfOurs(pid int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ours[pid] {
		return false
	}
	p.killed = append(p.killed, pid)
	return true
}

func (p *fakeVLLM) Stop() {
	p.stops.Add(1)
	if !p.ignoreTERM {
		p.end(exitInfo{Code: 0})
	}
}

func (p *fakeVLLM) Kill() {
	p.kills.Add(1)
	if !p.outlivesKill {
		p.end(exitInfo{Code: -1, Signal: "SIGKILL"})
	}
}

// end: the API server exits, then the keeper cleans up and exits.
func (p *fakeVLLM) end(e exitInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gone.Do(func() {
		p.exitv = e
		close(p.apiGoneC)
		close(p.doneC)
	})
}

// print writes lines to the fake's stdout (or stderr with "stderr:"); a
// tree that is gone prints nothing (as a real one: its pipes are closed).
func (p *fakeVLLM) print(lines ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.doneC:
		return
	default:
	}
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "stderr:"); ok {
			fmt.Fprintln(p.spec.Stderr, rest)
			continue
		}
		fmt.Fprintln(p.spec.Stdout, l)
	}
}

// fakeLauncher hands out fakeVLLMs and keeps them.
type fakeLauncher struct {
	mu      sync.Mutex
	started []*fakeVLLM
	fail    error // the launch itself fails
	setup   func(p *fakeVLLM)
}

func (l *fakeLauncher) Launch(spec launchSpec) (proc, error) {
	if l.fail != nil {
		return nil, l.fail
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p := &fakeVLLM{spec: spec, apiPID: 1000 + 10*len(l.started), apiGoneC: make(chan struct{}), doneC: make(chan struct{}),
		ours: map[int]bool{}}
	if l.setup != nil {
		l.setup(p)
	}
	l.started = append(l.started, p)
	return p, nil
}

func (l *fakeLauncher) n() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.started)
}

func (l *fakeLauncher) last() *fakeVLLM {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started[len(l.started)-1]
}

// fakeProber answers for the last launched fake: refused until it listens,
// then what the scenario says.
type fakeProber struct {
	l         *fakeLauncher
	mu        sync.Mutex
	readyR    func() probeResult // nil: ok
	healthR   func() probeResult // nil: ok
	pausedR   func() probeResult // nil: 404, as vLLM without dev mode answers /is_paused
	calls     atomic.Int64       // readiness probes asked
	healths   atomic.Int64       // liveness probes asked
	pauses    atomic.Int64       // /is_paused asked
	nowPaused atomic.Bool        // a slow /is_paused answer says paused (substate_test.go)
	own       atomic.Bool        // answers come over connections checked to reach vLLM's own listener
}

func (f *fakeProber) Ready(ctx context.Context, level string, timeout time.Duration) probeResult {
	f.calls.Add(1)
	if !f.l.last().listening.Load() {
		return probeResult{Step: "health", Refused: true, Err: "connection refused"}
	}
	f.mu.Lock()
	r := f.readyR
	f.mu.Unlock()
	if r != nil {
		return r()
	}
	return probeResult{OK: true, Step: level, Status: 200, Own: f.own.Load()}
}

func (f *fakeProber) Health(ctx context.Context, timeout time.Duration) probeResult {
	f.healths.Add(1)
	return f.answer(&f.healthR, probeResult{OK: true, Step: "health", Status: 200})
}

func (f *fakeProber) Paused(ctx context.Context, timeout time.Duration) probeResult {
	f.pauses.Add(1)
	return f.answer(&f.pausedR, probeResult{Step: "paused", Status: 404, Err: "GET /is_paused answered 404"})
}

// answer is what the test set in *r (read under mu), or def.
func (f *fakeProber) answer(r *func() probeResult, def probeResult) probeResult {
	f.mu.Lock()
	h := *r
	f.mu.Unlock()
	if h != nil {
		return h()
	}
	return def
}

func (f *fakeProber) setPaused(p bool) {
	f.mu.Lock()
	f.pausedR = func() probeResult { return probeResult{OK: true, Step: "paused", Status: 200, Paused: p} }
	f.mu.Unlock()
}

func (f *fakeProber) setHealth(h func() probeResult) { f.mu.Lock(); f.healthR = h; f.mu.Unlock() }
func (f *fakeProber) setReady(r func() probeResult)  { f.mu.Lock(); f.readyR = r; f.mu.Unlock() }
func (f *fakeProber) Close()                         {}

// fakeGPU is a GPU whose answers the scenario sets.
type fakeGPU struct {
	mu         sync.Mutex
	free       bool     // CheckFree's answer
	released   bool     // Released's answer
	held       []Holder // what Released names while not released
	fractions  []float64
	used       uint64
	total      uint64
	freeChecks int
	relChecks  int
	loading    bool
	slow       time.Duration // each NVML read takes this long (a GPU in trouble)
	readAt     time.Time     // when the sample Fullest answers from was read
}

func (g *fakeGPU) SetTree(func() []int) {}
func (g *fakeGPU) SetLoading(l bool)    { g.mu.Lock(); g.loading = l; g.mu.Unlock() }
func (g *fakeGPU) RecentFractions(n int) []float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.fractions)
}
func (g *fakeGPU) UsedBytes() []uint64 { return []uint64{g.used} }
func (g *fakeGPU) Fullest() (uint64, uint64, time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, g.total, g.readAt, g.total > 0
}
func (g *fakeGPU) Released([]int, []uint64) (bool, []Holder) {
	time.Sleep(g.slowRead())
	g.mu.Lock()
	defer g.mu.Unlock()
	g.relChecks++
	return g.released, g.held
}
func (g *fakeGPU) SetBudget(policy.Rung)     {}
func (g *fakeGPU) CriticalFraction() float64 { return 0.97 }
func (g *fakeGPU) slowRead() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.slow
}

func (g *fakeGPU) CheckFree(r policy.Rung) (bool, string, []Holder) {
	time.Sleep(g.slowRead())
	u := r.GPUMemoryUtilization
	g.mu.Lock()
	defer g.mu.Unlock()
	g.freeChecks++
	if g.free {
		return true, "", nil
	}
	return false, fmt.Sprintf("GPU 0: not enough for utilization %.2f", u), []Holder{{PID: 4242, Bytes: 40 << 30, Command: "python train.py"}}
}
func (g *fakeGPU) set(f func(g *fakeGPU)) { g.mu.Lock(); f(g); g.mu.Unlock() }

// scenario is one supervisor over fakes, running in a synctest bubble.
type scenario struct {
	t         *testing.T
	cfg       *config.Config
	sup       *Supervisor
	l         *fakeLauncher
	pr        *fakeProber
	gpu       *fakeGPU
	noGPU     bool
	holder    string        // who holds vLLM's port, as the trial bind says ("" = free); under mu once started
	slowPort  time.Duration // each trial bind takes this long
	binds     atomic.Int64  // trial binds of vLLM's port
	slowOOM   time.Duration // the first read of the OOM-kill count takes this long
	oomSlowed atomic.Bool
	health    GPUHealth // nil: no hardware view (gpufault_test.go)
	load      func() (float64, float64, bool)
	progress  func() (float64, float64, bool)
	awaiting  func() (int, float64)
	inFlight  func() int
	before    func(context.Context) error // Options.BeforeLaunch
	pstate    policy.State
	oom       atomic.Int64

	mu     sync.Mutex
	events []events.Event
	saved  int
	subs   []subState // the machine's sub-states, in order, from idle
	cells  [][2]int   // the cells of the table the events fell in, in order

	persist func(policy.State) // the state file; nil: saves are counted
	group   Group              // [group]'s member (group_test.go); nil: none

	starts      *starttimes.Book     // the record of starts (nil: none)
	savedStarts []starttimes.History // what was saved of it, in order

	cancel context.CancelFunc
	code   chan int
}

func newScenario(t *testing.T, edit func(c *config.Config)) *scenario {
	cfg := config.Default()
	cfg.VLLM.Command = []string{"vllm", "serve", "m"}
	cfg.VLLM.StopTimeout = config.Duration{Duration: 30 * time.Second}
	cfg.Readiness.PollInterval = config.Duration{Duration: 250 * time.Millisecond}
	cfg.Readiness.StallTimeout = config.Duration{Duration: 10 * time.Minute}
	cfg.Restart.Jitter = 0
	if edit != nil {
		edit(cfg)
	}
	l := &fakeLauncher{}
	return &scenario{t: t, cfg: cfg, l: l, pr: &fakeProber{l: l}, gpu: &fakeGPU{free: true, released: true, total: 80 << 30}}
}

// stuckAfter sets stuck_timeout to d.
func stuckAfter(d time.Duration) func(c *config.Config) {
	return func(c *config.Config) { c.Liveness.StuckTimeout = config.Duration{Duration: d} }
}

// gauges is vLLM's running and waiting gauges, fixed (ok: vLLM has metrics).
func gauges(running, waiting float64, ok bool) func() (float64, float64, bool) {
	return func() (float64, float64, bool) { return running, waiting, ok }
}

// runReady runs a scenario in fake time (synctest) over a machine that
// started and became ready; body drives and checks it.
func runReady(t *testing.T, edit func(c *config.Config), body func(t *testing.T, s *scenario)) {
	t.Helper()
	runScenario(t, edit, func(t *testing.T, s *scenario) {
		s.startReady()
		body(t, s)
	})
}

// runScenario runs a scenario in fake time (synctest); body sets the
// machine up, starts it, drives and checks it.
func runScenario(t *testing.T, edit func(c *config.Config), body func(t *testing.T, s *scenario)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		body(t, newScenario(t, edit))
	})
}

// start runs the supervisor; call inside synctest.Test.
func (s *scenario) start() {
	bus := events.NewBus()
	bus.Handle(func(e events.Event) {
		s.mu.Lock()
		s.events = append(s.events, e)
		s.mu.Unlock()
	})
	persist := s.persist
	if persist == nil {
		persist = func(policy.State) { s.mu.Lock(); s.saved++; s.mu.Unlock() }
	}
	opts := Options{Policy: policy.New(s.cfg.Policy(), s.pstate, realClockForTest{}), Events: bus, Keeper: []string{"keeper"},
		Persist: persist, Load: s.load, Progress: s.progress, Awaiting: s.awaiting, InFlight: s.inFlight, BeforeLaunch: s.before}
	if !s.noGPU {
		opts.GPU = s.gpu
	}
	opts.Health = s.health
	opts.StartTimes, opts.SaveStarts = s.starts, s.saveStarts
	opts.Group = s.group
	sup, err := New(s.cfg, opts)
	if err != nil {
		s.t.Fatal(err)
	}
	sup.launcher = s.l
	sup.newProber = func(launch.Endpoint, string, func() []int) checker { return s.pr }
	sup.hostOOM = func() int64 {
		if s.slowOOM > 0 && s.oomSlowed.CompareAndSwap(false, true) {
			time.Sleep(s.slowOOM)
		}
		return s.oom.Load()
	}
	sup.portHolder = func(string, int) string {
		s.binds.Add(1)
		time.Sleep(s.slowPort)
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.holder
	}
	s.subs = []subState{subIdle}
	sup.traceSub = func(_, to subState) { s.mu.Lock(); s.subs = append(s.subs, to); s.mu.Unlock() }
	sup.traceCell = func(sub subState, k evKind) {
		s.mu.Lock()
		s.cells = append(s.cells, [2]int{int(sub), int(k)})
		s.mu.Unlock()
	}
	s.sup = sup
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.code = make(chan int, 1)
	go func() { s.code <- sup.Run(ctx) }()
	// A failed scenario still ends its supervisor, or the bubble would
	// report a deadlock over the test's own message.
	s.t.Cleanup(func() {
		cancel()
		s.l.mu.Lock()
		for _, p := range s.l.started {
			p.end(exitInfo{Code: -1, Signal: "SIGKILL"})
		}
		s.l.mu.Unlock()
		synctest.Wait()
	})
	synctest.Wait()
}

type realClockForTest struct{}

func (realClockForTest) Now() time.Time { return time.Now() }

// advance lets fake time pass, then waits until every goroutine is blocked.
func (s *scenario) advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// state is the public state now.
func (s *scenario) state() State { return s.sup.Status().State }

func (s *scenario) wantState(want State) {
	s.t.Helper()
	if st := s.sup.Status(); st.State != want {
		s.t.Fatalf("state %s (%s), want %s", st.State, st.Reason, want)
	}
}

// wantSignals: p got stops SIGTERMs and kills SIGKILLs so far; why says when.
func (s *scenario) wantSignals(p *fakeVLLM, stops, kills int32, why string) {
	s.t.Helper()
	if p.stops.Load() != stops || p.kills.Load() != kills {
		s.t.Fatalf("%s: %d SIGTERM, %d SIGKILL; want %d and %d", why, p.stops.Load(), p.kills.Load(), stops, kills)
	}
}

// wantKills: p got n SIGKILLs so far; why says when.
func (s *scenario) wantKills(p *fakeVLLM, n int32, why string) {
	s.t.Helper()
	if got := p.kills.Load(); got != n {
		s.t.Fatalf("%s: %d SIGKILL, want %d", why, got, n)
	}
}

// wantStops: p got n SIGTERMs so far; why says when.
func (s *scenario) wantStops(p *fakeVLLM, n int32, why string) {
	s.t.Helper()
	if got := p.stops.Load(); got != n {
		s.t.Fatalf("%s: %d SIGTERM, want %d", why, got, n)
	}
}

// wantFailures: n failures were published so far; why says when.
func (s *scenario) wantFailures(n int, why string) {
	s.t.Helper()
	if got := len(s.kinds(events.KindExited)); got != n {
		s.t.Fatalf("%s: %d failures, want %d", why, got, n)
	}
}

// wantLaunches: vLLM was launched n times so far; why says when.
func (s *scenario) wantLaunches(n int, why string) {
	s.t.Helper()
	if got := s.l.n(); got != n {
		s.t.Fatalf("%s: %d launches, want %d", why, got, n)
	}
}

// wantExited waits for Run to return by itself with the exit code want.
func (s *scenario) wantExited(want int, why string) {
	s.t.Helper()
	if code := s.exited(); code != want {
		s.t.Fatalf("%s: exit %d, want %d; status %+v", why, code, want, s.sup.Status())
	}
}

// wantStopped stops Run and checks its exit code.
func (s *scenario) wantStopped(want int, why string) {
	s.t.Helper()
	if code := s.stop(); code != want {
		s.t.Fatalf("%s: exit %d, want %d", why, code, want)
	}
}

// printEvery: p prints line n times, every d of fake time.
func (s *scenario) printEvery(p *fakeVLLM, line string, n int, d time.Duration) {
	for range n {
		p.print(line)
		s.advance(d)
	}
}

// startReady starts the machine and waits until it is ready.
func (s *scenario) startReady() {
	s.t.Helper()
	s.start()
	s.ready()
}

// ready makes the last fake load and listen, and waits for ready.
func (s *scenario) ready() {
	s.t.Helper()
	p := s.l.last()
	p.print("INFO 10-14 12:00:00 [loader.py:1] Loading weights took 1.13 seconds")
	p.listening.Store(true)
	p.print("stderr:INFO:     Application startup complete.")
	synctest.Wait()
	s.wantState(StateReady)
}

// stop cancels Run and returns its exit code.
func (s *scenario) stop() int {
	s.t.Helper()
	s.cancel()
	return s.returned("did not return after the stop")
}

// exited waits for Run to return by itself.
func (s *scenario) exited() int {
	s.t.Helper()
	return s.returned("has not returned")
}

// returned waits until every goroutine is blocked and returns Run's exit
// code; Run still running fails the test (not says how).
func (s *scenario) returned(not string) int {
	s.t.Helper()
	synctest.Wait()
	select {
	case c := <-s.code:
		return c
	default:
		s.t.Fatalf("Run %s; state %s (%s)", not, s.state(), s.sup.Status().Reason)
		return -1
	}
}

func (s *scenario) kinds(k events.Kind) []events.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []events.Event
	for _, e := range s.events {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// failure is the n-th (from 1) exited event's failure.
func (s *scenario) failure(n int) *events.Failure {
	s.t.Helper()
	ex := s.kinds(events.KindExited)
	if len(ex) < n {
		s.t.Fatalf("%d failures published, want at least %d", len(ex), n)
	}
	return ex[n-1].Failure
}

// noFailure fails the scenario if a failure was published; why says what
// the scenario had to avoid.
func (s *scenario) noFailure(why string) {
	s.t.Helper()
	if ex := s.kinds(events.KindExited); len(ex) != 0 {
		s.t.Fatalf("%s: %+v", why, ex[0].Failure)
	}
}

// wantCause: the n-th (from 1) failure is of cause c; it returns that
// failure for the scenario's further checks.
func (s *scenario) wantCause(n int, c cause.Cause) *events.Failure {
	s.t.Helper()
	f := s.failure(n)
	if f.Verdict.Cause != c {
		s.t.Fatalf("failure %d: cause %s, want %s: %+v", n, f.Verdict.Cause, c, f)
	}
	return f
}

func (s *scenario) states() []string {
	var out []string
	for _, e := range s.kinds(events.KindState) {
		out = append(out, e.State)
	}
	return out
}

func argvHas(argv []string, flag, value string) bool {
	for i, a := range argv {
		if a == flag && i+1 < len(argv) && argv[i+1] == value {
			return true
		}
	}
	return false
}

func TestMachineStartsAndBecomesReadyOnStartupComplete(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Readiness.PollInterval = config.Duration{Duration: time.Hour} }, func(t *testing.T, s *scenario) {
		s.start()
		s.wantState(StateStarting)
		s.wantLaunches(1, "vLLM launches")
		p := s.l.last()
		if !argvHas(p.spec.Argv, "--max-num-seqs", "256") || !argvHas(p.spec.Argv, "--gpu-memory-utilization", "0.85") {
			t.Fatalf("argv %v lacks rung 0's profile", p.spec.Argv)
		}
		// Loading: a phase is progress, and no probe has been answered.
		p.print("INFO 10-14 12:00:00 [loader.py:1] Loading weights took 1.13 seconds")
		synctest.Wait()
		if st := s.sup.Status(); st.State != StateStarting || st.Phase == "" {
			t.Fatalf("while loading: %+v", st)
		}
		if len(s.kinds(events.KindProgress)) == 0 {
			t.Fatal("no progress event for a load phase")
		}
		// The startup line probes at once, without waiting for the (hour-long) poll.
		p.listening.Store(true)
		p.print("stderr:INFO:     Application startup complete.")
		synctest.Wait()
		s.wantState(StateReady)
		r := s.kinds(events.KindReady)
		if len(r) != 1 || !r[0].First || r[0].PID != p.apiPID {
			t.Fatalf("ready events %+v", r)
		}
		if s.gpu.loading {
			t.Fatal("the GPU monitor still thinks vLLM is loading")
		}
		s.wantStopped(exitcode.OK, "the stop")
		s.wantSignals(p, 1, 0, "stop: want one SIGTERM")
		s.wantState(StateStopped)
		if got := s.kinds(events.KindStopped); len(got) != 1 || *got[0].ExitCode != 0 {
			t.Fatalf("stopped events %+v", got)
		}
	})
}

func TestMachineNotReadyWhileProbesFail(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		p.print("INFO 12-03 12:00:00 [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:8000")
		p.listening.Store(true)
		s.pr.setReady(func() probeResult {
			return probeResult{Step: "completion", Status: 500, Err: "POST /v1/completions answered 500"}
		})
		s.advance(5 * time.Second)
		st := s.sup.Status()
		if st.State != StateStarting || !strings.Contains(st.LastProbe, "answered 500") {
			t.Fatalf("status %+v", st)
		}
		if len(s.kinds(events.KindProbeFailed)) == 0 {
			t.Fatal("no probe_failed event")
		}
		s.pr.setReady(nil)
		s.advance(time.Second)
		s.wantState(StateReady)
		s.stop()
	})
}

// TestMachineStartEndsWhenTheProbeKeepsGettingA4xx: vLLM's server is up
// and refuses the readiness request (a task it does not serve, say): the
// start ends with that answer as its reason instead of waiting for ever
// (issue 24 item 2). A 5xx while starting keeps waiting (the test above).
func TestMachineStartEndsWhenTheProbeKeepsGettingA4xx(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Readiness.MaxStartTime = config.Duration{} }, func(t *testing.T, s *scenario) {
		s.start()
		s.l.last().listening.Store(true)
		s.pr.setReady(func() probeResult {
			return probeResult{Step: "embeddings", Status: 404, Err: "POST /v1/embeddings answered 404"}
		})
		s.advance(refusedProbeLimit - time.Second)
		s.noFailure("ended before refusedProbeLimit")
		s.advance(2 * time.Second)
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseHang || !strings.Contains(f.Verdict.Summary, "refused the readiness probe") ||
			!strings.Contains(f.Verdict.Summary, "/v1/embeddings answered 404") {
			t.Fatalf("failure %+v", f.Verdict)
		}
		s.stop()
	})
}

// The fault matrix, one scenario per row that the machine decides.

func TestMachineFaultOOMStepsDownAfterTheRelease(t *testing.T) {
	runScenario(t, func(c *config.Config) {
		c.GPU.ReleaseTimeout = config.Duration{Duration: 60 * time.Second}
	}, func(t *testing.T, s *scenario) {
		s.gpu.released = false
		s.startReady()
		p := s.l.last()
		p.print("ERROR 10-14 12:01:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
		p.end(exitInfo{Code: 0}) // vLLM exits 0 after an engine death
		synctest.Wait()
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseOOM || f.Decision.Rung.Index != 1 || f.Phase != cause.PhaseReady {
			t.Fatalf("failure %+v", f)
		}
		st := s.sup.Status()
		if st.State != StateWaitingGPU || st.Restarts[cause.CauseOOM] != 1 {
			t.Fatalf("after the OOM: %+v", st)
		}
		// The release takes 40 s: the loop keeps turning all the while.
		s.loopTurnsEachSecond(40, "the release wait", nil)
		s.wantState(StateWaitingGPU)
		s.gpu.set(func(g *fakeGPU) { g.released = true })
		s.advance(time.Second)
		s.wantState(StateBackoff)
		s.advance(s.cfg.Restart.InitialDelay.Duration)
		s.wantLaunches(2, "after the backoff")
		if argv := s.l.last().spec.Argv; !argvHas(argv, "--max-num-seqs", "128") || !argvHas(argv, "--gpu-memory-utilization", "0.8") {
			t.Fatalf("rung 1 argv %v", argv)
		}
		s.ready()
		if got := s.sup.Status().Rung.Index; got != 1 {
			t.Fatalf("rung %d", got)
		}
		s.stop()
	})
}

func TestMachineFaultReleaseTimeoutKillsOnlyOurSurvivors(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.GPU.ReleaseTimeout = config.Duration{Duration: 10 * time.Second} }, func(t *testing.T, s *scenario) {
		s.gpu.released = false
		s.startReady()
		p := s.l.last()
		p.mu.Lock()
		p.ours[p.apiPID+1] = true
		p.mu.Unlock()
		// NVML lists the orphaned EngineCore (ours) and a reused PID (not ours).
		s.gpu.set(func(g *fakeGPU) {
			g.held = []Holder{{PID: p.apiPID + 1, Bytes: 60 << 30, Command: "VLLM::EngineCore"}, {PID: p.apiPID, Bytes: 1 << 30, Command: "sleep 1000"}}
		})
		p.end(exitInfo{Code: -1, Signal: "SIGKILL"})
		synctest.Wait()
		s.advance(10 * time.Second)
		p.mu.Lock()
		killed := slices.Clone(p.killed)
		p.mu.Unlock()
		if !slices.Equal(killed, []int{p.apiPID + 1}) {
			t.Fatalf("killed %v, want only the orphan %d", killed, p.apiPID+1)
		}
		// A second wait after the kill; still held: give up waiting and back off.
		s.wantState(StateWaitingGPU)
		s.advance(10 * time.Second)
		s.wantState(StateBackoff)
		s.stop()
	})
}

func TestMachineFaultIgnoredSIGTERMIsEscalated(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true }
		s.startReady()
		p := s.l.last()
		s.cancel()
		synctest.Wait()
		s.wantState(StateStopping)
		s.loopTurnsEachSecond(29, "the stop timeout", nil)
		s.wantKills(p, 0, "SIGKILL before stop_timeout")
		s.advance(time.Second)
		s.wantKills(p, 1, "no SIGKILL after stop_timeout")
		s.wantExited(exitcode.OK, "the exit")
		s.noFailure("a stop on request was recorded as a failure")
	})
}

func TestMachineFaultExitZeroIsAFailure(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.l.last().print("ERROR 10-14 12:01:00 [core.py:1] EngineCore encountered a fatal error.")
		s.l.last().end(exitInfo{Code: 0})
		synctest.Wait()
		if f := s.failure(1); f.Verdict.Cause != cause.CauseCrash || f.Decision.Action != policy.ActionRestart || f.Decision.Rung.Index != 0 {
			t.Fatalf("failure %+v", f)
		}
		s.advance(s.cfg.Restart.InitialDelay.Duration)
		s.wantLaunches(2, "vLLM launches")
		s.ready()
		s.stop()
	})
}

func TestMachineFaultSegfaultAndKilledAPIServer(t *testing.T) {
	for _, sig := range []string{"SIGSEGV", "SIGKILL"} {
		t.Run(sig, func(t *testing.T) {
			runReady(t, nil, func(t *testing.T, s *scenario) {
				s.l.last().survivors = []int{77}
				s.l.last().end(exitInfo{Code: -1, Signal: sig})
				synctest.Wait()
				f := s.failure(1)
				if f.Verdict.Cause != cause.CauseCrash || f.Exit != "killed by "+sig {
					t.Fatalf("failure %+v", f)
				}
				s.stop()
			})
		})
	}
}

func TestMachineFaultHostOOMKill(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.oom.Add(1) // the cgroup's oom_kill counter went up
		s.l.last().end(exitInfo{Code: -1, Signal: "SIGKILL"})
		synctest.Wait()
		s.wantCause(1, cause.CauseHostOOM)
		s.stop()
	})
}

// The OOM killer took a child (the EngineCore, a worker) and the API
// server exited by itself: still the host's memory.
func TestMachineFaultHostOOMKillOfAChild(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.oom.Add(1)
		s.l.last().end(exitInfo{Code: 0})
		synctest.Wait()
		s.wantCause(1, cause.CauseHostOOM)
		s.stop()
	})
}

func TestMachineFaultStallWhileLoadingIsAHang(t *testing.T) {
	runScenario(t, func(c *config.Config) {
		c.Readiness.StallTimeout = config.Duration{Duration: 8 * time.Second}
		c.VLLM.StopTimeout = config.Duration{Duration: 3 * time.Second}
	}, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		// Lines keep coming for 20 s: progress, not a stall.
		s.printEvery(p, "INFO 10-14 12:00:00 [loader.py:1] Loading safetensors checkpoint shards:  50% Completed | 1/2", 10, 2*time.Second)
		s.wantState(StateStarting)
		// Then silence.
		s.advance(9 * time.Second)
		s.wantSignals(p, 0, 1, "after the stall: a hung vLLM is killed without a drain")
		s.wantCause(1, cause.CauseHang)
		stopping := false
		for _, e := range s.kinds(events.KindState) {
			stopping = stopping || e.State == "stopping" && strings.Contains(e.Reason, "no load progress (no output, no disk I/O) for 8s while starting (stall_timeout 8s)")
		}
		if !stopping {
			t.Fatalf("no stopping state naming the stall: %v", s.kinds(events.KindState))
		}
		s.stop()
	})
}

func TestMachineFaultNeverReadyHitsMaxStartTime(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Readiness.MaxStartTime = config.Duration{Duration: 20 * time.Second} }, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		s.printEvery(p, "INFO 10-14 12:00:00 [loader.py:1] still loading", 15, 2*time.Second)
		s.wantCause(1, cause.CauseHang)
		s.stop()
	})
}

func TestMachineFaultHangWhileReady(t *testing.T) {
	runScenario(t, func(c *config.Config) {
		c.Liveness.Interval = config.Duration{Duration: 10 * time.Second}
		c.Liveness.Failures = 3
	}, func(t *testing.T, s *scenario) {
		s.startReady()
		s.pr.setHealth(func() probeResult {
			return probeResult{Step: "health", Err: "context deadline exceeded"}
		})
		s.advance(20 * time.Second)
		s.noFailure("killed before `failures` consecutive failures")
		s.advance(10 * time.Second)
		if f := s.failure(1); f.Verdict.Cause != cause.CauseHang || f.Phase != cause.PhaseReady {
			t.Fatalf("failure %+v", f)
		}
		s.stop()
	})
}

func TestMachineFaultHealth503(t *testing.T) {
	t.Run("vLLM exits by itself within the grace", func(t *testing.T) {
		runReady(t, func(c *config.Config) { c.Liveness.Interval = config.Duration{Duration: 5 * time.Second} }, func(t *testing.T, s *scenario) {
			s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Status: 503, Err: "GET /health answered 503"} })
			s.advance(5 * time.Second)
			p := s.l.last()
			if len(s.kinds(events.KindExited)) != 0 || p.stops.Load() != 0 {
				t.Fatal("killed at the first 503")
			}
			p.print("ERROR 10-14 12:01:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.")
			p.end(exitInfo{Code: 0})
			synctest.Wait()
			s.wantCause(1, cause.CauseOOM)
			s.stop()
		})
	})
	t.Run("vLLM stays up", func(t *testing.T) {
		runReady(t, func(c *config.Config) { c.Liveness.Interval = config.Duration{Duration: 5 * time.Second} }, func(t *testing.T, s *scenario) {
			s.pr.setHealth(func() probeResult { return probeResult{Step: "health", Status: 503, Err: "GET /health answered 503"} })
			s.advance(5*time.Second + s.sup.engineDeadGrace())
			s.wantCause(1, cause.CauseHang)
			s.stop()
		})
	})
}

func TestMachineFaultBadFlagGivesUpWith78(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		p.print("stderr:usage: vllm serve [-h] [--max-num-seqs MAX_NUM_SEQS]",
			"stderr:vllm serve: error: unrecognized arguments: --max-num-seq 8")
		p.end(exitInfo{Code: 2})
		s.wantExited(exitcode.Config, "the exit")
		s.wantState(StateFailed)
		s.wantLaunches(1, "vLLM launches")
	})
}

func TestMachineFaultLaunchFailure(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.l.fail = errors.New("fork/exec /usr/bin/vllm-guard: no such file or directory")
		s.start()
		f := s.failure(1)
		if !strings.Contains(f.Exit, "could not start") {
			t.Fatalf("failure %+v", f)
		}
		s.stop()
	})
}

func TestMachineFaultCrashLoopGivesUp(t *testing.T) {
	runScenario(t, func(c *config.Config) {
		c.Restart.GiveUpAfter = 3
		c.Restart.InitialDelay = config.Duration{Duration: time.Second}
	}, func(t *testing.T, s *scenario) {
		s.start()
		var delays []time.Duration
		for i := range 3 {
			s.l.last().print("ERROR 10-14 12:00:00 [core.py:1] RuntimeError: boom")
			s.l.last().end(exitInfo{Code: 1})
			synctest.Wait()
			f := s.failure(i + 1)
			if i < 2 {
				delays = append(delays, f.Decision.Delay)
				s.advance(f.Decision.Delay)
			}
		}
		s.wantExited(exitcode.Failed, "the exit")
		if s.l.n() != 3 || len(delays) != 2 || delays[1] <= delays[0] {
			t.Fatalf("%d starts, delays %v: want 3 starts and a growing backoff", s.l.n(), delays)
		}
	})
}

func TestMachineGiveUpAndStay(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Restart.OnGiveUp = "stay" }, func(t *testing.T, s *scenario) {
		s.start()
		s.l.last().print("stderr:vllm serve: error: unrecognized arguments: --bogus")
		s.l.last().end(exitInfo{Code: 2})
		synctest.Wait()
		s.wantState(StateFailed)
		s.advance(10 * time.Second)
		if err := s.sup.Restart(context.Background(), "test"); err == nil || !strings.Contains(err.Error(), "gave up") {
			t.Fatalf("restart after giving up: %v", err)
		}
		s.wantStopped(exitcode.OK, "the stop")
		// The read in flight is an NVML call that cannot be cancelled: it
		// ends in its own time, and its answer goes nowhere.
		s.advance(time.Minute)
	})
}

func TestMachineWaitsForFreeGPUMemoryBeforeStarting(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.gpu.free = false
		s.start()
		st := s.sup.Status()
		if st.State != StateWaitingGPU || !strings.Contains(st.Reason, "not enough free GPU memory") || s.l.n() != 0 {
			t.Fatalf("status %+v, %d starts", st, s.l.n())
		}
		s.advance(30 * time.Second)
		s.wantLaunches(0, "started without free memory")
		s.gpu.set(func(g *fakeGPU) { g.free = true })
		s.advance(s.cfg.GPU.SampleInterval.Duration)
		s.wantState(StateStarting)
		s.stop()
	})
}

func TestMachineStopWhileWaiting(t *testing.T) {
	for _, where := range []string{"free memory", "backoff", "release"} {
		t.Run(where, func(t *testing.T) {
			runScenario(t, nil, func(t *testing.T, s *scenario) {
				switch where {
				case "free memory":
					s.gpu.free = false
					s.start()
				case "backoff":
					s.start()
					s.l.last().end(exitInfo{Code: 1})
					synctest.Wait()
					s.wantState(StateBackoff)
				case "release":
					s.gpu.released = false
					s.start()
					s.l.last().end(exitInfo{Code: 1})
					synctest.Wait()
					s.wantState(StateWaitingGPU)
				}
				s.wantStopped(exitcode.OK, "the stop")
				s.wantState(StateStopped)
			})
		})
	}
}

func TestMachineStopWhileLoading(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.start()
		s.wantStopped(exitcode.OK, "the stop")
		if s.l.last().stops.Load() != 1 || len(s.kinds(events.KindExited)) != 0 {
			t.Fatal("a stop while loading is a SIGTERM and no failure")
		}
	})
}

func TestMachineOperatorRestart(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		first := s.l.last()
		if err := s.sup.Restart(context.Background(), "uid 0"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if first.stops.Load() != 1 || s.l.n() != 2 {
			t.Fatalf("%d SIGTERMs, %d launches", first.stops.Load(), s.l.n())
		}
		s.ready()
		st := s.sup.Status()
		if len(st.Restarts) != 0 || st.Starts != 2 {
			t.Fatalf("a requested restart counted as a failure: %+v", st)
		}
		if d := s.kinds(events.KindDecision); len(d) != 1 || d[0].Decision != events.DecisionRestart {
			t.Fatalf("decisions %+v", d)
		}
		s.stop()
	})
}

func TestMachineOperatorRestartSkipsTheBackoff(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Restart.InitialDelay = config.Duration{Duration: time.Hour} }, func(t *testing.T, s *scenario) {
		s.start()
		s.l.last().end(exitInfo{Code: 1})
		synctest.Wait()
		s.wantState(StateBackoff)
		if err := s.sup.Restart(context.Background(), "uid 0"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		s.wantLaunches(2, "vLLM launches")
		s.stop()
	})
}

func TestMachineResetProfile(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.pstate = policy.State{Rung: 2}
		s.start()
		if got := s.sup.Status().Rung.Index; got != 2 {
			t.Fatalf("resumed on rung %d", got)
		}
		s.ready()
		if err := s.sup.ResetProfile(context.Background(), "uid 0"); err != nil {
			t.Fatal(err)
		}
		if err := s.sup.Restart(context.Background(), "uid 0"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if argv := s.l.last().spec.Argv; !argvHas(argv, "--max-num-seqs", "256") {
			t.Fatalf("after the reset: %v", argv)
		}
		s.stop()
	})
}

func TestMachineRestoreStepsUpWhenIdleAndCool(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Profile.RestoreAfter = config.Duration{Duration: 10 * time.Minute} }, func(t *testing.T, s *scenario) {
		s.pstate = policy.State{Rung: 1}
		s.load = func() (float64, float64, bool) { return 0, 0, true }
		s.gpu.fractions = []float64{0.5}
		s.startReady()
		s.advance(10*time.Minute + 2*time.Second)
		synctest.Wait()
		s.wantLaunches(2, "after a stable stretch")
		if d := s.kinds(events.KindDecision); len(d) != 1 || d[0].Decision != events.DecisionRestore || d[0].Rung.Index != 0 {
			t.Fatalf("decisions %+v", d)
		}
		if !argvHas(s.l.last().spec.Argv, "--max-num-seqs", "256") {
			t.Fatalf("restored argv %v", s.l.last().spec.Argv)
		}
		s.stop()
	})
}

func TestMachineCostModelSamplesWhileReady(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		var running atomic.Int64
		s.load = func() (float64, float64, bool) { return float64(running.Load()), 0, true }
		s.startReady()
		for n := range int64(12) {
			running.Store(8 * n)
			s.gpu.set(func(g *fakeGPU) { g.used, g.readAt = uint64(40<<30)+uint64(n)*(1<<30), time.Now() })
			s.advance(10 * s.cfg.GPU.SampleInterval.Duration)
		}
		if c := s.sup.Status().Cost; !strings.Contains(c, "GiB") {
			t.Fatalf("cost model summary %q after samples at 12 levels", c)
		}
		s.stop()
	})
}

func TestMachineKeeperKilledIsAFailure(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		p := s.l.last()
		p.survivors = []int{p.apiPID, p.apiPID + 1}
		// The keeper is gone: the tree's done closes together with apiGone.
		p.end(exitInfo{Code: -1, Signal: "SIGKILL"})
		synctest.Wait()
		s.wantCause(1, cause.CauseCrash)
		s.stop()
	})
}

func TestMachineWithoutGPU(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.noGPU = true
		s.startReady()
		s.l.last().end(exitInfo{Code: 1})
		synctest.Wait()
		s.wantState(StateBackoff) // no release wait without a GPU view
		s.stop()
	})
}

func TestMachinePublishesEveryTransitionOnce(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.l.last().end(exitInfo{Code: 1})
		synctest.Wait()
		s.advance(s.cfg.Restart.InitialDelay.Duration)
		s.ready()
		s.stop()
		want := []string{"ready", "stopping", "waiting_gpu", "backoff", "starting", "ready", "stopping", "stopped"}
		if got := s.states(); !slices.Equal(got, want) {
			t.Fatalf("states %v, want %v", got, want)
		}
		if n := len(s.kinds(events.KindStarting)); n != 2 {
			t.Fatalf("%d starting events", n)
		}
	})
}

func TestMachineRetriesFastWhileUvicornStartsListening(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Readiness.PollInterval = config.Duration{Duration: time.Minute} }, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		// uvicorn's order: the line first, the socket listens a moment later.
		p.print("stderr:INFO:     Application startup complete.")
		synctest.Wait()
		s.advance(40 * time.Millisecond)
		s.wantState(StateStarting)
		p.listening.Store(true)
		s.advance(fastRetryEvery)
		s.wantState(StateReady)
		if ttr := s.sup.Status().TimeToReady; ttr > 50*time.Millisecond {
			t.Fatalf("ready %s after the line; want within one retry of listening", ttr)
		}
		s.stop()
	})
}

func TestMachineFastRetryIsBounded(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Readiness.PollInterval = config.Duration{Duration: time.Minute} }, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		p.print("stderr:INFO:     Application startup complete.")
		s.advance(5 * time.Second)
		// Never listening: refused probes stop after fastRetryFor, until the next poll.
		after := s.pr.calls.Load()
		s.advance(5 * time.Second)
		s.wantState(StateStarting)
		if want := int64(fastRetryFor / fastRetryEvery); after < want/2 || after > want+10 || s.pr.calls.Load() != after {
			t.Fatalf("%d probes in the first 5 s, %d after 10 s; want about %d, then none until the poll", after, s.pr.calls.Load(), want)
		}
		if n := s.sup.Status().Starts; n != 1 {
			t.Fatalf("%d starts", n)
		}
		s.stop()
	})
}

func TestMachineStopWaitsForVLLMsOwnDrain(t *testing.T) {
	runScenario(t, func(c *config.Config) {
		c.VLLM.Command = []string{"vllm", "serve", "m", "--shutdown-timeout", "45"}
		c.VLLM.StopTimeout = config.Duration{Duration: 30 * time.Second}
	}, func(t *testing.T, s *scenario) {
		s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } // draining: it takes its time
		s.startReady()
		p := s.l.last()
		s.cancel()
		synctest.Wait()
		s.wantStops(p, 1, "no SIGTERM to the API server")
		// stop_timeout alone would kill at 30 s: the drain of 45 s + 10 s wins.
		s.advance(54 * time.Second)
		s.wantKills(p, 0, "killed in the middle of vLLM's drain")
		s.advance(time.Second)
		s.wantKills(p, 1, "no SIGKILL after the drain's bound")
		s.wantExited(exitcode.OK, "the exit")
	})
}

// With the proxy in front and vLLM's --shutdown-timeout, a stop waits for
// the requests in flight through the proxy before vLLM gets SIGTERM
// (vLLM 0.32.0's own drain cuts them), for at most that timeout.
func TestMachineStopDrainsTheProxyFirst(t *testing.T) {
	for _, c := range []struct {
		name     string
		endAfter time.Duration // when the proxy's last request ends; 0: never
		termAt   time.Duration // when vLLM must get SIGTERM
	}{
		{"the requests end", 7 * time.Second, 7 * time.Second},
		{"they outlast the timeout", 0, 20 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var inflight atomic.Int64
				inflight.Store(2)
				s := newScenario(t, func(cfg *config.Config) {
					cfg.VLLM.Command = []string{"vllm", "serve", "m", "--shutdown-timeout", "20"}
				})
				s.inFlight = func() int { return int(inflight.Load()) }
				s.startReady()
				p := s.l.last()
				s.cancel()
				synctest.Wait()
				s.wantStops(p, 0, "SIGTERM while requests were in flight through the proxy")
				if st := s.sup.Status(); st.State != StateStopping || !strings.Contains(st.Reason, "2 requests in flight through the proxy") {
					t.Fatalf("status %s %q", st.State, st.Reason)
				}
				if c.endAfter > 0 {
					s.advance(c.endAfter - time.Millisecond)
					s.wantStops(p, 0, "SIGTERM before the requests ended")
					inflight.Store(0)
					s.advance(time.Second)
				} else {
					s.advance(c.termAt - time.Millisecond)
					s.wantStops(p, 0, "SIGTERM before the timeout")
					s.advance(time.Second)
				}
				if p.stops.Load() != 1 {
					t.Fatalf("no SIGTERM after %s", c.termAt)
				}
				s.wantExited(exitcode.OK, "the exit")
			})
		})
	}
}

// A second stop while the guard waits for the proxy's requests kills the
// tree at once, and no SIGTERM follows later from the abandoned wait.
func TestMachineSecondStopDuringTheProxyDrainKills(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScenario(t, func(cfg *config.Config) {
			cfg.VLLM.Command = []string{"vllm", "serve", "m", "--shutdown-timeout", "20"}
		})
		s.inFlight = func() int { return 1 }
		s.startReady()
		p := s.l.last()
		s.cancel()
		synctest.Wait()
		s.sup.Kill()
		synctest.Wait()
		s.advance(30 * time.Second)
		s.wantSignals(p, 0, 1, "want the tree killed at once and no SIGTERM after")
		s.exited()
	})
}

// Without vLLM's --shutdown-timeout (it aborts at once) there is nothing
// to wait for: SIGTERM at once.
func TestMachineStopWithoutShutdownTimeoutDoesNotWait(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.inFlight = func() int { return 3 }
		s.startReady()
		p := s.l.last()
		s.cancel()
		synctest.Wait()
		s.wantStops(p, 1, "no SIGTERM at once")
		s.exited()
	})
}

func TestMachineASecondStopKillsAtOnce(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true }
		s.startReady()
		s.cancel()
		s.advance(time.Second)
		s.wantState(StateStopping)
		s.sup.Kill()
		synctest.Wait()
		if s.l.last().kills.Load() != 1 {
			t.Fatal("the second signal did not kill the tree")
		}
		s.wantExited(exitcode.OK, "the exit")
	})
}

func TestMachineDrainingVLLMThatExitsIsNoFailure(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = p.apiPID == 1000 } // the first run drains slowly
		s.startReady()
		if err := s.sup.Restart(context.Background(), "uid 0"); err != nil {
			t.Fatal(err)
		}
		s.advance(3 * time.Second)
		s.l.last().end(exitInfo{Code: 0}) // the drain ended; vLLM exits by itself
		synctest.Wait()
		if len(s.kinds(events.KindExited)) != 0 || s.l.n() != 2 {
			t.Fatalf("a drain that ended by itself: %d failures, %d launches", len(s.kinds(events.KindExited)), s.l.n())
		}
		s.stop()
	})
}

// TestEffectiveStopTimeout: the run reads --shutdown-timeout as vLLM's
// parser does, in every spelling and in the extra arguments (issue 23:
// "=" or an underscore used to leave the drain killed at stop_timeout).
func TestEffectiveStopTimeout(t *testing.T) {
	for _, tc := range []struct {
		argv, extra []string
		want        time.Duration
	}{
		{[]string{"vllm", "serve", "m"}, nil, 30 * time.Second},
		{[]string{"vllm", "serve", "m", "--shutdown-timeout", "5"}, nil, 30 * time.Second},
		{[]string{"vllm", "serve", "m", "--shutdown-timeout=60"}, nil, 70 * time.Second},
		{[]string{"vllm", "serve", "m", "--shutdown_timeout=120"}, nil, 130 * time.Second},
		{[]string{"vllm", "serve", "m", "--shutdown_timeout", "90", "--shutdown-timeout", "100"}, nil, 110 * time.Second},
		{[]string{"vllm", "serve", "m"}, []string{"--shutdown_timeout=120"}, 130 * time.Second},
		{[]string{"vllm", "serve", "m", "--shutdown-timeout", "0"}, nil, 30 * time.Second},
	} {
		cfg := config.Default()
		cfg.VLLM.Command = tc.argv
		cfg.VLLM.StopTimeout = config.Duration{Duration: 30 * time.Second}
		sup, err := New(cfg, Options{Policy: policy.New(cfg.Policy(), policy.State{}, realClockForTest{}), Keeper: []string{"keeper"}, ExtraArgs: tc.extra})
		if err != nil {
			t.Fatal(err)
		}
		if got := sup.stopTimeout(); got != tc.want {
			t.Errorf("%v -- %v: %s, want %s", tc.argv, tc.extra, got, tc.want)
		}
	}
}

func TestMachineSilentDownloadIsProgressButASilentIdleTreeIsAHang(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Readiness.StallTimeout = config.Duration{Duration: 8 * time.Second} }, func(t *testing.T, s *scenario) {
		s.start()
		p := s.l.last()
		// 30 s without a line, writing weights to the cache all the while.
		for range 60 {
			p.ioBytes.Add(200 << 20)
			s.advance(500 * time.Millisecond)
		}
		st := s.sup.Status()
		if st.State != StateStarting || !strings.Contains(st.Reason, "downloading or loading:") || !strings.Contains(st.Reason, "no log output for") {
			t.Fatalf("during a silent download: %+v", st)
		}
		s.noFailure("a silent download was killed")
		// Then neither output nor I/O: still a hang.
		s.advance(9 * time.Second)
		s.wantCause(1, cause.CauseHang)
		s.stop()
	})
}

func TestMachineStuckEngineIsAHang(t *testing.T) {
	runScenario(t, stuckAfter(60*time.Second), func(t *testing.T, s *scenario) {
		var running, tokens atomic.Int64
		s.progress = func() (float64, float64, bool) { return float64(running.Load()), float64(tokens.Load()), true }
		s.startReady()
		// Busy and progressing for 10 × stuck_timeout: never stuck.
		running.Store(40)
		for range 600 {
			tokens.Add(7)
			s.advance(time.Second)
		}
		// Idle with counters still: never stuck.
		running.Store(0)
		s.advance(5 * time.Minute)
		s.noFailure("a progressing or idle vLLM was called stuck")
		// Wedged: requests running, no counter moves (/health still 200).
		running.Store(12)
		s.advance(59 * time.Second)
		s.noFailure("stuck before stuck_timeout")
		s.advance(2 * time.Second)
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseHang || s.l.last().kills.Load() != 1 {
			t.Fatalf("failure %+v, kills %d", f, s.l.last().kills.Load())
		}
		s.stop()
	})
}

// stuckStep is one step of a stuck-check scenario: do (if set) acts, fake
// time passes for after, then the machine has published a hang (hang) or
// no failure at all (why says what it must not have been called).
type stuckStep struct {
	do    func()
	after time.Duration
	hang  bool
	why   string
}

// runStuck runs a stuck-check scenario with stuck_timeout timeout: setup
// sets the fakes up before the start and gives the steps, run once vLLM is
// ready; it stops the machine after them.
func runStuck(t *testing.T, timeout time.Duration, setup func(s *scenario) []stuckStep) {
	t.Helper()
	runScenario(t, stuckAfter(timeout), func(t *testing.T, s *scenario) {
		steps := setup(s)
		s.startReady()
		for _, st := range steps {
			if st.do != nil {
				st.do()
			}
			s.advance(st.after)
			if st.hang {
				s.wantCause(1, cause.CauseHang)
			} else {
				s.noFailure(st.why)
			}
		}
		s.stop()
	})
}

// engineWedged: the 1-token request never answers within its bound.
func engineWedged() probeResult {
	return probeResult{Step: "completion", Err: "context deadline exceeded"}
}

func TestMachineStuckWithoutMetricsSendsARequest(t *testing.T) {
	runStuck(t, 30*time.Second, func(s *scenario) []stuckStep {
		s.progress = gauges(0, 0, false) // --disable-log-stats
		return []stuckStep{
			{after: 2 * time.Minute, why: "answering requests, yet called stuck"},
			{do: func() { s.pr.setReady(engineWedged) }, after: time.Minute, hang: true},
		}
	})
}

// vLLM counts prompt tokens only when a prefill completes: one long
// prefill shows running 1 and no counter moving. The guard's proxy knows
// the prompt awaiting its answer and allows it time to prefill.
func TestMachineLongPrefillIsNotStuck(t *testing.T) {
	runScenario(t, stuckAfter(60*time.Second), func(t *testing.T, s *scenario) {
		var running, prompt atomic.Int64
		s.progress = func() (float64, float64, bool) { return float64(running.Load()), 1000, true }
		s.awaiting = func() (int, float64) {
			if prompt.Load() == 0 {
				return 0, 0
			}
			return 1, float64(prompt.Load())
		}
		s.startReady()
		// A 20 000-token prompt: 200 s of prefill allowed at the slowest rate.
		running.Store(1)
		prompt.Store(20000)
		s.advance(4 * time.Minute)
		s.noFailure("a long prefill was called stuck")
		// Still nothing after stuck_timeout plus the prefill's time: stuck.
		s.advance(30 * time.Second)
		f := s.failure(1)
		if f.Verdict.Cause != cause.CauseHang || !strings.Contains(s.sup.Status().Reason+f.Verdict.Summary, "prefill") {
			t.Fatalf("failure %+v, status %q", f, s.sup.Status().Reason)
		}
		s.stop()
	})
}

// vLLM publishes running/waiting after each engine step: an engine that
// hangs in its first step after idle shows 0 running for ever. The
// requests the guard's proxy sent, with no answer, are work in flight.
func TestMachineHangInTheFirstStepAfterIdleIsStuck(t *testing.T) {
	runStuck(t, 60*time.Second, func(s *scenario) []stuckStep {
		var sent atomic.Int64
		s.progress = gauges(0, 500, true) // the gauges of the last step before idle
		s.awaiting = func() (int, float64) { return int(sent.Load()), 8 }
		return []stuckStep{
			{after: 5 * time.Minute, why: "an idle vLLM was called stuck"},
			{do: func() { sent.Store(3) }, after: 59 * time.Second, why: "stuck before stuck_timeout"},
			{after: 3 * time.Second, hang: true},
		}
	})
}

// An operator's POST /pause holds requests on purpose: vLLM answers
// /is_paused with {"is_paused": true}, and the guard does not kill it.
// Once resumed, a vLLM that still makes no progress is stuck.
func TestMachinePausedVLLMIsNotStuck(t *testing.T) {
	runStuck(t, 60*time.Second, func(s *scenario) []stuckStep {
		s.progress = gauges(4, 1000, true)
		s.pr.setPaused(true)
		return []stuckStep{
			{after: 10 * time.Minute, why: "a paused vLLM was called stuck"},
			{do: func() { s.pr.setPaused(false) }, after: 2 * time.Minute, hang: true},
		}
	})
}

// Without vLLM's metrics the stuck check sends a 1-token request; a
// paused vLLM holds it too, and is not stuck.
func TestMachinePausedVLLMWithoutMetricsIsNotStuck(t *testing.T) {
	runStuck(t, 30*time.Second, func(s *scenario) []stuckStep {
		s.progress = gauges(0, 0, false)
		s.pr.setPaused(true)
		return []stuckStep{
			{do: func() { s.pr.setReady(engineWedged) }, after: 5 * time.Minute, why: "a paused vLLM was called stuck"},
		}
	})
}

func TestMachineReloadAppliesLiveSettingsNowAndVLLMsAtTheNextStart(t *testing.T) {
	runScenario(t, func(c *config.Config) { c.Liveness.Interval = config.Duration{Duration: time.Minute} }, func(t *testing.T, s *scenario) {
		var healthChecks atomic.Int64
		s.startReady()
		s.pr.setHealth(func() probeResult { healthChecks.Add(1); return probeResult{OK: true, Step: "health", Status: 200} })

		next := *s.cfg
		next.Liveness.Interval = config.Duration{Duration: 5 * time.Second}
		next.VLLM.Command = []string{"vllm", "serve", "m", "--max-model-len", "8192"}
		pending, err := s.sup.Reload(context.Background(), &next)
		if err != nil || !pending {
			t.Fatalf("reload: pending %v, %v; want the command pending", pending, err)
		}
		synctest.Wait()
		s.wantLaunches(1, "a reload restarted vLLM")
		// The liveness interval applies from the next check on: 1 minute,
		// then every 5 s.
		s.advance(time.Minute + 20*time.Second)
		if n := healthChecks.Load(); n < 4 {
			t.Fatalf("%d health checks in 80 s; the reloaded 5 s interval is not in force", n)
		}
		// The command applies at the next start.
		if err := s.sup.Restart(context.Background(), "uid 0"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if !argvHas(s.l.last().spec.Argv, "--max-model-len", "8192") {
			t.Fatalf("the reloaded command is not in force after the restart: %v", s.l.last().spec.Argv)
		}
		s.stop()
	})
}

func TestMachineReloadWithoutVLLMChangesIsNotPending(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		next := *s.cfg
		next.GPU.WarnFraction = 0.5
		if pending, err := s.sup.Reload(context.Background(), &next); err != nil || pending {
			t.Fatalf("pending %v, %v", pending, err)
		}
		s.stop()
	})
}

// killedLeaving: the last vLLM is SIGKILLed and leaves process pid behind,
// stuck in the kernel for stuckFor (unkillable: for ever).
func (s *scenario) killedLeaving(pid int, stuckFor time.Duration, unkillable bool) {
	p := s.l.last()
	p.survivors = []int{pid}
	p.stuckFor = stuckFor
	p.unkillable = unkillable
	p.end(exitInfo{Code: -1, Signal: "SIGKILL"})
	synctest.Wait()
}

// loopTurnsEachSecond lets n seconds pass one by one and checks that the
// machine's loop turned in each (during names what it waits for); each,
// if set, checks more after the i-th second (from 0).
func (s *scenario) loopTurnsEachSecond(n int, during string, each func(i int)) {
	s.t.Helper()
	for i := range n {
		before := s.sup.LastTurn()
		s.advance(time.Second)
		if !s.sup.LastTurn().After(before) {
			s.t.Fatalf("the loop stopped turning %d s into %s", i+1, during)
		}
		if each != nil {
			each(i)
		}
	}
}

// A process of the old tree stuck in the kernel (as after a GPU fault) does
// not die for 60 s: the loop keeps turning all the while (the heartbeat
// behind WATCHDOG=1 and /livez), status says which pid and where it is
// stuck, a stop request is taken, and the next start waits for the tree to
// be gone.
func TestMachineStuckLeftoverNeverBlocksTheLoop(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.killedLeaving(4242, 60*time.Second, false)
		s.loopTurnsEachSecond(58, "the cleanup", func(i int) {
			st := s.sup.Status()
			if i >= 2 && !strings.Contains(st.Reason, "pid 4242 does not die: state D in nvidia_wait_for_gpu") {
				t.Fatalf("%d s in, status reason %q does not say what the cleanup waits for", i+1, st.Reason)
			}
			if st.State != StateStopping || s.l.n() != 1 || len(s.kinds(events.KindExited)) != 0 {
				t.Fatalf("%d s in: state %s, %d launches, %d failures recorded before the tree was gone", i+1, st.State, s.l.n(), len(s.kinds(events.KindExited)))
			}
		})
		s.advance(3 * time.Second)
		s.wantCause(1, cause.CauseCrash)
		s.advance(s.cfg.Restart.InitialDelay.Duration)
		s.wantLaunches(2, "once the stuck process was gone; want the restart")
		s.ready()
		s.stop()
	})
}

// Survivors that never die are declared unkillable after the kill rounds;
// a stop asked meanwhile waits for that and then stops.
func TestMachineUnkillableLeftoverIsDeclaredAndStopWaits(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.killedLeaving(4243, 50*time.Second, true)
		s.advance(5 * time.Second)
		s.cancel()
		s.advance(time.Second)
		if s.state() != StateStopping {
			t.Fatalf("state %s while the cleanup runs; want stopping", s.state())
		}
		s.advance(50 * time.Second)
		s.wantExited(exitcode.OK, "the exit")
		s.wantLaunches(1, "a stop asked during the cleanup must not start vLLM again")
	})
}

// An NVML read that takes a minute (a GPU in trouble) is made off the loop:
// the loop keeps turning, the start waits for the answer, and a stop asked
// meanwhile is taken at once.
func TestMachineSlowNVMLNeverBlocksTheLoop(t *testing.T) {
	runReady(t, nil, func(t *testing.T, s *scenario) {
		s.gpu.mu.Lock()
		s.gpu.slow = time.Minute
		s.gpu.mu.Unlock()
		s.l.last().end(exitInfo{Code: -1, Signal: "SIGKILL"})
		synctest.Wait()
		s.loopTurnsEachSecond(50, "a slow release read", nil)
		if s.state() != StateWaitingGPU || s.l.n() != 1 {
			t.Fatalf("state %s, %d launches during the slow release read", s.state(), s.l.n())
		}
		s.wantStopped(exitcode.OK, "the stop")
		// The read in flight is an NVML call that cannot be cancelled: it
		// ends in its own time, and its answer goes nowhere.
		s.advance(time.Minute)
	})
}

// After its engine died, vLLM's API server prints uvicorn's "Finished
// server process" and then exits; Python's teardown can take seconds on a
// loaded host, and its closed port then refuses the liveness probe. That
// is an exit under way, not a hang (seen on the real vLLM under load: a
// SIGKILLed EngineCore classified as a hang): the guard waits for the exit
// up to stop_timeout and classifies what vLLM printed.
func TestMachineServerFinishedIsNotAHang(t *testing.T) {
	live := func(c *config.Config) {
		c.Liveness.Interval = config.Duration{Duration: time.Second}
		c.Liveness.Failures = 3
		c.VLLM.StopTimeout = config.Duration{Duration: 30 * time.Second}
	}
	refused := func() probeResult {
		return probeResult{Step: "health", Err: `Get "http://127.0.0.1:8000/health": dial tcp 127.0.0.1:8000: connect: connection refused`}
	}
	t.Run("the process exits within stop_timeout: its own cause", func(t *testing.T) {
		runReady(t, live, func(t *testing.T, s *scenario) {
			p := s.l.last()
			p.print("ERROR 10-14 12:01:00 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
				"stderr:INFO:     Shutting down", fmt.Sprintf("stderr:INFO:     Finished server process [%d]", p.apiPID))
			s.pr.setHealth(refused)
			s.advance(10 * time.Second) // ten refused probes
			if p.kills.Load() != 0 || len(s.kinds(events.KindExited)) != 0 {
				t.Fatalf("killed while its process was exiting: %d kills", p.kills.Load())
			}
			p.end(exitInfo{Code: 1})
			synctest.Wait()
			if f := s.failure(1); f.Verdict.Cause == cause.CauseHang || f.Exit == "killed by SIGKILL" {
				t.Fatalf("failure %+v: want vLLM's own exit, classified from its lines", f.Verdict)
			}
			s.stop()
		})
	})
	t.Run("the process does not exit: a hang after stop_timeout", func(t *testing.T) {
		runReady(t, live, func(t *testing.T, s *scenario) {
			p := s.l.last()
			p.print(fmt.Sprintf("stderr:INFO:     Finished server process [%d]", p.apiPID))
			s.pr.setHealth(refused)
			s.advance(30 * time.Second)
			s.wantKills(p, 0, "killed before stop_timeout")
			s.advance(2 * time.Second)
			f := s.failure(1)
			if f.Verdict.Cause != cause.CauseHang || !strings.Contains(f.Verdict.Summary, "did not exit within 30s") {
				t.Fatalf("failure %+v", f.Verdict)
			}
			s.stop()
		})
	})
	t.Run("another process's line is not the server's", func(t *testing.T) {
		runReady(t, live, func(t *testing.T, s *scenario) {
			p := s.l.last()
			p.print(fmt.Sprintf("stderr:INFO:     Finished server process [%d]", p.apiPID+1))
			s.pr.setHealth(refused)
			s.advance(4 * time.Second)
			if f := s.failure(1); f.Verdict.Cause != cause.CauseHang || !strings.Contains(f.Verdict.Summary, "consecutive liveness failures") {
				t.Fatalf("failure %+v", f.Verdict)
			}
			s.stop()
		})
	})
}

// The cost model observes each GPU reading once: its timer may fire
// several times between two of the monitor's readings (issue 31: one
// sampler per source), and the same reading is not a new sample.
func TestMachineCostModelCountsEachReadingOnce(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		s.load = func() (float64, float64, bool) { return 4, 0, true }
		s.startReady()
		for range 2 {
			s.gpu.set(func(g *fakeGPU) { g.used, g.readAt = 40<<30, time.Now() })
			s.advance(10 * s.cfg.GPU.SampleInterval.Duration)
		}
		s.stop()
		if n := s.sup.pol.Cost().Samples; n != 2 {
			t.Fatalf("%d cost samples from 2 GPU readings over 20 sample intervals, want 2", n)
		}
	})
}
