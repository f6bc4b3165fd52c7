// Package supervisor owns the life of one vLLM: launch with the profile in
// force, its process tree (through the keeper), the log pump, readiness,
// liveness, stopping, reaping, and the state machine of SPEC §4. It asks
// package policy what every failure means and what to do next.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/policy"
)

// GPU is what the supervisor needs of the GPU monitor. nil means no GPU
// view: the guard supervises without it.
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
	// the last sample; ok is false when unknown.
	Fullest() (used, total uint64, ok bool)
	// WaitReleased blocks until NVML shows none of pids (or used back to
	// baseline when PIDs are not visible), up to timeout; it returns
	// the processes still holding memory, empty when released.
	WaitReleased(ctx context.Context, pids []int, baseline []uint64, timeout time.Duration) []Holder
	// CheckFree reports whether free memory on every device is at least
	// utilization × total, and who holds it when not.
	CheckFree(utilization float64) (ok bool, why string, holders []Holder)
}

// Holder is a process holding GPU memory.
type Holder struct {
	PID     int
	Bytes   uint64
	Command string
}

// Hooks are how the rest of the guard hears about the supervisor. Each is
// optional and is called from the supervisor's goroutine: keep them quick.
type Hooks struct {
	OnStart    func(policy.Rung)  // each launch of vLLM
	OnState    func(Status)       // every transition
	OnProgress func(phase string) // load progress while starting
	OnReady    func(first bool, ttr time.Duration)
	OnFailure  func(Failure)      // classified, decided
	OnPolicy   func(policy.State) // persist: the rung or history changed
	OnTick     func()             // the loop turned (watchdog)
}

// Options are the supervisor's collaborators.
type Options struct {
	Log    *zap.Logger
	Policy *policy.Policy
	GPU    GPU // may be nil
	Hooks  Hooks
	// Keeper is the argv prefix that runs the keeper: [exe, KeeperArg].
	// Default: this executable.
	Keeper []string
	// ExtraArgs are appended to [vllm] command (after `--` on the command line).
	ExtraArgs []string
	// Load reports vLLM's running and waiting requests (from its /metrics);
	// ok is false when not known. It feeds restore (which waits for idle)
	// and the cost model. nil: never known, so restore never interrupts
	// traffic it cannot see.
	Load func() (running, waiting float64, ok bool)
}

// Supervisor runs vLLM until stopped. Make one with New, then Run it.
type Supervisor struct {
	cfg    *config.Config
	log    *zap.Logger
	pol    *policy.Policy
	gpu    GPU
	hooks  Hooks
	keeper []string
	extra  []string
	model  string
	load   func() (running, waiting float64, ok bool)

	status    atomic.Pointer[Status]
	lastTurn  atomic.Int64
	reqs      chan request
	costObs   int // cost samples taken (the summary is refreshed every 10)
	everReady bool
}

type request struct {
	kind  string // "restart" | "reset_profile"
	peer  string
	reply chan error
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
		keeper = []string{exe, KeeperArg}
	}
	s := &Supervisor{cfg: cfg, log: opts.Log, pol: opts.Policy, gpu: opts.GPU, hooks: opts.Hooks,
		keeper: keeper, extra: opts.ExtraArgs, load: opts.Load, model: cfg.ServedModelName(), reqs: make(chan request)}
	st := Status{State: StateStarting, Since: time.Now(), Reason: "not started yet", Rung: s.pol.Current(), Restarts: map[policy.Cause]int{},
		Cost: s.pol.Cost().Describe(s.pol.Current().GPUMemoryUtilization, cfg.Profile.Headroom)}
	s.status.Store(&st)
	s.lastTurn.Store(time.Now().UnixNano())
	return s, nil
}

// Status returns a copy of the current status; safe from any goroutine.
func (s *Supervisor) Status() Status { return s.status.Load().clone() }

// LastTurn is when the supervisor's loop last proved it is turning.
func (s *Supervisor) LastTurn() time.Time { return time.Unix(0, s.lastTurn.Load()) }

// Restart asks for a graceful restart on the current rung (not a failure).
func (s *Supervisor) Restart(ctx context.Context, peer string) error {
	return s.ask(ctx, request{kind: "restart", peer: peer})
}

// ResetProfile returns to rung 0 at the next start.
func (s *Supervisor) ResetProfile(ctx context.Context, peer string) error {
	return s.ask(ctx, request{kind: "reset_profile", peer: peer})
}

func (s *Supervisor) ask(ctx context.Context, r request) error {
	r.reply = make(chan error, 1)
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		return fmt.Errorf("the supervisor did not take the request: %w", ctx.Err())
	}
	select {
	case err := <-r.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Supervisor) beat() {
	s.lastTurn.Store(time.Now().UnixNano())
	if s.hooks.OnTick != nil {
		s.hooks.OnTick()
	}
}

// update changes the status; a change of state is logged once, with its reason.
func (s *Supervisor) update(f func(*Status)) {
	old := s.status.Load()
	st := old.clone()
	f(&st)
	if st.State != old.State {
		st.Since = time.Now()
		s.log.Info("state "+string(st.State), zap.String("from", string(old.State)), zap.String("reason", st.Reason),
			zap.Int("rung", st.Rung.Index), zap.Int("max_num_seqs", st.Rung.MaxNumSeqs),
			zap.Float64("gpu_memory_utilization", st.Rung.GPUMemoryUtilization))
	}
	s.status.Store(&st)
	if st.State != old.State && s.hooks.OnState != nil {
		s.hooks.OnState(st.clone())
	}
}

func (s *Supervisor) transition(state State, reason string) {
	s.update(func(st *Status) { st.State, st.Reason = state, reason })
}

func (s *Supervisor) persist() {
	if s.hooks.OnPolicy != nil {
		s.hooks.OnPolicy(s.pol.State())
	}
}

// Exit codes of `vllm-guard run` (SPEC §2).
const (
	ExitStopped = 0
	ExitGaveUp  = 1
	ExitConfig  = 78
)

// Run supervises vLLM until ctx is cancelled (exit 0) or the policy gives
// up (exit 1, or 78 for a configuration error).
func (s *Supervisor) Run(ctx context.Context) int {
	sink := newLogSink(s.log)
	defer sink.close()
	for {
		rung := s.pol.Current()
		s.update(func(st *Status) { st.Rung = rung })
		if s.gpu != nil && !s.waitFreeGPU(ctx, rung) {
			return s.stopped()
		}
		res := s.runOnce(ctx, sink, rung)
		if res.kind == outcomeStop {
			return s.stopped()
		}
		if res.kind == outcomeRestart {
			s.log.Info("restarting vLLM on request", zap.String("peer", res.peer))
			continue
		}
		if res.kind == outcomeRestore {
			s.pol.OnRestore(time.Now())
			s.persist()
			s.log.Info("stepped one rung up after a stable stretch", zap.Int("rung", s.pol.Current().Index),
				zap.Int("max_num_seqs", s.pol.Current().MaxNumSeqs),
				zap.Float64("gpu_memory_utilization", s.pol.Current().GPUMemoryUtilization))
			continue
		}
		f := s.fail(res, rung)
		if f.Decision.Action == policy.ActionGiveUp {
			return s.giveUp(ctx, f)
		}
		if s.gpu != nil {
			if !s.waitReleased(ctx, res) {
				return s.stopped()
			}
		}
		if !s.backoff(ctx, f.Decision) {
			return s.stopped()
		}
	}
}

func (s *Supervisor) stopped() int {
	s.update(func(st *Status) {
		st.State, st.Reason, st.PID, st.ExitCode = StateStopped, "stopped on request", 0, ExitStopped
	})
	return ExitStopped
}

func (s *Supervisor) giveUp(ctx context.Context, f Failure) int {
	code := f.Decision.ExitCode
	s.update(func(st *Status) {
		st.State, st.Reason, st.PID, st.ExitCode = StateFailed, "gave up: "+f.Decision.Reason, 0, code
	})
	s.log.Error("gave up on vLLM", zap.String("cause", string(f.Verdict.Cause)), zap.String("reason", f.Decision.Reason),
		zap.Int("exit_code", code))
	if s.cfg.Restart.OnGiveUp != "stay" {
		return code
	}
	// "stay": keep answering status until asked to stop.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ExitStopped
		case r := <-s.reqs:
			r.reply <- errors.New("the guard gave up; restart the guard itself (systemctl restart) after fixing the cause")
		case <-tick.C:
			s.beat()
		}
	}
}

// fail classifies a death, asks the policy what next, and tells the hooks.
func (s *Supervisor) fail(res outcome, rung policy.Rung) Failure {
	now := time.Now()
	exit := policy.Exit{
		Lines:         res.lines,
		ExitCode:      res.exit.Code,
		Signal:        res.exit.Signal,
		SignalByGuard: res.killedByGuard,
		Hang:          res.hang,
		HostOOMKill:   res.hostOOM,
		Phase:         res.phase,
		Critical:      s.cfg.GPU.CriticalFraction,
		StartFailure:  res.exit.StartFailure,
	}
	if s.gpu != nil {
		exit.MemFractions = s.gpu.RecentFractions(10)
	}
	v := policy.Classify(exit)
	d := s.pol.OnFailure(now, v)
	s.persist()
	s.describeCost()
	f := Failure{Time: now, PID: res.pid, Exit: res.exit.String(), ExitCode: res.exit.Code, Signal: res.exit.Signal,
		Phase: res.phase, Verdict: v, Decision: d, RungBefore: rung, Lines: res.lines, MemFractions: exit.MemFractions, Uptime: res.uptime}
	fields := []zap.Field{zap.String("cause", string(v.Cause)), zap.String("confidence", v.Confidence),
		zap.String("summary", v.Summary), zap.String("exit", f.Exit), zap.String("phase", string(res.phase)),
		zap.String("action", string(d.Action)), zap.Int("next_rung", d.Rung.Index), zap.Int("next_max_num_seqs", d.Rung.MaxNumSeqs),
		zap.Float64("next_gpu_memory_utilization", d.Rung.GPUMemoryUtilization), zap.Duration("delay", d.Delay), zap.String("reason", d.Reason)}
	if len(v.Evidence) > 0 {
		fields = append(fields, zap.Int("evidence_line", v.Evidence[0].N), zap.String("evidence", v.Evidence[0].Text))
	}
	s.log.Warn("vLLM failed", fields...)
	s.update(func(st *Status) {
		st.Restarts[v.Cause]++
		st.LastFailure = &f
		st.PID = 0
	})
	if s.hooks.OnFailure != nil {
		s.hooks.OnFailure(f)
	}
	return f
}

// backoff waits the decided delay; an operator's restart skips the wait.
func (s *Supervisor) backoff(ctx context.Context, d policy.Decision) bool {
	next := time.Now().Add(d.Delay)
	s.update(func(st *Status) {
		st.State, st.Reason, st.NextStartAt, st.Rung = StateBackoff,
			fmt.Sprintf("restarting in %s on rung %d: %s", d.Delay.Round(time.Millisecond), d.Rung.Index, d.Reason), next, d.Rung
	})
	timer := time.NewTimer(d.Delay)
	defer timer.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			s.update(func(st *Status) { st.NextStartAt = time.Time{} })
			return true
		case r := <-s.reqs:
			if s.handleRequest(r) {
				return true
			}
		case <-tick.C:
			s.beat()
		}
	}
}

// handleRequest answers an operator's request; it reports whether the
// request asks to restart now.
func (s *Supervisor) handleRequest(r request) bool {
	switch r.kind {
	case "restart":
		s.log.Info("operator asked for a restart", zap.String("peer", r.peer))
		r.reply <- nil
		return true
	case "reset_profile":
		s.pol.ResetProfile()
		s.persist()
		s.log.Info("operator reset the profile: rung 0 at the next start", zap.String("peer", r.peer),
			zap.Int("max_num_seqs", s.pol.Current().MaxNumSeqs))
		r.reply <- nil
	default:
		r.reply <- fmt.Errorf("unknown request %q", r.kind)
	}
	return false
}
