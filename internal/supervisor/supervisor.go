// Package supervisor owns the life of one vLLM: launch with the profile in
// force, its process tree (through the keeper), the log pump, readiness,
// liveness, stopping, reaping, and the state machine. The machine's
// decisions are package heart (Step turns an event into a new state plus
// effect values); this package is its executor (machine_exec.go,
// machine_apply.go): one goroutine that hands it events — child output and
// exit, probe answers, timers, operators' requests, the stop signal — with
// what they may read, turns the effects into calls, and never blocks: every
// wait is a sub-state with a timer. It asks package policy what every
// failure means and what to do next, and publishes what happens on the
// event stream (package events).
package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/ownconns"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/adapters"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// GPU is what the supervisor needs of the GPU monitor. nil means no GPU
// view: the guard supervises without it. Every method returns at once.
type GPU interface {
	// SetTree tells the monitor which PIDs are vLLM's (nil: none running).
	SetTree(tree func() []int)
	// SetLoading says whether vLLM is loading (memory climbs by design then).
	SetLoading(loading bool)
	// RecentFractions is used/total of the last n samples, oldest first.
	RecentFractions(n int) []float64
	// UsedBytes is the memory in use per chosen device now.
	UsedBytes() []uint64
	// Fullest is the memory in use and the total of the fullest device at
	// the last sample, and when that sample was read; ok is false when
	// unknown.
	Fullest() (used, total uint64, at time.Time, ok bool)
	// Released reports, from one reading, whether NVML shows none of pids
	// (or used memory back to baseline where PIDs are not visible), and
	// what still holds memory when not.
	Released(pids []int, baseline []uint64) (released bool, held []Holder)
	// CheckFree reports whether free memory on every device is enough for
	// the rung (utilization × total, or its --kv-cache-memory-bytes), and
	// who holds it when not.
	CheckFree(r policy.Rung) (ok bool, why string, holders []Holder)
	// SetBudget tells the monitor what vLLM will hold by design on rung r,
	// so that memory alerts mean memory beyond it.
	SetBudget(r policy.Rung)
	// CriticalFraction is the used/total at which memory is critical now.
	CriticalFraction() float64
}

// Options are the supervisor's collaborators.
type Options struct {
	Log    *zap.Logger
	Policy *policy.Policy
	GPU    GPU // may be nil
	// Health is the GPUs' hardware health (XIDs, ECC, remapped rows, a
	// lost GPU); nil: not known (heart/gpufault.go).
	Health GPUHealth
	// Events receives everything that happens (may be nil).
	Events *events.Bus
	// Persist saves the policy's state (rung, history) after it changed.
	Persist func(policy.State)
	// Keeper is the argv prefix that runs the keeper: [exe, proctree.KeeperArg].
	// Default: this executable.
	Keeper []string
	// ExtraArgs are appended to [vllm] command (after `--` on the command line).
	ExtraArgs []string
	// Load reports vLLM's running and waiting requests (from its /metrics);
	// ok is false when not known. It feeds restore (which waits for idle)
	// and the cost model. nil: never known, so restore never interrupts
	// traffic it cannot see.
	Load func() (running, waiting float64, ok bool)
	// Progress reports vLLM's running requests and the sum of its token
	// counters (prompt and generation tokens) from its /metrics; ok is
	// false when they are not known (metrics off with --disable-log-stats,
	// or not scraped yet). It feeds stuck detection while ready.
	Progress func() (running, tokens float64, ok bool)
	// Awaiting reports the requests the guard's proxy sent to vLLM that
	// have had no byte of their answer yet, and the largest estimated
	// prompt (tokens) among them; nil without the proxy. vLLM's gauges
	// move only after an engine step and its prompt counter only after a
	// prefill, so the stuck check counts these as work in flight and
	// allows the largest prompt time to prefill.
	Awaiting func() (requests int, largestPrompt float64)
	// InFlight is the number of requests in flight through the guard's
	// proxy; nil without the proxy. A planned stop with vLLM's
	// --shutdown-timeout waits for them before vLLM gets SIGTERM (see
	// drainFirst).
	InFlight func() int
	// Args is vLLM's effective command line; nil: read from the config and
	// ExtraArgs.
	Args *vllmargs.Args
	// Conns records the guard's own connections to vLLM, whose access-log
	// lines are dropped (nil: a new set).
	Conns *ownconns.Set
	// BeforeLaunch, when set, is waited for before each launch of vLLM,
	// off the loop (before the trial bind of its port): it returns once
	// what vLLM needs running first is ready (the weight cache daemon:
	// started if it is not running), or when its context ends (Run
	// returned).
	BeforeLaunch func(ctx context.Context) error
	// StartTimes is this host's record of vLLM's earlier starts, for the
	// time to ready expected of each start (nil: none expected); the
	// supervisor adds each start that becomes ready and has the record
	// saved with SaveStarts (nil: kept in memory), off its loop.
	StartTimes *starttimes.Book
	SaveStarts func(starttimes.History) error
	// PolicyMu guards Policy when supervisors share it (a warm standby:
	// one ladder for two vLLMs); every call of this supervisor into the
	// policy holds it. nil: a mutex of its own.
	PolicyMu *sync.Mutex
	// MayRestore says whether this supervisor may step its vLLM up a rung
	// now (restore); nil: always. A standby never restores on its own.
	MayRestore func() bool
	// OnDying, when set, is called on the machine's goroutine when vLLM,
	// still ready in its status, is known to be going: its engine dead
	// (engine_dead) or its API server finished (server_exiting). A warm
	// standby takes over then, not at the exit seconds later.
	OnDying func()
	// Group is this host's member of a group across hosts ([group]);
	// nil: none.
	Group Group
}

// Supervisor runs vLLM until stopped. Make one with New, then Run it.
type Supervisor struct {
	cfg      *config.Config
	log      *zap.Logger
	pol      *policy.Policy
	gpu      GPU
	health   GPUHealth
	bus      *events.Bus
	persist  func(policy.State)
	keeper   []string
	extra    []string
	model    string
	load     func() (running, waiting float64, ok bool)
	tokens   func() (running, tokens float64, ok bool)
	waiting  func() (requests int, largestPrompt float64) // Options.Awaiting
	inFlight func() int                                   // Options.InFlight
	args     *vllmargs.Args
	conns    *ownconns.Set
	tasks    atomic.Pointer[[]string] // vLLM's Supported tasks, from this run's log before ready

	starts       *starttimes.Book               // Options.StartTimes
	saveStartsTo func(starttimes.History) error // Options.SaveStarts
	boot         string                         // the host's boot id: a start is cold when its model has not started since

	// The machine's ports: real processes and HTTP unless a test sets them.
	launcher launcher
	// newProber makes the run's prober; tree is the run's process tree,
	// whose listener alone the probes (and the key) may reach.
	newProber func(ep launch.Endpoint, model string, tree func() []int) checker
	hostOOM   func() int64 // the cgroup's oom_kill counter, -1 when unknown
	// portHolder tries vLLM's bind of host:port and names who holds the
	// port ("" when the bind works); called off the loop (checkPort).
	portHolder func(host string, port int) string
	// tree is the running vLLM's process tree (nil between runs), for
	// the clients of vLLM's port beside the prober (DialVLLM).
	tree atomic.Pointer[func() []int]
	// traceSub, when set (tests), hears every change of the machine's
	// sub-state, on the machine's goroutine.
	traceSub func(from, to subState)
	// traceCell, when set (tests), hears every event handed to the
	// decisions, as the cell of the table it falls in.
	traceCell func(sub subState, k evKind)

	status   atomic.Pointer[Status]
	lastTurn monoTime
	reqs     chan request
	kill     chan struct{}

	pendingReload atomic.Bool // a reloaded config waits for vLLM's next start

	writer *policyWriter // saves the policy's state while Run runs (Run's goroutine only)

	before     func(ctx context.Context) error // Options.BeforeLaunch
	polMu      *sync.Mutex                     // held around every call into pol (Options.PolicyMu)
	mayRestore func() bool                     // Options.MayRestore
	onDying    func()                          // Options.OnDying
	dying      atomic.Bool                     // in engine_dead or server_exiting (Dying)
	group      Group                           // [group]: nil without
	groupEv    chan event                      // the group's go and end, into the loop
}

// New makes a supervisor; it starts nothing.
func New(cfg *config.Config, opts Options) (*Supervisor, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.Policy == nil {
		return nil, errors.New("supervisor: no policy")
	}
	keeper := opts.Keeper
	if len(keeper) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("supervisor: find own executable for the keeper: %w", err)
		}
		keeper = []string{exe, proctree.KeeperArg}
	}
	persist := opts.Persist
	if persist == nil {
		persist = func(policy.State) {}
	}
	args := opts.Args
	if args == nil {
		var err error
		if args, err = cfg.VLLMArgs(opts.ExtraArgs); err != nil {
			return nil, err
		}
	}
	conns := cmp.Or(opts.Conns, ownconns.New())
	s := &Supervisor{polMu: cmp.Or(opts.PolicyMu, &sync.Mutex{}), mayRestore: opts.MayRestore, onDying: opts.OnDying, cfg: cfg, log: opts.Log, pol: opts.Policy, gpu: opts.GPU, health: opts.Health, bus: opts.Events, persist: persist,
		keeper: keeper, extra: opts.ExtraArgs, load: opts.Load, tokens: opts.Progress, waiting: opts.Awaiting, inFlight: opts.InFlight, reqs: make(chan request), kill: make(chan struct{}, 1),
		launcher: processLauncher{}, hostOOM: adapters.HostOOMKills, portHolder: adapters.PortHolder, args: args, conns: conns, before: opts.BeforeLaunch,
		starts: opts.StartTimes, saveStartsTo: opts.SaveStarts, boot: adapters.BootID()}
	if names := cfg.ServedModelNames(args); len(names) > 0 {
		s.model = names[0]
	}
	s.newProber = func(ep launch.Endpoint, model string, tree func() []int) checker {
		sp := s.probeSpec()
		sp.Tree = tree
		return adapters.NewProber(ep, sp)
	}
	s.joinGroup(opts.Group)
	s.polMu.Lock()
	st := Status{State: publicState[subIdle], Since: time.Now(), Reason: "not started yet", Rung: s.pol.Current(), Restarts: map[cause.Cause]int{},
		Cost: s.pol.Cost().Describe(s.pol.Current().GPUMemoryUtilization, cfg.Profile.Headroom), LongestTimeToReady: s.pol.LongestTimeToReady()}
	s.polMu.Unlock()
	s.status.Store(&st)
	s.lastTurn.Store(time.Now())
	return s, nil
}

// Status returns a copy of the current status; safe from any goroutine.
func (s *Supervisor) Status() Status { return s.status.Load().Clone() }

// Dying says that vLLM, though its status still says ready, is going: its
// engine is dead or its API server finished; it serves nothing more.
func (s *Supervisor) Dying() bool { return s.dying.Load() }

// LastTurn is when the supervisor's loop last proved it is turning.
//
// It carries the monotonic clock, so time.Since(LastTurn()) is immune to
// steps of the wall clock.
func (s *Supervisor) LastTurn() time.Time { return s.lastTurn.Load() }

// Kill asks a stopping supervisor to stop waiting: SIGKILL of vLLM's whole
// tree now (a second SIGTERM or SIGINT). Safe from any goroutine.
func (s *Supervisor) Kill() {
	select {
	case s.kill <- struct{}{}:
	default:
	}
}

// Restart asks for a graceful restart on the current rung (not a failure).
func (s *Supervisor) Restart(ctx context.Context, peer string) error {
	return s.ask(ctx, request{Kind: "restart", Peer: peer})
}

// RestartFor restarts vLLM because of what the guard saw itself (why: its
// weight cache daemon died), not an operator: a restart on the current
// rung, said with its reason, not counted as vLLM's failure.
func (s *Supervisor) RestartFor(ctx context.Context, why string) error {
	return s.ask(ctx, request{Kind: "restart", Why: why})
}

// ResetProfile returns to rung 0 at the next start.
func (s *Supervisor) ResetProfile(ctx context.Context, peer string) error {
	return s.ask(ctx, request{Kind: "reset_profile", Peer: peer})
}

// Reload takes a new configuration: what the running vLLM does not depend
// on (intervals, timeouts, liveness, stuck detection) applies at once;
// vLLM's command, environment and profile at its next start. It says which.
func (s *Supervisor) Reload(ctx context.Context, cfg *config.Config) (pending bool, err error) {
	r := request{Kind: "reload", Cfg: cfg}
	err = s.ask(ctx, r)
	return s.pendingReload.Load(), err
}

func (s *Supervisor) ask(ctx context.Context, r request) error {
	r.Reply = make(chan error, 1)
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		return fmt.Errorf("the supervisor did not take the request: %w", ctx.Err())
	}
	select {
	case err := <-r.Reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Supervisor) beat() { s.lastTurn.Store(time.Now()) }

// probeSpec is what the prober must know of vLLM's command line.
func (s *Supervisor) probeSpec() adapters.ProbeSpec {
	sp := adapters.ProbeSpec{Names: s.cfg.ServedModelNames(s.args), TaskHint: cmp.Or(s.args.Convert, s.args.Task, s.args.Runner), Conns: s.conns,
		Tasks: func() []string {
			if t := s.tasks.Load(); t != nil {
				return *t
			}
			return nil
		}}
	if len(s.args.APIKeys) > 0 {
		sp.Key = s.args.APIKeys[0]
	}
	return sp
}

// pumpFilter is how the log pump treats vLLM's lines for this guard: its
// secrets masked, its own requests' access lines dropped, the tasks line
// noted.
func (s *Supervisor) pumpFilter() *lineFilter {
	return &lineFilter{secrets: s.args.Secrets(), own: s.conns.Has, tasks: &s.tasks}
}

// criticalFraction is the used/total that counts as critical for the
// classifier's memory evidence.
func (s *Supervisor) criticalFraction() float64 {
	if s.gpu != nil {
		return s.gpu.CriticalFraction()
	}
	_, c := s.cfg.GPU.Thresholds(s.rung().GPUMemoryUtilization)
	return c
}

// rung is the policy's rung in force (the next start's).
func (s *Supervisor) rung() policy.Rung {
	s.polMu.Lock()
	defer s.polMu.Unlock()
	return s.pol.Current()
}

// withPolicy calls f with the policy held (Options.PolicyMu): f only
// calls the policy, never publishes or waits.
func (s *Supervisor) withPolicy(f func(p *policy.Policy)) {
	s.polMu.Lock()
	defer s.polMu.Unlock()
	f(s.pol)
}

// Conns records the guard's own connections to vLLM: the metrics scraper
// dials through it too, so that its access lines are dropped.
func (s *Supervisor) Conns() *ownconns.Set { return s.conns }

// DialVLLM is how another client of vLLM's port (the metrics scraper)
// connects: recorded as the guard's own connection, and made only to a
// listener of the running vLLM's process tree (between runs, none), like
// the probes, so that no key or request of the guard's reaches another
// process on the port.
func (s *Supervisor) DialVLLM(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return adapters.VLLMOnly(s.conns.Dial(d), func() []int {
		if t := s.tree.Load(); t != nil {
			return (*t)()
		}
		return nil
	})
}

// MaskedArgv is argv with vLLM's secrets (API keys) replaced by ***.
func (s *Supervisor) MaskedArgv(argv []string) []string { return s.args.Masked(argv) }

func (s *Supervisor) publish(e events.Event) { s.bus.Publish(e) }

// update changes the status at the time at (the event's: the machine reads
// no clock); a change of state is published once, with its reason.
func (s *Supervisor) update(at time.Time, f func(*Status)) {
	old := s.status.Load()
	st := old.Clone()
	f(&st)
	changed := st.State != old.State
	if changed {
		st.Since = at
	}
	s.status.Store(&st)
	if changed {
		r := st.Rung
		s.publish(events.Event{Kind: events.KindState, State: string(st.State), From: string(old.State), Reason: st.Reason, Rung: &r})
	}
}
