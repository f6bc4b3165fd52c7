package policy

import "time"

// Config is the share of the operator's settings the policy decides with:
// the ladder ([profile]), the backoff and the give-up ([restart]), and the
// GPU memory thresholds ([gpu]) a restore must stay under. The config
// package builds it (config.Config.Policy); the policy never reads the
// configuration file, so it stays a set of pure decisions over plain values.
type Config struct {
	Profile    Profile
	Restart    Restart
	Thresholds Thresholds
}

// Profile is [profile]: rung 0 and how the ladder steps down from it.
type Profile struct {
	MaxNumSeqs               int
	GPUMemoryUtilization     float64
	MaxNumSeqsFactor         float64
	MinMaxNumSeqs            int
	GPUMemoryUtilizationStep float64
	MinGPUMemoryUtilization  float64
	RestoreAfter             time.Duration // 0: never step back up
	Headroom                 float64
}

// Restart is [restart]: the backoff between starts and when to give up.
type Restart struct {
	InitialDelay time.Duration
	MaxDelay     time.Duration
	Multiplier   float64
	Jitter       float64
	ResetAfter   time.Duration // ready this long: the backoff starts over
	GiveUpAfter  int           // failures within GiveUpWindow; 0: never give up
	GiveUpWindow time.Duration
}

// Thresholds is [gpu]'s memory alert thresholds: fixed fractions of the
// device's total, or (when those are 0) fractions over vLLM's budget.
type Thresholds struct {
	WarnFraction       float64
	CriticalFraction   float64
	WarnOverBudget     float64
	CriticalOverBudget float64
}

// maxThreshold caps a budget-relative threshold: a budget near the whole
// device must still leave an alert that can fire.
const maxThreshold = 0.995

// At are the used/total fractions that raise gpu_memory_warn and
// gpu_memory_critical for a vLLM whose budget is budget (a fraction of
// total): the fixed warn_fraction/critical_fraction when set, else the
// budget plus warn_over_budget/critical_over_budget, at most 0.995.
func (t Thresholds) At(budget float64) (warn, critical float64) {
	critical = t.CriticalFraction
	if critical <= 0 {
		critical = min(budget+t.CriticalOverBudget, maxThreshold)
	}
	warn = t.WarnFraction
	if warn <= 0 {
		warn = min(budget+t.WarnOverBudget, maxThreshold)
	}
	return min(warn, critical), critical
}
