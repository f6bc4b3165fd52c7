package policy

import (
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/vllm-guard/vllm-guard/internal/admission"
	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

// maxCostSamples bounds the cost samples kept (and persisted in state.json).
const maxCostSamples = 600

// Clock is the only way the backoff learns the time: callers pass theirs in.
// With MaxElapsedTime 0 backoff/v4 only uses it to stamp Reset, so a nil
// Clock is replaced by a constant one rather than the system clock.
type Clock interface{ Now() time.Time }

type zeroClock struct{}

func (zeroClock) Now() time.Time { return time.Time{} }

// maxRestoreMultiplier bounds the relapse doubling of restore_after, so a
// flapping profile waits at most 64 × restore_after before trying again.
const maxRestoreMultiplier = 64

// maxFailures bounds the failure history kept in State (status and
// state.json stay small even with a huge give_up_after).
const maxFailures = 256

// Failure is one failed start, as kept in State for the crash-loop count and
// for status.
type Failure struct {
	Time  time.Time   `json:"time"`
	Cause cause.Cause `json:"cause"`
}

// State is what survives a restart of the guard (state.json). The zero
// State is rung 0 with no history; every field added since the first
// version is zero-compatible so an old state.json still loads.
type State struct {
	// Rung is the ladder position reached (Current().Index).
	Rung int `json:"rung"`
	// UtilStepsBack counts the gpu_memory_utilization steps taken back by
	// kv_insufficient decisions: the profile in force uses the utilization of
	// rung Rung-UtilStepsBack and the max_num_seqs of rung Rung.
	UtilStepsBack int `json:"util_steps_back,omitempty"`
	// Profile is the profile in force, for humans reading state.json; New
	// recomputes it from Rung and UtilStepsBack.
	Profile Rung `json:"profile"`
	// Failures are the recent failed starts (inside give_up_window), oldest first.
	Failures []Failure `json:"failures,omitempty"`
	// LoopSince: failures before this time do not count toward give-up
	// (set when a run stayed ready for reset_after).
	LoopSince time.Time `json:"loop_since,omitzero"`
	// Attempts is the number of backoff steps since the last reset; New
	// replays them so a restarted guard keeps its backoff.
	Attempts int `json:"attempts,omitempty"`
	// RestoredAt is when the last step up (restore) happened; an OOM within
	// restore_after of it is a relapse. Zero once the restore held.
	RestoredAt time.Time `json:"restored_at,omitzero"`
	// RestoreMultiplier scales restore_after; each relapse doubles it.
	RestoreMultiplier int `json:"restore_multiplier,omitempty"`
	// ComputedMaxNumSeqs, when > 0, is a max_num_seqs computed from the
	// cost model that replaces the ladder's on rung Rung.
	ComputedMaxNumSeqs int `json:"computed_max_num_seqs,omitempty"`
	// ComputedGPUMemoryUtilization, when > 0, replaces the ladder's
	// utilization on rung Rung (lowered to make room for the computed rung).
	ComputedGPUMemoryUtilization float64 `json:"computed_gpu_memory_utilization,omitempty"`
	// CostSamples are the (running sequences, memory) observations the
	// cost model is fitted on, newest last.
	CostSamples []admission.CostSample `json:"cost_samples,omitempty"`
	// LongestTimeToReady is the longest time from a launch to ready seen
	// in this state_dir: the proxy holds requests while vLLM restarts for
	// up to 1.5 times it (issue 30).
	LongestTimeToReady time.Duration `json:"longest_time_to_ready_ns,omitempty"`
}

// Policy holds the decision history of one guard. It is not safe for
// concurrent use: the supervisor's event loop owns it.
type Policy struct {
	cfg    Config
	ladder []Rung
	clock  Clock

	seqStep  int // ladder position of max_num_seqs (= Current().Index)
	utilStep int // ladder position of gpu_memory_utilization, ≤ seqStep

	bo       *backoff.ExponentialBackOff
	attempts int

	failures  []Failure
	loopSince time.Time

	startedAt time.Time
	readyAt   time.Time // zero while not ready

	restoredAt  time.Time
	restoreMult int

	computed     int                    // > 0: max_num_seqs computed from the cost model, in place of the ladder's
	computedUtil float64                // > 0: gpu_memory_utilization lowered further than the ladder's to make room
	costSamples  []admission.CostSample // newest last, at most maxCostSamples
	kvBase       uint64                 // rung 0's --kv-cache-memory-bytes (0: none)
	longestTTR   time.Duration
}

// Reconfigure takes a reloaded configuration ([profile], [restart]): the
// ladder and the backoff follow it; the rung, the history and the cost
// model are kept.
func (p *Policy) Reconfigure(cfg Config) { *p = *New(cfg, p.State(), p.clock) }

// New returns a policy over cfg, resuming from st (the zero State is rung 0).
// clock is handed to backoff/v4 as its clock provider and nothing else.
func New(cfg Config, st State, clock Clock) *Policy {
	if clock == nil {
		clock = zeroClock{}
	}
	p := &Policy{cfg: cfg, ladder: Ladder(cfg.Profile), clock: clock}
	last := len(p.ladder) - 1
	p.seqStep = min(max(st.Rung, 0), last)
	p.utilStep = min(max(p.seqStep-max(st.UtilStepsBack, 0), 0), last)
	p.bo = backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(cfg.Restart.InitialDelay),
		backoff.WithMaxInterval(cfg.Restart.MaxDelay),
		backoff.WithMultiplier(cfg.Restart.Multiplier),
		backoff.WithRandomizationFactor(cfg.Restart.Jitter),
		backoff.WithMaxElapsedTime(0),
		backoff.WithClockProvider(clock),
	)
	// Replay the backoff steps already taken: the interval is private to
	// backoff/v4, and stepping it is the only way to restore it.
	for i := 0; i < min(max(st.Attempts, 0), 64); i++ {
		p.bo.NextBackOff()
	}
	p.attempts = max(st.Attempts, 0)
	p.failures = append([]Failure(nil), st.Failures...)
	p.loopSince = st.LoopSince
	p.restoredAt = st.RestoredAt
	p.restoreMult = min(max(st.RestoreMultiplier, 1), maxRestoreMultiplier)
	if st.ComputedMaxNumSeqs > 0 {
		p.computed = min(max(st.ComputedMaxNumSeqs, cfg.Profile.MinMaxNumSeqs), cfg.Profile.MaxNumSeqs)
	}
	if u := st.ComputedGPUMemoryUtilization; u > 0 {
		p.computedUtil = min(max(u, cfg.Profile.MinGPUMemoryUtilization), cfg.Profile.GPUMemoryUtilization)
	}
	if n := len(st.CostSamples); n > maxCostSamples {
		st.CostSamples = st.CostSamples[n-maxCostSamples:]
	}
	p.costSamples = append([]admission.CostSample(nil), st.CostSamples...)
	p.longestTTR = max(st.LongestTimeToReady, 0)
	return p
}

// Ladder computes every rung from rung 0 down to the floors: each rung
// multiplies max_num_seqs by the factor (floored at min_max_num_seqs) and
// lowers gpu_memory_utilization by the step (floored at the minimum). The
// ladder ends when neither value can go lower.
func Ladder(p Profile) []Rung {
	r := Rung{Index: 0, MaxNumSeqs: p.MaxNumSeqs, GPUMemoryUtilization: p.GPUMemoryUtilization}
	out := []Rung{r}
	for i := 1; i < 64; i++ {
		// min(…, r.X) keeps a rung 0 already below a floor from climbing to it.
		n := min(max(int(float64(r.MaxNumSeqs)*p.MaxNumSeqsFactor), p.MinMaxNumSeqs), r.MaxNumSeqs)
		u := min(max(round2(r.GPUMemoryUtilization-p.GPUMemoryUtilizationStep), p.MinGPUMemoryUtilization), r.GPUMemoryUtilization)
		if n == r.MaxNumSeqs && u == r.GPUMemoryUtilization {
			break
		}
		r = Rung{Index: i, MaxNumSeqs: n, GPUMemoryUtilization: u}
		out = append(out, r)
	}
	return out
}

func round2(f float64) float64 { return float64(int(f*100+0.5)) / 100 }

// KVBytesFor is the KV cache size of a rung when the operator sized it in
// bytes (--kv-cache-memory-bytes base at rung 0's utilization util0): vLLM
// then ignores utilization for the KV cache, so stepping utilization down
// after an OOM would change nothing. The bytes step instead, by the same
// ratio the utilization step gives (util / util0), floored to a whole MiB.
// 0 when base is 0.
func KVBytesFor(base uint64, util0, util float64) uint64 {
	if base == 0 || util0 <= 0 || util >= util0 {
		return base
	}
	b := uint64(float64(base) * util / util0)
	return b &^ (1<<20 - 1)
}

// LadderKV is Ladder with each rung's KV cache bytes for a rung 0 of
// kvBytes (0: none).
func LadderKV(p Profile, kvBytes uint64) []Rung {
	out := Ladder(p)
	for i := range out {
		out[i].KVCacheMemoryBytes = KVBytesFor(kvBytes, p.GPUMemoryUtilization, out[i].GPUMemoryUtilization)
	}
	return out
}

// SetKVCacheBytes says that the operator sizes vLLM's KV cache in bytes
// (--kv-cache-memory-bytes, rung 0's value): every rung then carries its
// bytes (KVBytesFor). 0: vLLM sizes it from the utilization.
func (p *Policy) SetKVCacheBytes(b uint64) { p.kvBase = b }

// Current is the profile the next start uses. It is ladder rung Index unless a
// kv_insufficient decision traded utilization steps for max_num_seqs steps.
func (p *Policy) Current() Rung {
	r := Rung{
		Index:                p.seqStep,
		MaxNumSeqs:           p.ladder[p.seqStep].MaxNumSeqs,
		GPUMemoryUtilization: p.ladder[p.utilStep].GPUMemoryUtilization,
	}
	if p.computed > 0 {
		r.MaxNumSeqs = p.computed
	}
	if p.computedUtil > 0 {
		r.GPUMemoryUtilization = p.computedUtil
	}
	r.KVCacheMemoryBytes = KVBytesFor(p.kvBase, p.cfg.Profile.GPUMemoryUtilization, r.GPUMemoryUtilization)
	return r
}

// Rungs returns the whole precomputed ladder (a copy).
func (p *Policy) Rungs() []Rung {
	out := append([]Rung(nil), p.ladder...)
	for i := range out {
		out[i].KVCacheMemoryBytes = KVBytesFor(p.kvBase, p.cfg.Profile.GPUMemoryUtilization, out[i].GPUMemoryUtilization)
	}
	return out
}

// State returns what to persist.
func (p *Policy) State() State {
	return State{
		Rung:                         p.seqStep,
		UtilStepsBack:                p.seqStep - p.utilStep,
		Profile:                      p.Current(),
		Failures:                     append([]Failure(nil), p.failures...),
		LoopSince:                    p.loopSince,
		Attempts:                     p.attempts,
		RestoredAt:                   p.restoredAt,
		RestoreMultiplier:            p.restoreMult,
		ComputedMaxNumSeqs:           p.computed,
		ComputedGPUMemoryUtilization: p.computedUtil,
		CostSamples:                  append([]admission.CostSample(nil), p.costSamples...),
		LongestTimeToReady:           p.longestTTR,
	}
}

// ObserveCost records one sample while vLLM serves on the profile in force:
// running sequences and the GPU memory in use (the fullest device).
func (p *Policy) ObserveCost(running float64, used, total uint64) {
	if total == 0 || running < 0 {
		return
	}
	util := p.Current().GPUMemoryUtilization
	p.costSamples = append(p.costSamples, admission.CostSample{Running: running,
		Above: float64(used) - util*float64(total), Total: float64(total)})
	if n := len(p.costSamples); n > maxCostSamples {
		p.costSamples = append(p.costSamples[:0], p.costSamples[n-maxCostSamples:]...)
	}
}

// Cost is the cost model fitted on the samples so far.
func (p *Policy) Cost() admission.CostModel { return admission.FitCost(p.costSamples) }

// OnStart records a launch of vLLM.
func (p *Policy) OnStart(now time.Time) {
	p.startedAt = now
	p.readyAt = time.Time{}
}

// OnReady records that vLLM became ready.
func (p *Policy) OnReady(now time.Time) {
	if p.readyAt.IsZero() {
		p.readyAt = now
	}
}

// NoteTimeToReady records how long a start took to be ready; the longest
// is kept (State) across restarts of the guard.
func (p *Policy) NoteTimeToReady(d time.Duration) { p.longestTTR = max(p.longestTTR, d) }

// LongestTimeToReady is the longest time to ready seen in this state_dir
// (0: none yet).
func (p *Policy) LongestTimeToReady() time.Duration { return p.longestTTR }

// atFloor: no rung below the one in force.
func (p *Policy) atFloor() bool { return p.seqStep >= len(p.ladder)-1 && p.utilStep >= len(p.ladder)-1 }

// OnFailure records a death of vLLM (any exit the guard did not ask for, or a
// hang kill) and decides what to do next.
func (p *Policy) OnFailure(now time.Time, v cause.Verdict) Decision {
	wasReady := !p.readyAt.IsZero()
	readyFor := now.Sub(p.readyAt)
	p.readyAt = time.Time{}

	// A run that stayed ready for reset_after proves the setup works: the
	// backoff and the crash-loop count start over from this failure.
	if wasReady && readyFor >= p.cfg.Restart.ResetAfter {
		p.bo.Reset()
		p.attempts = 0
		p.loopSince = now
	}
	p.recordFailure(now, v.Cause)

	// A restore that lasted restore_after held: the relapse doubling is over.
	relapse := false
	if !p.restoredAt.IsZero() {
		if now.Sub(p.restoredAt) < p.cfg.Profile.RestoreAfter {
			relapse = v.Cause == cause.CauseOOM
		} else {
			p.restoreMult = 1
		}
		p.restoredAt = time.Time{}
	}

	if v.Cause == cause.CauseConfigError {
		return p.giveUp(exitcode.Config, fmt.Sprintf("configuration error: %s; fix the vLLM command or config and start again (not retried)", v.Words()))
	}

	if v.Cause == cause.CauseGPUFault {
		return p.onGPUFault(now, v)
	}

	d := Decision{Action: ActionRestart}
	switch v.Cause {
	case cause.CauseOOM:
		if relapse {
			p.restoreMult = min(p.restoreMult*2, maxRestoreMultiplier)
		}
		d = p.stepDown(d, relapse)
	case cause.CauseKVInsufficient:
		if d = p.kvStep(d, v); d.Action == ActionGiveUp {
			return d
		}
	case cause.CauseGPUBusy:
		// (the next start's free-memory check, sub-state wait_gpu, waits for it)
		d.Reason = "GPU memory held by another process: waiting for it to be released, same rung"
	case cause.CauseHang:
		d.Reason = "vLLM hung: killed, restarting on the same rung"
	case cause.CauseGroup:
		d.Reason = "the group's epoch ended on another host: the group restarts whole on the same rung"
		if g := v.Group; g != nil {
			d.Reason = fmt.Sprintf("the group's epoch ended on another host (%s): the group restarts whole on the same rung", g.Why)
		}
	case cause.CauseHostOOM:
		d.Reason = "host memory ran out (kernel OOM killer, not the GPU): restarting on the same rung; raise the host/cgroup memory limit"
	default:
		d.Reason = fmt.Sprintf("vLLM died (%s): restarting on the same rung", causeWord(v.Cause))
		if v.GuardStart() {
			d.Reason = v.Summary + ": retrying on the same rung"
		}
	}
	// The crash-loop check comes after the rung change, so a guard that
	// systemd starts again resumes on the lighter rung from state.json.
	if n, window := p.countFailures(now); p.cfg.Restart.GiveUpAfter > 0 && n >= p.cfg.Restart.GiveUpAfter {
		return p.giveUp(exitcode.Failed, fmt.Sprintf("crash loop: %d failed starts within %s (last cause %s); giving up, fix the cause and restart the guard",
			n, window, causeWord(v.Cause)))
	}
	d.Rung = p.Current()
	d.Delay = p.nextDelay()
	return d
}

// kvStep takes a utilization step back for a KV cache too small, lowering
// max_num_seqs instead; no step that really lowered it: give up.
func (p *Policy) kvStep(d Decision, v cause.Verdict) Decision {
	// Only a utilization step that really lowered it can be taken back.
	u := p.utilStep - 1
	for u > 0 && p.ladder[u].GPUMemoryUtilization == p.ladder[p.utilStep].GPUMemoryUtilization {
		u--
	}
	if u < 0 || p.ladder[u].GPUMemoryUtilization <= p.ladder[p.utilStep].GPUMemoryUtilization {
		return p.giveUp(exitcode.Config, fmt.Sprintf("KV cache does not fit at gpu_memory_utilization %.2f (%s): raise [profile] gpu_memory_utilization "+
			"or lower --max-model-len (not retried)", p.Current().GPUMemoryUtilization, v.Words()))
	}
	from := p.Current()
	p.computed, p.computedUtil = 0, 0
	p.utilStep = u
	s := p.seqStep + 1
	for s < len(p.ladder)-1 && p.ladder[s].MaxNumSeqs == from.MaxNumSeqs {
		s++
	}
	if s < len(p.ladder) && p.ladder[s].MaxNumSeqs < from.MaxNumSeqs {
		p.seqStep = s
	}
	to := p.Current()
	d.Reason = fmt.Sprintf("KV cache too small: gpu_memory_utilization back up %.2f→%.2f, max_num_seqs %d→%d instead",
		from.GPUMemoryUtilization, to.GPUMemoryUtilization, from.MaxNumSeqs, to.MaxNumSeqs)
	if to.MaxNumSeqs == from.MaxNumSeqs {
		d.Reason += " (max_num_seqs already at its floor)"
	}
	return d
}

// stepDown moves one rung down for an OOM, or reports the floor.
func (p *Policy) stepDown(d Decision, relapse bool) Decision {
	if p.atFloor() {
		d.AtFloor = true
		cur := p.Current()
		d.Reason = fmt.Sprintf("GPU out of memory at the ladder's floor (max_num_seqs %d, gpu_memory_utilization %.2f): "+
			"cannot step lower, backing off on the same rung; lower --max-model-len or move to a larger GPU", cur.MaxNumSeqs, cur.GPUMemoryUtilization)
		return d
	}
	from := p.Current()
	p.seqStep = min(p.seqStep+1, len(p.ladder)-1)
	p.utilStep = min(p.utilStep+1, len(p.ladder)-1)
	p.computed, p.computedUtil = 0, 0
	how := p.computeDown(from)
	to := p.Current()
	d.Reason = fmt.Sprintf("GPU out of memory: rung %d→%d (max_num_seqs %d→%d, gpu_memory_utilization %.2f→%.2f); %s",
		from.Index, to.Index, from.MaxNumSeqs, to.MaxNumSeqs, from.GPUMemoryUtilization, to.GPUMemoryUtilization, how)
	if to.KVCacheMemoryBytes > 0 {
		d.Reason = fmt.Sprintf("GPU out of memory: rung %d→%d (max_num_seqs %d→%d, kv_cache_memory_bytes %d→%d); %s",
			from.Index, to.Index, from.MaxNumSeqs, to.MaxNumSeqs, from.KVCacheMemoryBytes, to.KVCacheMemoryBytes, how)
	}
	if relapse {
		d.Reason += fmt.Sprintf("; OOM soon after a restore, next restore waits %s", p.restoreWait())
	}
	d.AtFloor = p.atFloor()
	if d.AtFloor {
		d.Reason += "; the ladder's floor is reached"
	}
	return d
}

func (p *Policy) nextDelay() time.Duration {
	p.attempts++
	return p.bo.NextBackOff()
}

func (p *Policy) giveUp(code int, reason string) Decision {
	return Decision{Action: ActionGiveUp, Rung: p.Current(), ExitCode: code, Reason: reason, AtFloor: p.atFloor()}
}

func (p *Policy) recordFailure(now time.Time, c cause.Cause) {
	window := p.cfg.Restart.GiveUpWindow
	kept := p.failures[:0]
	for _, f := range p.failures {
		if window <= 0 || now.Sub(f.Time) < window {
			kept = append(kept, f)
		}
	}
	p.failures = append(kept, Failure{Time: now, Cause: c})
	if len(p.failures) > maxFailures {
		p.failures = append(p.failures[:0], p.failures[len(p.failures)-maxFailures:]...)
	}
}

// countFailures counts the failed starts that count toward give-up.
func (p *Policy) countFailures(now time.Time) (int, time.Duration) {
	window := p.cfg.Restart.GiveUpWindow
	n := 0
	for _, f := range p.failures {
		if f.Time.Before(p.loopSince) {
			continue
		}
		if window > 0 && now.Sub(f.Time) >= window {
			continue
		}
		n++
	}
	return n, window
}

func (p *Policy) restoreWait() time.Duration {
	return p.cfg.Profile.RestoreAfter * time.Duration(p.restoreMult)
}

// RestoreDue says whether to step one rung up now: restore_after > 0,
// on rung k > 0, ready for restore_after (times the relapse multiplier), the
// peak GPU fraction since ready below the warning threshold (of the rung's
// budget), and vLLM idle. It returns
// the rung to restart on; the caller restarts vLLM and calls OnRestore.
func (p *Policy) RestoreDue(now time.Time, peakFraction float64, idle bool) (Rung, bool) {
	if p.cfg.Profile.RestoreAfter <= 0 || p.seqStep == 0 || p.readyAt.IsZero() {
		return Rung{}, false
	}
	// Check before the others: a restore that held ends the relapse window.
	if !p.restoredAt.IsZero() && now.Sub(p.restoredAt) >= p.cfg.Profile.RestoreAfter {
		p.restoredAt = time.Time{}
		p.restoreMult = 1
	}
	warn, _ := p.cfg.Thresholds.At(p.Current().GPUMemoryUtilization)
	if now.Sub(p.readyAt) < p.restoreWait() || peakFraction >= warn || !idle {
		return Rung{}, false
	}
	up, cur := p.upOne(), p.Current()
	if up.MaxNumSeqs <= cur.MaxNumSeqs && up.GPUMemoryUtilization <= cur.GPUMemoryUtilization {
		return Rung{}, false // the cost model says nothing more fits
	}
	return up, true
}

// upOne is the profile one rung up: both steps back by one (utilization
// already back by kv_insufficient decisions stays where it is until the
// max_num_seqs step catches up).
func (p *Policy) upOne() Rung {
	s := p.seqStep - 1
	u := min(p.utilStep, s)
	r := Rung{Index: s, MaxNumSeqs: p.ladder[s].MaxNumSeqs, GPUMemoryUtilization: p.ladder[u].GPUMemoryUtilization}
	// With a confident cost model the step up goes to the computed safe
	// value, not blindly to the rung above.
	if m := p.Cost(); m.Confident {
		if safe := m.SafeMaxNumSeqs(r.GPUMemoryUtilization, p.cfg.Profile.Headroom); safe < r.MaxNumSeqs {
			r.MaxNumSeqs = max(safe, p.Current().MaxNumSeqs, p.cfg.Profile.MinMaxNumSeqs)
		}
	}
	return r
}

// OnRestore records that the guard stepped one rung up at now (the caller
// stops vLLM on purpose: that stop is not a failure).
func (p *Policy) OnRestore(now time.Time) {
	if p.seqStep == 0 {
		return
	}
	r := p.upOne()
	p.seqStep = r.Index
	p.utilStep = min(p.utilStep, r.Index)
	p.computed, p.computedUtil = 0, 0
	if r.MaxNumSeqs != p.ladder[r.Index].MaxNumSeqs {
		p.computed = r.MaxNumSeqs
	}
	p.restoredAt = now
	p.readyAt = time.Time{}
}

// computeDown replaces the ladder's max_num_seqs of the new rung by the
// largest one the cost model predicts safe, when it is confident; it says
// which way the rung was chosen. When the rung's utilization leaves too
// little room to beat the halving ladder, it gives up KV cache before
// concurrency: utilization goes down (to its floor at most) until the
// computed max_num_seqs is at least the ladder's.
func (p *Policy) computeDown(from Rung) string {
	m := p.Cost()
	if !m.Confident {
		return "halving ladder (" + m.Why + ")"
	}
	h, prof := p.cfg.Profile.Headroom, p.cfg.Profile
	util := p.ladder[p.utilStep].GPUMemoryUtilization
	safe := m.SafeMaxNumSeqs(util, h)
	if safe >= from.MaxNumSeqs {
		return fmt.Sprintf("halving ladder (the cost model predicts %d sequences fit, no fewer than before: this OOM is not explained by concurrency)", safe)
	}
	for safe < p.ladder[p.seqStep].MaxNumSeqs && util > prof.MinGPUMemoryUtilization {
		util = max(round2(util-0.01), prof.MinGPUMemoryUtilization)
		safe = m.SafeMaxNumSeqs(util, h)
	}
	p.computed = min(max(safe, prof.MinMaxNumSeqs), from.MaxNumSeqs)
	if util != p.ladder[p.utilStep].GPUMemoryUtilization {
		p.computedUtil = util
	}
	return "computed from the cost model: " + m.Describe(util, h)
}

// ResetProfile returns to rung 0 at the next start (`vllm-guard profile reset`)
// and forgets the restore history.
func (p *Policy) ResetProfile() {
	p.seqStep, p.utilStep, p.computed, p.computedUtil = 0, 0, 0, 0
	p.restoredAt = time.Time{}
	p.restoreMult = 1
}

func causeWord(c cause.Cause) string {
	if c == "" {
		return "unknown cause"
	}
	return string(c)
}

// AfterMember: a group's leader ([group]) learns, as the group's next
// epoch opens, the cause member's guard gave the end of its own vLLM that
// ended the last epoch, read on that host from its own vLLM's log. When
// the leader's own last end was the group's (counted once, cause group),
// its ladder now reacts as to its own vLLM's: an OOM steps the group
// down, a KV cache too small takes a utilization step back, a
// configuration error gives up (not retried), and the counted failure
// takes the member's cause. Any other cause, or a leader whose own vLLM
// ended with a cause of its own (its ladder reacted to that), changes
// nothing (Reason "").
func (p *Policy) AfterMember(member int, v cause.Verdict) Decision {
	d := Decision{Action: ActionRestart, Rung: p.Current()}
	n := len(p.failures)
	if n == 0 || p.failures[n-1].Cause != cause.CauseGroup {
		return d
	}
	switch v.Cause {
	case cause.CauseConfigError:
		d = p.giveUp(exitcode.Config, fmt.Sprintf("configuration error on member %d's host: %s; fix the vLLM command or config there and start the group again (not retried)", member, v.Words()))
	case cause.CauseOOM:
		d = p.stepDown(d, false)
	case cause.CauseKVInsufficient:
		d = p.kvStep(d, v)
	default:
		return d
	}
	p.failures[n-1].Cause = v.Cause
	d.Rung = p.Current()
	if d.Action != ActionGiveUp {
		d.Reason = fmt.Sprintf("member %d's vLLM ended: %s; the group starts again on its rung", member, d.Reason)
	}
	return d
}

// Follow puts the policy on ladder rung index, the rung a group's leader
// decided ([group]: a follower's vLLM starts on the leader's rung; the
// leader's cost-computed values are not carried, only its ladder rung).
// The history is left as it is: a follower does not decide.
func (p *Policy) Follow(index int) Rung {
	i := min(max(index, 0), len(p.ladder)-1)
	if i != p.seqStep || p.utilStep != i {
		p.seqStep, p.utilStep, p.computed, p.computedUtil = i, i, 0, 0
	}
	return p.Current()
}
