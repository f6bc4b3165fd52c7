// Package cause says what killed vLLM: one cause with its evidence, from
// the output lines and the exit facts (Classify, the live guard's answer),
// or from a saved log (Diagnose, `vllm-guard diagnose`). It is the
// classifier alone: what the guard does about a cause is the restart
// policy's (internal/policy), which imports this package and never the
// other way. It never sleeps, execs or reads the clock.
package cause

import (
	"fmt"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

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
	// CauseGroup: a vLLM across hosts ([group]) whose run here the guard
	// ended because the group's epoch ended: another host's vLLM died or
	// hung, or its guard was not heard or started again. The cause is
	// that host's; this one only says which member and the word it said.
	CauseGroup Cause = "group"
)

// CauseUnknown is an answer of diagnose (offline) only: the log shows signs
// of trouble (a stall warning, a shutdown that never finished) that its text
// cannot turn into one cause, and says so with the evidence it saw instead
// of guessing. The live guard never gives it: any exit it did not ask for is
// a failure with a cause (crash when nothing better is known).
const CauseUnknown Cause = "unknown"

// Causes lists every cause, in docs/how-it-decides.md's order (metrics pre-create one series each).
var Causes = []Cause{CauseOOM, CauseKVInsufficient, CauseGPUBusy, CauseConfigError, CauseHang, CauseCrash, CauseHostOOM, CauseGPUFault, CauseGroup}

// GroupEnd is the end of a group's epoch that ended this host's run, in
// this guard's own words: the member and the word it said, never a
// peer's text.
type GroupEnd struct {
	Epoch uint64 `json:"epoch"`
	// Rank is the member whose word or silence ended the epoch (0: the
	// leader).
	Rank int `json:"rank"`
	// Said is its word: "ended", "hung", "stopping" (a follower's), "end",
	// "gave_up" (the leader's); "" when it said nothing (not heard,
	// started again).
	Said string `json:"said,omitempty"`
	// Why is this guard's sentence ("member 1's guard says its vLLM ended").
	Why string `json:"why"`
}

// Line is one line of vLLM output as the guard saw it; N counts from 1.
type Line struct {
	N      int    `json:"n"`
	Stream string `json:"stream,omitempty"` // "stdout" | "stderr" | "" (offline log)
	Text   string `json:"text"`             // ANSI already stripped
	// Start is what came before the line in its stream (the guard's log
	// pump knows; a saved log does not): after "\r\n" vLLM's formatter
	// continues one record, after a lone "\r" nothing vLLM printed
	// starts. The live classifier's provenance reads it (issue 41).
	Start vllmlog.LineStart `json:"-"`
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
	// Group is set when the guard killed the run because the group's
	// epoch ended ([group]); it decides the cause unless the log names a
	// memory cause of this host's.
	Group *GroupEnd
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
	// Group: for group, the end of the group's epoch that ended this run.
	Group *GroupEnd `json:"group,omitempty"`
	// guardStart: the guard's own start of vLLM failed (Exit.GuardFailure);
	// the decision says so instead of "vLLM died".
	guardStart bool
	// bindFailed: a config_error read from vLLM's own bind refusal
	// ("[Errno 98] … address already in use").
	bindFailed bool
}

// GuardStart says the guard's own start of vLLM failed (Exit.GuardFailure),
// not vLLM: the restart policy says so instead of "vLLM died".
func (v Verdict) GuardStart() bool { return v.guardStart }

// BindFailed says a configuration error was vLLM failing to bind its port
// (another process held it then): at a restart that is a port to wait for,
// not a configuration to fix.
func (v Verdict) BindFailed() bool { return v.bindFailed }

// Words names the evidence of a verdict in one short phrase, for a
// decision's reason.
func (v Verdict) Words() string {
	if len(v.Evidence) > 0 {
		n, msg := quote(v.Evidence)
		return fmt.Sprintf("line %d: %s", n, clip(msg, 160))
	}
	if v.Summary != "" {
		return clip(v.Summary, 160)
	}
	return "vLLM rejected its configuration"
}
