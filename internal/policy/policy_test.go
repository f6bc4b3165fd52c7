package policy

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
)

var t0 = time.Date(2026, 1, 12, 10, 0, 0, 0, time.UTC)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func dur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

// defaultConfig is what config.Default() gives the policy (config's
// TestPolicyIsTheDefaults keeps the two the same).
func defaultConfig() Config {
	return Config{
		Profile: Profile{MaxNumSeqs: 256, GPUMemoryUtilization: 0.85, MaxNumSeqsFactor: 0.5, MinMaxNumSeqs: 16,
			GPUMemoryUtilizationStep: 0.05, MinGPUMemoryUtilization: 0.70, Headroom: 0.15},
		Restart: Restart{InitialDelay: 5 * time.Second, MaxDelay: 5 * time.Minute, Multiplier: 2, Jitter: 0.2,
			ResetAfter: 10 * time.Minute, GiveUpAfter: 10, GiveUpWindow: time.Hour},
		Thresholds: Thresholds{WarnOverBudget: 0.03, CriticalOverBudget: 0.05},
	}
}

// testConfig is the default config without jitter, so delays are exact.
func testConfig() Config {
	c := defaultConfig()
	c.Restart.Jitter = 0
	return c
}

func TestLadder(t *testing.T) {
	got := Ladder(defaultConfig().Profile)
	want := []Rung{{0, 256, 0.85, 0}, {1, 128, 0.80, 0}, {2, 64, 0.75, 0}, {3, 32, 0.70, 0}, {4, 16, 0.70, 0}}
	if len(got) != len(want) {
		t.Fatalf("ladder %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("rung %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	// Rung 0 already under a floor never climbs to it.
	p := defaultConfig().Profile
	p.MaxNumSeqs, p.GPUMemoryUtilization = 8, 0.6
	if l := Ladder(p); len(l) != 1 || l[0].MaxNumSeqs != 8 || l[0].GPUMemoryUtilization != 0.6 {
		t.Errorf("ladder below the floors: %v, want the single rung 0", l)
	}
	// Nothing to step: one rung.
	p = defaultConfig().Profile
	p.MaxNumSeqsFactor, p.GPUMemoryUtilizationStep = 1, 0
	if l := Ladder(p); len(l) != 1 {
		t.Errorf("factor 1, step 0: %v, want one rung", l)
	}
}

// step is one event of a sequence and what the policy must answer.
type step struct {
	at    time.Duration // since t0
	ev    string        // start | ready | fail | restore | reset | due
	cause cause.Cause
	peak  float64 // due
	idle  bool    // due

	action   Action
	rung     *Rung
	delay    time.Duration
	exitCode int
	floor    bool
	reason   string // substring of Decision.Reason
	due      bool   // for "due": RestoreDue's answer
}

func r(i, seqs int, util float64) *Rung {
	return &Rung{Index: i, MaxNumSeqs: seqs, GPUMemoryUtilization: util}
}

func runSteps(t *testing.T, cfg Config, st State, steps []step) *Policy {
	t.Helper()
	p := New(cfg, st, fixedClock{t0})
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.ev {
		case "start":
			p.OnStart(now)
		case "ready":
			p.OnReady(now)
		case "restore":
			p.OnRestore(now)
		case "reset":
			p.ResetProfile()
		case "due":
			got, ok := p.RestoreDue(now, s.peak, s.idle)
			if ok != s.due {
				t.Fatalf("step %d (due at %s): %v, want %v", i, s.at, ok, s.due)
			}
			if ok && s.rung != nil && got != *s.rung {
				t.Fatalf("step %d: restore to %+v, want %+v", i, got, *s.rung)
			}
		case "fail":
			d := p.OnFailure(now, cause.Verdict{Cause: s.cause})
			want := s.action
			if want == "" {
				want = ActionRestart
			}
			if d.Action != want {
				t.Fatalf("step %d (%s at %s): action %s (%s), want %s", i, s.cause, s.at, d.Action, d.Reason, want)
			}
			if s.rung != nil && d.Rung != *s.rung {
				t.Fatalf("step %d (%s): rung %+v, want %+v (%s)", i, s.cause, d.Rung, *s.rung, d.Reason)
			}
			if s.rung != nil && p.Current() != d.Rung {
				t.Fatalf("step %d: Current %+v differs from the decision's rung %+v", i, p.Current(), d.Rung)
			}
			if want == ActionRestart && d.Delay != s.delay {
				t.Fatalf("step %d (%s): delay %s, want %s", i, s.cause, d.Delay, s.delay)
			}
			if d.ExitCode != s.exitCode || d.AtFloor != s.floor {
				t.Fatalf("step %d (%s): exit %d floor %v, want %d %v (%s)", i, s.cause,
					d.ExitCode, d.AtFloor, s.exitCode, s.floor, d.Reason)
			}
			if d.Reason == "" || !strings.Contains(d.Reason, s.reason) {
				t.Fatalf("step %d (%s): reason %q, want it to contain %q", i, s.cause, d.Reason, s.reason)
			}
		default:
			t.Fatalf("bad event %q", s.ev)
		}
	}
	return p
}

const (
	s5  = 5 * time.Second
	m1  = time.Minute
	m10 = 10 * time.Minute
)

func TestOnFailureSequences(t *testing.T) {
	restore := testConfig()
	restore.Profile.RestoreAfter = dur("30m")
	loop := testConfig()
	loop.Restart.GiveUpAfter = 3

	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"oom steps down to the floor and keeps backing off", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: 5 * time.Second, reason: "rung 0→1"},
			{at: 2 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(2, 64, 0.75), delay: 10 * time.Second},
			{at: 3 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(3, 32, 0.70), delay: 20 * time.Second},
			{at: 4 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(4, 16, 0.70), delay: 40 * time.Second, floor: true, reason: "floor is reached"},
			{at: 5 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(4, 16, 0.70), delay: 80 * time.Second, floor: true, reason: "floor"},
			{at: 6 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(4, 16, 0.70), delay: 160 * time.Second, floor: true},
			{at: 7 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(4, 16, 0.70), delay: 5 * time.Minute, floor: true},
			{at: 8 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(4, 16, 0.70), delay: 5 * time.Minute, floor: true},
		}},
		{"kv_insufficient on rung 0 gives up as config", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseKVInsufficient, action: ActionGiveUp, exitCode: 78, rung: r(0, 256, 0.85), reason: "lower --max-model-len"},
		}},
		{"kv_insufficient takes a utilization step back for max_num_seqs", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5},
			{at: 2 * m1, ev: "fail", cause: cause.CauseKVInsufficient, rung: r(2, 64, 0.85), delay: 2 * s5, reason: "back up 0.80→0.85"},
			{at: 3 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(3, 32, 0.80), delay: 4 * s5},
			{at: 4 * m1, ev: "fail", cause: cause.CauseKVInsufficient, rung: r(4, 16, 0.85), delay: 8 * s5},
			// utilization back at rung 0's: no step left to take back
			{at: 5 * m1, ev: "fail", cause: cause.CauseKVInsufficient, action: ActionGiveUp, exitCode: 78, reason: "raise [profile] gpu_memory_utilization"},
		}},
		{"gpu_busy waits for memory on the same rung", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseGPUBusy, rung: r(0, 256, 0.85), delay: s5, reason: "waiting"},
			{at: 2 * m1, ev: "fail", cause: cause.CauseGPUBusy, rung: r(0, 256, 0.85), delay: 2 * s5},
		}},
		{"config_error gives up at once", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseConfigError, action: ActionGiveUp, exitCode: 78, reason: "configuration error"},
		}},
		{"hang, crash, host_oom, unknown: same rung with backoff", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseHang, rung: r(0, 256, 0.85), delay: s5, reason: "hung"},
			{at: 2 * m1, ev: "fail", cause: cause.CauseCrash, rung: r(0, 256, 0.85), delay: 2 * s5, reason: "crash"},
			{at: 3 * m1, ev: "fail", cause: cause.CauseHostOOM, rung: r(0, 256, 0.85), delay: 4 * s5, reason: "host memory"},
			{at: 4 * m1, ev: "fail", cause: "", rung: r(0, 256, 0.85), delay: 8 * s5, reason: "unknown cause"},
		}},
		{"crash loop gives up with exit 1", loop, []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseCrash, delay: s5},
			{at: 2 * m1, ev: "fail", cause: cause.CauseOOM, delay: 2 * s5, rung: r(1, 128, 0.80)},
			{at: 3 * m1, ev: "fail", cause: cause.CauseOOM, action: ActionGiveUp, exitCode: 1, rung: r(2, 64, 0.75), reason: "3 failed starts within 1h0m0s"},
		}},
		{"failures outside give_up_window do not count", loop, []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseCrash, delay: s5},
			{at: 2 * m1, ev: "fail", cause: cause.CauseCrash, delay: 2 * s5},
			{at: 62 * m1, ev: "fail", cause: cause.CauseCrash, delay: 4 * s5}, // 2m is exactly 1h old: out
			{at: 63 * m1, ev: "fail", cause: cause.CauseCrash, delay: 8 * s5},
			{at: 64 * m1, ev: "fail", cause: cause.CauseCrash, action: ActionGiveUp, exitCode: 1},
		}},
		{"ready for reset_after resets backoff and the crash-loop count", loop, []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseCrash, delay: s5},
			{at: 2 * m1, ev: "start"},
			{at: 3 * m1, ev: "ready"},
			{at: 13 * m1, ev: "fail", cause: cause.CauseCrash, delay: s5}, // ready exactly reset_after
			{at: 14 * m1, ev: "fail", cause: cause.CauseCrash, delay: 2 * s5},
			{at: 15 * m1, ev: "fail", cause: cause.CauseCrash, action: ActionGiveUp, exitCode: 1},
		}},
		{"ready shorter than reset_after keeps the backoff", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseCrash, delay: s5},
			{at: 2 * m1, ev: "start"},
			{at: 3 * m1, ev: "ready"},
			{at: 12 * m1, ev: "fail", cause: cause.CauseCrash, delay: 2 * s5},
		}},
		{"restore after restore_after idle and cool; relapse doubles the wait", restore, []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5},
			{at: 2 * m1, ev: "start"},
			{at: 3 * m1, ev: "due", peak: 0.5, idle: true, due: false}, // not ready yet
			{at: 4 * m1, ev: "ready"},
			{at: 33*m1 + 59*time.Second, ev: "due", peak: 0.5, idle: true, due: false},
			{at: 34 * m1, ev: "due", peak: 0.95, idle: true, due: false}, // peak over warn_fraction
			{at: 34 * m1, ev: "due", peak: 0.5, idle: false, due: false}, // busy
			{at: 34 * m1, ev: "due", peak: 0.5, idle: true, due: true, rung: r(0, 256, 0.85)},
			{at: 34 * m1, ev: "restore"},
			{at: 35 * m1, ev: "start"},
			{at: 36 * m1, ev: "ready"},
			{at: 50 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5, reason: "next restore waits 1h0m0s"},
			{at: 51 * m1, ev: "start"},
			{at: 52 * m1, ev: "ready"},
			{at: 82 * m1, ev: "due", peak: 0.5, idle: true, due: false},
			{at: 112 * m1, ev: "due", peak: 0.5, idle: true, due: true, rung: r(0, 256, 0.85)},
			{at: 112 * m1, ev: "restore"},
			{at: 113 * m1, ev: "start"},
			{at: 114 * m1, ev: "ready"},
			// held past restore_after: the next OOM is no relapse
			{at: 150 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5},
			{at: 151 * m1, ev: "start"},
			{at: 152 * m1, ev: "ready"},
			{at: 182 * m1, ev: "due", peak: 0.5, idle: true, due: true},
		}},
		{"restore off when restore_after is 0, and never above rung 0", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5},
			{at: 2 * m1, ev: "start"},
			{at: 3 * m1, ev: "ready"},
			{at: 300 * m1, ev: "due", peak: 0.1, idle: true, due: false},
		}},
		{"profile reset returns to rung 0", testConfig(), []step{
			{ev: "start"},
			{at: m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5},
			{at: 2 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(2, 64, 0.75), delay: 2 * s5},
			{at: 3 * m1, ev: "reset"},
			{at: 4 * m1, ev: "fail", cause: cause.CauseCrash, rung: r(0, 256, 0.85), delay: 4 * s5},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, tc.cfg, State{}, tc.steps) })
	}
}

func TestRestoreAfterKVTrade(t *testing.T) {
	cfg := testConfig()
	cfg.Profile.RestoreAfter = dur("10m")
	p := runSteps(t, cfg, State{}, []step{
		{ev: "start"},
		{at: m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5},
		{at: 2 * m1, ev: "fail", cause: cause.CauseKVInsufficient, rung: r(2, 64, 0.85), delay: 2 * s5},
		{at: 3 * m1, ev: "start"},
		{at: 4 * m1, ev: "ready"},
		{at: 14 * m1, ev: "due", peak: 0.5, idle: true, due: true, rung: r(1, 128, 0.85)},
		{at: 14 * m1, ev: "restore"},
	})
	if got := p.Current(); got != *r(1, 128, 0.85) {
		t.Fatalf("after restore: %+v", got)
	}
}

// TestStateRoundTrip: a guard restarted from state.json resumes the rung,
// the kv trade, the backoff, the crash-loop count and the restore history.
func TestStateRoundTrip(t *testing.T) {
	cfg := testConfig()
	cfg.Restart.GiveUpAfter = 5
	cfg.Profile.RestoreAfter = dur("30m")
	p := runSteps(t, cfg, State{}, []step{
		{ev: "start"},
		{at: m1, ev: "fail", cause: cause.CauseOOM, rung: r(1, 128, 0.80), delay: s5},
		{at: 2 * m1, ev: "fail", cause: cause.CauseKVInsufficient, rung: r(2, 64, 0.85), delay: 2 * s5},
		{at: 3 * m1, ev: "fail", cause: cause.CauseOOM, rung: r(3, 32, 0.80), delay: 4 * s5},
		{at: 4 * m1, ev: "start"},
		{at: 5 * m1, ev: "ready"},
		{at: 35 * m1, ev: "due", peak: 0.5, idle: true, due: true},
		{at: 35 * m1, ev: "restore"},
	})
	raw, err := json.Marshal(p.State())
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Profile != p.Current() || len(st.Failures) != 3 || st.Failures[2].Cause != cause.CauseOOM || st.RestoredAt.IsZero() {
		t.Fatalf("state %s", raw)
	}
	q := New(cfg, st, fixedClock{t0})
	if q.Current() != p.Current() {
		t.Fatalf("resumed on %+v, want %+v", q.Current(), p.Current())
	}
	// relapse within restore_after of the persisted restore: doubled wait,
	// backoff continues (8 × 5s), and a fifth failure gives up.
	q.OnStart(t0.Add(36 * m1))
	d := q.OnFailure(t0.Add(40*m1), cause.Verdict{Cause: cause.CauseOOM})
	if d.Delay != 8*s5 || !strings.Contains(d.Reason, "next restore waits 1h0m0s") || d.Rung != *r(3, 32, 0.75) {
		t.Fatalf("after resume: %+v", d)
	}
	if d := q.OnFailure(t0.Add(41*m1), cause.Verdict{Cause: cause.CauseCrash}); d.Action != ActionGiveUp || d.ExitCode != 1 {
		t.Fatalf("fifth failure in the window: %+v", d)
	}
}

func TestStateCompatAndClamp(t *testing.T) {
	var st State
	if err := json.Unmarshal([]byte(`{"rung": 2}`), &st); err != nil {
		t.Fatal(err)
	}
	if got := New(testConfig(), st, nil).Current(); got != *r(2, 64, 0.75) {
		t.Errorf("old state.json {rung:2}: %+v", got)
	}
	if got := New(testConfig(), State{Rung: 99, UtilStepsBack: -3}, nil).Current(); got != *r(4, 16, 0.70) {
		t.Errorf("rung past the ladder: %+v, want the floor", got)
	}
	if got := New(testConfig(), State{Rung: -1}, nil).Current(); got != *r(0, 256, 0.85) {
		t.Errorf("negative rung: %+v", got)
	}
	p := New(testConfig(), State{}, nil)
	rs := p.Rungs()
	rs[0].MaxNumSeqs = 1
	if p.Rungs()[0].MaxNumSeqs != 256 {
		t.Error("Rungs exposes the policy's ladder")
	}
}

// TestBackoffFakeTime drives the decisions the way the supervisor does,
// sleeping each delay, in synctest's fake time: the jittered delays stay in
// bounds, grow, cap at max_delay, and start over after reset_after ready.
func TestBackoffFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultConfig() // jitter 0.2
		cfg.Restart.GiveUpAfter = 0
		p := New(cfg, State{}, clockFunc(time.Now))
		interval := cfg.Restart.InitialDelay
		for i := 0; i < 12; i++ {
			p.OnStart(time.Now())
			d := p.OnFailure(time.Now(), cause.Verdict{Cause: cause.CauseCrash})
			lo, hi := time.Duration(float64(interval)*0.8), time.Duration(float64(interval)*1.2)+1
			if d.Delay < lo || d.Delay > hi {
				t.Fatalf("failure %d: delay %s outside [%s, %s]", i, d.Delay, lo, hi)
			}
			time.Sleep(d.Delay)
			interval = min(interval*2, cfg.Restart.MaxDelay)
		}
		p.OnStart(time.Now())
		p.OnReady(time.Now())
		time.Sleep(cfg.Restart.ResetAfter)
		d := p.OnFailure(time.Now(), cause.Verdict{Cause: cause.CauseCrash})
		if d.Delay > 6*time.Second {
			t.Fatalf("after a long ready stretch: delay %s, want about initial_delay", d.Delay)
		}
	})
}

type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// With --kv-cache-memory-bytes the ladder steps the bytes by the ratio the
// utilization step gives, floored to a MiB; an OOM moves them down.
func TestKVBytesStepWithTheLadder(t *testing.T) {
	cfg := defaultConfig()
	cfg.Profile.GPUMemoryUtilization, cfg.Profile.GPUMemoryUtilizationStep, cfg.Profile.MinGPUMemoryUtilization = 0.9, 0.1, 0.7
	base := uint64(20 << 30)
	rungs := LadderKV(cfg.Profile, base)
	want := []uint64{base, KVBytesFor(base, 0.9, 0.8), KVBytesFor(base, 0.9, 0.7)}
	for i, w := range want {
		if i >= len(rungs) || rungs[i].KVCacheMemoryBytes != w {
			t.Fatalf("rung %d: %+v, want %d bytes", i, rungs, w)
		}
	}
	if got := KVBytesFor(base, 0.9, 0.8); got != 18204<<20 { // 20 GiB × 0.8/0.9 = 18204.4 MiB, floored
		t.Fatalf("KVBytesFor = %d", got)
	}
	p := New(cfg, State{}, nil)
	p.SetKVCacheBytes(base)
	if r := p.Current(); r.KVCacheMemoryBytes != base {
		t.Fatalf("rung 0: %+v", r)
	}
	d := p.OnFailure(time.Now(), cause.Verdict{Cause: cause.CauseOOM})
	if d.Rung.KVCacheMemoryBytes != want[1] || !strings.Contains(d.Reason, "kv_cache_memory_bytes") {
		t.Fatalf("after an OOM: %+v", d)
	}
	if KVBytesFor(0, 0.9, 0.8) != 0 {
		t.Fatal("no bytes without a base")
	}
}

// The longest time to ready survives a restart of the guard (state.json):
// the proxy's hold limit is learned from it (issue 30).
func TestLongestTimeToReadyPersists(t *testing.T) {
	cfg := testConfig()
	p := New(cfg, State{}, fixedClock{t0})
	p.NoteTimeToReady(3 * time.Minute)
	p.NoteTimeToReady(time.Minute) // a faster start does not lower it
	raw, err := json.Marshal(p.State())
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if got := New(cfg, st, fixedClock{t0}).LongestTimeToReady(); got != 3*time.Minute {
		t.Fatalf("after a restart of the guard: %s (state %s), want 3m0s", got, raw)
	}
}

// A group's follower takes the leader's ladder rung as it is, clamped to
// its ladder, and keeps its own history (it does not decide).
func TestFollowTakesTheLeadersRung(t *testing.T) {
	p := New(testConfig(), State{}, nil)
	last := len(p.Rungs()) - 1
	for _, c := range []struct{ in, want int }{{1, 1}, {0, 0}, {last + 5, last}, {-1, 0}} {
		if r := p.Follow(c.in); r.Index != c.want || r != p.Rungs()[c.want] {
			t.Errorf("Follow(%d) = %+v, want rung %+v", c.in, r, p.Rungs()[c.want])
		}
	}
	if st := p.State(); len(st.Failures) != 0 || st.Attempts != 0 {
		t.Errorf("following counted failures: %+v", st)
	}
}

// A group's leader, told the cause a member's guard gave the end that
// ended the epoch (counted once already, as cause group), reacts as to its
// own vLLM's: an OOM steps down one rung, a configuration error gives up,
// anything else changes nothing. The counted failure takes the member's
// cause.
func TestAfterAMembersEnd(t *testing.T) {
	group := cause.Verdict{Cause: cause.CauseGroup}
	p := New(testConfig(), State{}, fixedClock{t0})
	if d := p.OnFailure(t0, group); d.Rung.Index != 0 {
		t.Fatalf("the group's end: %+v, want the same rung", d)
	}
	if d := p.AfterMember(1, cause.Verdict{Cause: cause.CauseCrash}); d.Action != ActionRestart || d.Rung.Index != 0 || d.Reason != "" {
		t.Fatalf("a member's crash: %+v, want nothing changed", d)
	}
	d := p.AfterMember(2, cause.Verdict{Cause: cause.CauseOOM})
	if d.Action != ActionRestart || d.Rung.Index != 1 || p.Current().Index != 1 || !strings.Contains(d.Reason, "member 2's vLLM ended: GPU out of memory: rung 0→1") {
		t.Fatalf("a member's OOM: %+v, want rung 1", d)
	}
	if st := p.State(); len(st.Failures) != 1 || st.Failures[0].Cause != cause.CauseOOM {
		t.Fatalf("the failures: %+v, want the one group end, now named an OOM", st.Failures)
	}
	// Told twice: the first answer stands.
	if d := p.AfterMember(1, cause.Verdict{Cause: cause.CauseOOM}); d.Reason != "" || p.Current().Index != 1 {
		t.Fatalf("the same end told again: %+v, rung %d, want nothing changed", d, p.Current().Index)
	}
	// The leader's own OOM: its ladder reacted already.
	p.OnFailure(t0, cause.Verdict{Cause: cause.CauseOOM})
	if d := p.AfterMember(1, cause.Verdict{Cause: cause.CauseOOM}); d.Reason != "" || p.Current().Index != 2 {
		t.Fatalf("a member's OOM after the leader's own: %+v, rung %d, want 2 (one step)", d, p.Current().Index)
	}
	p.OnFailure(t0, group)
	d = p.AfterMember(1, cause.Verdict{Cause: cause.CauseConfigError, Summary: "unrecognized arguments: --bogus"})
	if d.Action != ActionGiveUp || d.ExitCode != 78 || !strings.Contains(d.Reason, "member 1's host") {
		t.Fatalf("a member's configuration error: %+v, want give up with 78", d)
	}
}
