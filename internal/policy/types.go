// Package policy owns the guard's pure decisions: why vLLM died (cause
// classification), which profile rung to run next, whether to give up, and
// when to step back up. It never sleeps, execs or reads the clock: callers
// pass the time and the facts in.
package policy

import "time"

// Cause is one of the causes docs/how-it-decides.md lists.
type Cause string

const (
	CauseOOM            Cause = "oom"
	CauseKVInsufficient Cause = "kv_insufficient"
	CauseGPUBusy        Cause = "gpu_busy"
	CauseConfigError    Cause = "config_error"
	CauseHang           Cause = "hang"
	CauseCrash          Cause = "crash"
	CauseHostOOM        Cause = "host_oom"
	// CauseGPUFault: the GPU itself failed (an XID, uncorrectable ECC, a
	// GPU fallen off the bus); see gpufault.go.
	CauseGPUFault Cause = "gpu_fault"
)

// CauseUnknown is an answer of diagnose (offline) only: the log shows signs
// of trouble (a stall warning, a shutdown that never finished) that its text
// cannot turn into one cause, and says so with the evidence it saw instead
// of guessing. The live guard never gives it: any exit it did not ask for is
// a failure with a cause (crash when nothing better is known).
const CauseUnknown Cause = "unknown"

// Causes lists every cause, in docs/how-it-decides.md's order (metrics pre-create one series each).
var Causes = []Cause{CauseOOM, CauseKVInsufficient, CauseGPUBusy, CauseConfigError, CauseHang, CauseCrash, CauseHostOOM, CauseGPUFault}

// Rung is one step of the degrade ladder. Rung 0 is [profile] as written.
type Rung struct {
	Index                int     `json:"index"`
	MaxNumSeqs           int     `json:"max_num_seqs"`
	GPUMemoryUtilization float64 `json:"gpu_memory_utilization"`
	// KVCacheMemoryBytes is --kv-cache-memory-bytes for this rung when the
	// operator sizes vLLM's KV cache in bytes (0: vLLM sizes it from the
	// utilization). See KVBytesFor.
	KVCacheMemoryBytes uint64 `json:"kv_cache_memory_bytes,omitempty"`
}

// Line is one line of vLLM output as the guard saw it; N counts from 1.
type Line struct {
	N      int    `json:"n"`
	Stream string `json:"stream,omitempty"` // "stdout" | "stderr" | "" (offline log)
	Text   string `json:"text"`             // ANSI already stripped
}

// Phase is where vLLM was when it died.
type Phase string

const (
	PhaseStarting Phase = "starting" // launched, not yet ready
	PhaseReady    Phase = "ready"
)

// Exit is everything the guard knows about one death of vLLM.
type Exit struct {
	Lines         []Line    // last lines of output, oldest first
	ExitCode      int       // -1 when killed by a signal
	Signal        string    // "SIGKILL" etc.; "" when it exited
	SignalByGuard bool      // the guard sent the fatal signal (stop, hang kill)
	Hang          string    // non-empty when the guard killed it as hung: the reason
	HostOOMKill   bool      // the cgroup's oom_kill counter went up across the run
	Phase         Phase     // phase it died in
	MemFractions  []float64 // GPU used/total of the last samples before death, oldest first (max over devices)
	Critical      float64   // [gpu] critical_fraction
	StartFailure  string    // non-empty when the command could not be started at all (not found, not executable)
	// GuardFailure is non-empty when the guard could not start vLLM because
	// of an error of its own (a pipe or fork failing for want of file
	// descriptors, process slots or memory; its keeper missing): not vLLM's
	// configuration, so it is retried.
	GuardFailure string
	// GPU is the GPU's own word (NVML) on the run, nil when not known; it
	// decides gpu_fault before the log does.
	GPU *GPUEvidence
	// Offline is set for a saved log (vllm-guard diagnose): the exit status is
	// unknown, Phase is read from the log when empty, and a log with no
	// failure in it yields Cause "" instead of crash.
	Offline bool
}

// Verdict is the classifier's answer: one cause with its evidence.
type Verdict struct {
	Cause      Cause    `json:"cause"`
	Confidence string   `json:"confidence"` // "high" | "low"
	Evidence   []Line   `json:"evidence"`   // root-cause lines, not the wrappers
	Summary    string   `json:"summary"`    // one line an operator reads first
	Advice     []string `json:"advice,omitempty"`
	// GPU: for gpu_fault, which GPU, what it said and what it needs.
	GPU *GPUFault `json:"gpu,omitempty"`
	// guardStart: the guard's own start of vLLM failed (Exit.GuardFailure);
	// the decision says so instead of "vLLM died".
	guardStart bool
}

// Action is what the guard does next.
type Action string

const (
	ActionRestart Action = "restart" // after Delay, on Rung
	ActionGiveUp  Action = "give_up" // stop trying; ExitCode says how the guard exits
)

// Decision is the policy's answer after a failure.
type Decision struct {
	Action   Action        `json:"action"`
	Rung     Rung          `json:"rung"`
	Delay    time.Duration `json:"delay"`             // backoff before the next start
	ExitCode int           `json:"exit_code"`         // for ActionGiveUp: 78 config, 1 crash loop
	Reason   string        `json:"reason"`            // operator's words: why this step
	AtFloor  bool          `json:"at_floor,omitzero"` // the ladder's floor is reached
}
