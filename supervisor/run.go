package supervisor

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/policy"
)

type outcomeKind int

const (
	outcomeExited  outcomeKind = iota // vLLM exited (or was killed as hung)
	outcomeStop                       // the guard was asked to stop
	outcomeRestart                    // an operator asked for a restart
	outcomeRestore                    // a stable stretch: step one rung up
)

// outcome is how one run of vLLM ended.
type outcome struct {
	kind          outcomeKind
	peer          string
	exit          exitInfo
	pid           int
	phase         policy.Phase
	hang          string
	killedByGuard bool
	hostOOM       bool
	lines         []policy.Line
	tree          []int    // vLLM's PIDs seen last, for the memory-release wait
	baseline      []uint64 // GPU memory used per device before the launch
	uptime        time.Duration
}

// runOnce starts vLLM on rung, supervises it until it ends, and makes sure
// its whole tree is gone before returning.
func (s *Supervisor) runOnce(ctx context.Context, sink *logSink, rung policy.Rung) outcome {
	argv, ep := BuildArgv(s.cfg.VLLM.Command, s.extra, rung, s.cfg.VLLM.Host, s.cfg.VLLM.Port)
	env := ChildEnv(os.Environ(), s.cfg.VLLM.Env)
	ringSize := max(s.cfg.Log.ChildLines, 1000)
	out := newOutput(sink, ringSize)
	stdout, stderr := out.writer("stdout"), out.writer("stderr")
	oomBefore := hostOOMKills()
	var baseline []uint64
	if s.gpu != nil {
		baseline = s.gpu.UsedBytes()
	}

	s.pol.OnStart(time.Now())
	s.persist()
	startedAt := time.Now()
	s.update(func(st *Status) {
		st.State, st.Reason, st.Phase, st.LastProbe, st.PID, st.StartedAt, st.ReadySince, st.Rung =
			StateStarting, "launching vLLM", "", "", 0, startedAt, time.Time{}, rung
		st.Starts++
	})
	s.log.Info("launching vLLM", zap.Strings("argv", argv), zap.Int("rung", rung.Index))
	if s.hooks.OnStart != nil {
		s.hooks.OnStart(rung)
	}
	c, err := start(launchSpec{keeper: s.keeper, argv: argv, env: env, dir: s.cfg.VLLM.Workdir,
		grace: s.cfg.VLLM.StopTimeout.Duration, stdout: stdout, stderr: stderr})
	if err != nil {
		// The guard could not even run its keeper: that is the guard's fault.
		return outcome{kind: outcomeExited, exit: exitInfo{Code: -1, StartFailure: err.Error()}, phase: policy.PhaseStarting}
	}
	out.pid.Store(int64(c.pid))
	s.update(func(st *Status) { st.PID = c.pid })
	if s.gpu != nil {
		s.gpu.SetTree(c.cachedTree)
		s.gpu.SetLoading(true)
		defer s.gpu.SetTree(nil)
		defer s.gpu.SetLoading(false)
	}

	pr := newProber(ep, s.model)
	defer pr.close()
	var seen treeSeen
	res := s.watch(ctx, c, out, pr, startedAt, &seen)

	// Whatever happened, nothing of this run may survive it.
	seen.add(c.tree())
	res.tree = seen.pids()
	res.baseline = baseline
	if res.kind != outcomeExited || res.hang != "" {
		res.killedByGuard = true
	}
	s.transition(StateStopping, stopReason(res))
	select {
	case <-c.done:
	default:
		s.stopTree(c)
	}
	<-c.done
	// The keeper kills the whole tree before it exits; if the keeper itself
	// was killed, what it left is killed here.
	if left := seen.survivors(); len(left) > 0 {
		s.log.Warn("vLLM processes outlived their keeper: killing them", zap.Ints("pids", left))
		signalAll(left, syscall.SIGKILL)
	}
	stdout.Close()
	stderr.Close()
	res.exit = c.exit
	res.pid = c.pid
	res.lines = out.ring.snapshot()
	res.uptime = time.Since(startedAt)
	res.hostOOM = !res.killedByGuard && res.exit.Signal == "SIGKILL" && hostOOMKills() > oomBefore
	s.update(func(st *Status) { st.LogDropped = sink.dropped.Load() })
	return res
}

func stopReason(res outcome) string {
	switch {
	case res.hang != "":
		return "vLLM hung: " + res.hang
	case res.kind == outcomeRestart:
		return "restart requested"
	case res.kind == outcomeRestore:
		return "restoring one rung up after a stable stretch"
	case res.kind == outcomeExited:
		return "vLLM exited: cleaning up its process tree"
	default:
		return "stop requested"
	}
}

// stopTree stops vLLM: SIGTERM to the group, stop_timeout, then SIGKILL to
// the group and every descendant, including those that left the group.
func (s *Supervisor) stopTree(c *child) {
	c.signalGroup(syscall.SIGTERM)
	timer := time.NewTimer(s.cfg.VLLM.StopTimeout.Duration)
	defer timer.Stop()
	select {
	case <-c.done:
		return
	case <-timer.C:
	}
	s.log.Warn("vLLM did not stop within stop_timeout: killing its process group",
		zap.Duration("stop_timeout", s.cfg.VLLM.StopTimeout.Duration))
	c.kill()
}

// watch follows one run from launch through ready until it ends.
func (s *Supervisor) watch(ctx context.Context, c *child, out *output, pr *prober, startedAt time.Time, seen *treeSeen) outcome {
	probeCtx, cancel := context.WithCancel(ctx)
	probes := make(chan probeResult, 1)
	inflight := false
	probe := func(f func(context.Context) probeResult) {
		if inflight {
			return
		}
		inflight = true
		go func() { probes <- f(probeCtx) }()
	}
	defer func() {
		cancel()
		if inflight {
			<-probes
		}
	}()

	heartbeat := time.NewTicker(time.Second)
	defer heartbeat.Stop()
	rc := s.cfg.Readiness
	poll := time.NewTicker(rc.PollInterval.Duration)
	defer poll.Stop()
	var live *time.Ticker
	liveC := func() <-chan time.Time {
		if live == nil {
			return nil
		}
		return live.C
	}
	defer func() {
		if live != nil {
			live.Stop()
		}
	}()
	// While ready, pair GPU memory with running sequences for the cost model.
	costTick := time.NewTicker(s.cfg.GPU.SampleInterval.Duration)
	defer costTick.Stop()
	ready := false
	failures := 0
	var dying <-chan time.Time // set when /health says the engine is dead
	peak := 0.0                // highest GPU fraction since ready, for restore
	lastSeen := out.lastLine.Load()
	phase := func() policy.Phase {
		if ready {
			return policy.PhaseReady
		}
		return policy.PhaseStarting
	}
	hang := func(reason string) outcome {
		s.log.Warn("vLLM hung: killing its process group", zap.String("reason", reason))
		return outcome{kind: outcomeExited, phase: phase(), hang: reason}
	}

	for {
		select {
		case <-c.apiGone:
			return outcome{kind: outcomeExited, phase: phase()}
		case <-ctx.Done():
			return outcome{kind: outcomeStop, phase: phase()}
		case r := <-s.reqs:
			if s.handleRequest(r) {
				return outcome{kind: outcomeRestart, peer: r.peer, phase: phase()}
			}
		case <-heartbeat.C:
			s.beat()
			seen.add(c.refreshTree())
			if ready {
				if r, ok := s.restoreDue(&peak); ok {
					s.log.Info("stable on a lower rung: restarting one rung up", zap.Int("to_rung", r.Index),
						zap.Int("max_num_seqs", r.MaxNumSeqs), zap.Float64("peak_gpu_fraction", peak))
					return outcome{kind: outcomeRestore, phase: phase()}
				}
			}
		case <-out.startupEnd:
			if !ready {
				probe(func(ctx context.Context) probeResult { return pr.ready(ctx, rc.Probe, rc.ProbeTimeout.Duration) })
			}
		case <-out.progress:
			if !ready {
				ph := out.Phase()
				s.update(func(st *Status) { st.Phase, st.Reason = ph, "loading: "+ph })
				if s.hooks.OnProgress != nil {
					s.hooks.OnProgress(ph)
				}
			}
		case <-poll.C:
			if ready {
				continue
			}
			now := time.Now()
			if seen := out.lastLine.Load(); seen != lastSeen {
				lastSeen = seen
				if s.hooks.OnProgress != nil {
					s.hooks.OnProgress(out.Phase())
				}
			}
			if silent := now.Sub(time.Unix(0, lastSeen)); silent > rc.StallTimeout.Duration {
				return hang(fmt.Sprintf("no load progress for %s while starting (stall_timeout %s), last phase %q",
					silent.Round(time.Second), rc.StallTimeout.Duration, out.Phase()))
			}
			if m := rc.MaxStartTime.Duration; m > 0 && now.Sub(startedAt) > m {
				return hang(fmt.Sprintf("not ready after max_start_time %s", m))
			}
			probe(func(ctx context.Context) probeResult { return pr.ready(ctx, rc.Probe, rc.ProbeTimeout.Duration) })
		case <-costTick.C:
			if ready {
				s.observeCost()
			}
		case <-dying:
			return hang(fmt.Sprintf("/health said vLLM's engine is dead and vLLM did not exit within %s", s.engineDeadGrace()))
		case <-liveC():
			lc := s.cfg.Liveness
			probe(func(ctx context.Context) probeResult { return pr.health(ctx, lc.Timeout.Duration) })
		case r := <-probes:
			inflight = false
			if ctx.Err() != nil {
				continue
			}
			if !ready {
				if !r.ok {
					if !r.refused {
						s.update(func(st *Status) { st.LastProbe = r.step + ": " + r.err })
					}
					continue
				}
				ready = true
				out.loaded.Store(true)
				seen.add(c.refreshTree())
				ttr := time.Since(startedAt)
				s.pol.OnReady(time.Now())
				s.persist()
				first := !s.everReady
				s.everReady = true
				s.update(func(st *Status) {
					st.State, st.Reason, st.ReadySince, st.TimeToReady, st.Phase, st.LastProbe =
						StateReady, "vLLM answered the "+rc.Probe+" probe", time.Now(), ttr, "", ""
				})
				s.log.Info("vLLM ready", zap.Duration("load", ttr), zap.Int("rung", s.pol.Current().Index), zap.Int("pid", c.pid))
				if s.hooks.OnReady != nil {
					s.hooks.OnReady(first, ttr)
				}
				if s.gpu != nil {
					s.gpu.SetLoading(false)
				}
				live = time.NewTicker(s.cfg.Liveness.Interval.Duration)
				continue
			}
			switch {
			case r.ok:
				failures = 0
			case r.status == 503 || r.status == 500:
				// vLLM exits by itself after its engine dies (its watchdog
				// runs every 5 s), printing why: wait for that, and kill
				// only if it does not come.
				if dying == nil {
					grace := s.engineDeadGrace()
					s.log.Warn("vLLM's engine is dead (/health answered "+strconv.Itoa(r.status)+"): waiting for vLLM to exit",
						zap.Duration("grace", grace))
					dying = time.After(grace)
				}
			default:
				failures++
				s.log.Warn("liveness probe failed", zap.String("error", r.err), zap.Int("consecutive", failures),
					zap.Int("failures_allowed", s.cfg.Liveness.Failures))
				if failures >= s.cfg.Liveness.Failures {
					return hang(fmt.Sprintf("%d consecutive liveness failures, last: %s", failures, r.err))
				}
			}
		}
	}
}

// engineDeadGrace is how long the guard waits, after /health says vLLM's
// engine is dead, for vLLM to exit by itself (its watchdog runs every 5 s,
// and it prints the root cause) before it kills it as hung: one liveness
// interval, between 1 and 10 seconds.
func (s *Supervisor) engineDeadGrace() time.Duration {
	return min(10*time.Second, max(time.Second, s.cfg.Liveness.Interval.Duration))
}

// hostOOMKills reads the oom_kill counter of the guard's cgroup (v2), which
// vLLM shares; -1 when unknown.
func hostOOMKills() int64 {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return -1
	}
	var path string
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "0::"); ok {
			path = rest
		}
	}
	ev, err := os.ReadFile("/sys/fs/cgroup" + path + "/memory.events")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(ev), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			var n int64
			fmt.Sscan(v, &n)
			return n
		}
	}
	return -1
}

// restoreDue tracks the peak GPU fraction since ready and asks the policy
// whether to step one rung up (SPEC §7).
func (s *Supervisor) restoreDue(peak *float64) (policy.Rung, bool) {
	if s.cfg.Profile.RestoreAfter.Duration <= 0 {
		return policy.Rung{}, false
	}
	if s.gpu != nil {
		for _, f := range s.gpu.RecentFractions(1) {
			*peak = max(*peak, f)
		}
	}
	idle := false
	if s.load != nil {
		running, waiting, ok := s.load()
		idle = ok && running == 0 && waiting == 0
	}
	return s.pol.RestoreDue(time.Now(), *peak, idle)
}

// treeSeen remembers every process of vLLM's tree seen during a run, with
// its start time: by the time the API server has exited, EngineCore may be
// gone from /proc while the driver still holds its memory, and the release
// wait must know its PID; and if the keeper itself was killed, the tree's
// survivors must be found and killed by the guard.
type treeSeen map[int]uint64

func (t *treeSeen) add(pids []int) {
	if *t == nil {
		*t = treeSeen{}
	}
	for _, p := range pids {
		if info, ok := readStat(p); ok {
			(*t)[p] = info.start
		}
	}
}

func (t treeSeen) pids() []int {
	out := make([]int, 0, len(t))
	for p := range t {
		out = append(out, p)
	}
	return out
}

// survivors are the processes seen in the tree that are still alive (the
// same process: same start time, not a reused PID).
func (t treeSeen) survivors() []int {
	var out []int
	for p, start := range t {
		if info, ok := readStat(p); ok && info.start == start && info.state != 'Z' {
			out = append(out, p)
		}
	}
	return out
}

// observeCost feeds the cost model one (running sequences, memory) pair.
func (s *Supervisor) observeCost() {
	if s.gpu == nil || s.load == nil {
		return
	}
	running, _, ok := s.load()
	used, total, gok := s.gpu.Fullest()
	if !ok || !gok {
		return
	}
	s.pol.ObserveCost(running, used, total)
	s.costObs++
	if s.costObs%10 == 1 {
		s.describeCost()
	}
}

// describeCost puts the cost model's one-line summary in the status.
func (s *Supervisor) describeCost() {
	r := s.pol.Current()
	d := s.pol.Cost().Describe(r.GPUMemoryUtilization, s.cfg.Profile.Headroom)
	s.update(func(st *Status) { st.Cost = d })
}
