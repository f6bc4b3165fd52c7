package main

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/freeport"
)

// The supervisors, in table order.
const (
	supGuard          = "vllm-guard"
	supSystemd        = "systemd"
	supSystemdSteps   = "systemd+steps"
	supKubelet        = "kubelet"
	supSupervisord    = "supervisord"
	sampleEvery       = 100 * time.Millisecond // availability samples, real time
	clientEvery       = 250 * time.Millisecond // the steady client: 4 requests/s per run
	heldEvery         = 250 * time.Millisecond
	stableFor         = 5 * time.Minute // scenario time a ready stretch must last to count as stable
	healthTimeout     = time.Second
	completionTimeout = 2 * time.Second
)

var supervisors = []string{supGuard, supSystemd, supSystemdSteps, supKubelet, supSupervisord}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// drive runs the supervisor under test until ctx ends.
func (r *run) drive(ctx context.Context) {
	s := r.s
	switch r.sup {
	case supGuard:
		r.guardRun(ctx)
	case supSystemd, supSystemdSteps:
		cfg := systemdConfig{RestartSec: s.D(100 * time.Millisecond), StartLimitInterval: s.D(10 * time.Second),
			StartLimitBurst: 5, TimeoutStop: s.D(90 * time.Second)}
		if r.sup == supSystemdSteps {
			cfg.RestartSteps, cfg.RestartMaxDelay = 10, s.D(5*time.Minute)
		}
		r.systemdBaseline(ctx, cfg)
	case supKubelet:
		r.kubeletBaseline(ctx, kubeletConfig{initialDelay: s.D(120 * time.Second), period: s.D(10 * time.Second),
			threshold: 3, probeTimeout: max(s.D(time.Second), time.Second), grace: s.D(30 * time.Second),
			backoffInitial: s.D(10 * time.Second), backoffMax: s.D(300 * time.Second)})
	case supSupervisord:
		// startsecs stays supervisord's real 1 s at any scale: it judges how
		// fast a process fails at startup (an exec, an argparse error), which
		// takes real time, not scenario time; scaled to 50 ms it measured
		// the machine's load instead of the failure.
		startsecs := max(s.D(time.Second), time.Second)
		if r.startsecs > 0 {
			startsecs = r.startsecs
		}
		r.supervisordBaseline(ctx, supervisordProgram{startsecs: startsecs, startretries: 3,
			exitcodes: []int{0}, second: s.D(time.Second)})
	}
}

// execute runs the scenario under the supervisor and measures it.
func (r *run) execute(parent context.Context) Result {
	// The port is picked now, not when the matrix was built: a port picked
	// minutes ahead may meanwhile serve as some connection's local port.
	port, err := freeport.Pick()
	if err != nil {
		return Result{Scenario: r.sc.Name, Supervisor: r.sup, FinalState: "not run: " + err.Error()}
	}
	r.port = port
	r.t0 = time.Now()
	length := r.s.D(r.sc.Length)
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	driverDone := make(chan struct{})
	go func() {
		defer close(driverDone)
		r.drive(ctx)
	}()
	var wg sync.WaitGroup
	measure, stopMeasure := context.WithCancel(ctx)
	wg.Go(func() { r.sampleLoop(measure) })
	wg.Go(func() { r.clientLoop(measure) })
	wg.Go(func() { r.heldLoop(measure) })

	// The scenario ends at its length, or earlier when the supervisor has
	// stopped for good (nothing changes after that: the rest counts as down).
	deadline := time.NewTimer(length)
	defer deadline.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
wait:
	for {
		select {
		case <-deadline.C:
			break wait
		case <-parent.Done():
			break wait
		case <-poll.C:
			if rec := r.snapshot(); rec.terminal != "" && r.quiet() {
				break wait
			}
		}
	}
	stopMeasure()
	wg.Wait()
	e := r.endState()
	cancel()
	<-driverDone
	r.teardown()
	return summarize(r.sc, r.sup, r.s, r.snapshot(), e, min(r.since(), length), length)
}

// quiet: nothing of the run serves any more (no listener), so the
// scenario's outcome is settled.
func (r *run) quiet() bool {
	return r.guardPID.Load() == 0 && r.root.Load() == 0 && !r.get("/health", 200*time.Millisecond)
}

func (r *run) sampleLoop(ctx context.Context) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		at := r.since()
		ok := r.get("/health", healthTimeout) && r.complete(1, completionTimeout)
		r.note(func(rec *record) { rec.samples = append(rec.samples, sample{at: at, ok: ok}) })
	}
}

// clientLoop is the steady client load, straight to vLLM's port.
func (r *run) clientLoop(ctx context.Context) {
	t := time.NewTicker(clientEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok := r.complete(8, completionTimeout)
		r.note(func(rec *record) {
			rec.reqs++
			if !ok {
				rec.reqFailed++
			}
		})
	}
}

// currentTree is the root of the vLLM tree the supervisor runs now: the
// baseline's main process, or the guard's newest child (its keeper).
func (r *run) currentTree(t procTable) int {
	if g := int(r.guardPID.Load()); g != 0 {
		return t.youngestChild(g)
	}
	return int(r.root.Load())
}

// heldLoop watches for GPU memory held by processes outside the current
// tree while that tree is starting: the memory the next start finds taken.
func (r *run) heldLoop(ctx context.Context) {
	t := time.NewTicker(heldEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tab := r.scan.table(heldEvery / 2)
		root := r.currentTree(tab)
		rec := r.snapshot()
		if root == 0 || (len(rec.samples) > 0 && rec.samples[len(rec.samples)-1].ok) {
			continue
		}
		var others []proc
		for _, p := range tab.tagged(r.tag) {
			if !tab.descends(p.pid, root) {
				others = append(others, p)
			}
		}
		if held := gpuBytes(r.gpuDir, others); held > 0 {
			r.note(func(rec *record) { rec.heldAtStart = max(rec.heldAtStart, held) })
		}
	}
}

// endState looks at the run as the scenario ends, before anything is stopped.
func (r *run) endState() end {
	var e end
	// Serving now: a fresh check, once more after a short pause so that
	// one probe losing the CPU race does not decide the final state.
	for i := range 2 {
		if e.serving = r.get("/health", healthTimeout) && r.complete(1, completionTimeout); e.serving || r.quiet() {
			break
		}
		if i == 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	tab := r.scan.table(0)
	known := int(r.guardPID.Load()) // the guard knows its whole tree (its keeper is a subreaper)
	if known == 0 {
		known = int(r.root.Load()) // a baseline knows its main process
	}
	var orphans []proc
	for _, p := range tab.tagged(r.tag) {
		if !tab.descends(p.pid, known) {
			orphans = append(orphans, p)
		}
	}
	e.orphans, e.orphanGPU = len(orphans), gpuBytes(r.gpuDir, orphans)
	if e.serving {
		if v, ok := r.metric("fakevllm_true_safe_max_num_seqs"); ok {
			e.safeMax, e.sawMetrics = int(v), true
		}
		if v, ok := r.metric("fakevllm_true_seq_cost_bytes"); ok {
			e.seqCost = int64(v)
		}
	}
	return e
}

// teardown removes every process of the run, whoever owns it.
func (r *run) teardown() {
	for range 3 {
		ps := r.left()
		if len(ps) == 0 {
			return
		}
		killAll(ps)
		r.waitGone(2 * time.Second)
	}
}
