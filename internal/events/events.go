// Package events owns the guard's one typed event stream: what happened to
// vLLM (state changes with their reason, launches with the profile and argv,
// ready with the time it took, exits with cause and evidence, decisions,
// load progress, failed probes) and to the guard's alerts. The supervisor and
// the alert owner publish; logging, metrics, sd_notify, incident records, the
// status document and the test tools consume. Nothing downstream matches log
// text: it reads these events, in process or as JSON lines (`run --events`).
package events

import (
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// Kind names what an Event says; it is the "kind" field of the JSON line.
type Kind string

const (
	KindState       Kind = "state"        // State changed: From → State, with Reason
	KindStarting    Kind = "starting"     // vLLM launched: Rung, Argv, PID
	KindReady       Kind = "ready"        // vLLM answered its readiness probe: TimeToReady, First
	KindExited      Kind = "exited"       // vLLM died or was killed: Failure (cause, evidence, decision)
	KindDecision    Kind = "decision"     // a planned action: Decision, Reason (restart, restore, profile reset)
	KindProgress    Kind = "progress"     // load progress while starting: Phase
	KindProbeFailed Kind = "probe_failed" // a readiness or liveness probe failed: Probe
	KindAlert       Kind = "alert"        // an alert was raised or cleared: Alert
	KindStopped     Kind = "stopped"      // the supervisor ended: ExitCode, Reason
	KindIncident    Kind = "incident"     // an incident record was written (Reason: its path) or not ("not written: why")
	KindAdmission   Kind = "admission"    // the proxy's limit changed bound, or its cost model became confident: Admission
	KindFailover    Kind = "failover"     // the proxy's vLLM changed: a warm standby took over, or a swap to the ladder's rung: Failover
)

// Decisions a KindDecision event names.
const (
	DecisionRestart      = "restart"       // an operator asked for a restart
	DecisionRestore      = "restore"       // a stable stretch on a lower rung: one rung up
	DecisionProfileReset = "profile_reset" // back to rung 0 at the next start
	DecisionStop         = "stop"          // the guard was asked to stop
	DecisionKill         = "kill"          // vLLM did not stop in time (or a second stop signal): SIGKILL of its tree
	DecisionReload       = "reload"        // SIGHUP: Reason says applied, pending vLLM's next start, or refused (why)
)

// Event is one thing that happened. Only the fields of its Kind are set.
type Event struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Kind   Kind      `json:"kind"`
	State  string    `json:"state,omitempty"`
	From   string    `json:"from,omitempty"`
	Reason string    `json:"reason,omitempty"`

	Rung *policy.Rung `json:"rung,omitempty"`
	Argv []string     `json:"argv,omitempty"` // secrets masked by the publisher
	PID  int          `json:"pid,omitempty"`

	TimeToReady time.Duration `json:"time_to_ready_ns,omitempty"`
	First       bool          `json:"first,omitempty"` // the first ready of this guard

	Failure  *Failure `json:"failure,omitempty"`
	Decision string   `json:"decision,omitempty"`
	Phase    string   `json:"phase,omitempty"`
	// Progress: the load phase's progress where vLLM reports one (a
	// progress event).
	Progress *LoadProgress `json:"progress,omitempty"`
	Probe    *Probe        `json:"probe,omitempty"`
	Alert    *Alert        `json:"alert,omitempty"`
	ExitCode *int          `json:"exit_code,omitempty"`

	Admission *Admission `json:"admission,omitempty"`

	// VLLM names the vLLM an event is about when the guard keeps a warm
	// standby: "a" (on [vllm] port) or "b" (on [standby] port); Role is
	// its role when the event was published: "serving" (the proxy's) or
	// "standby". Both are empty without a standby.
	VLLM string `json:"vllm,omitempty"`
	Role string `json:"role,omitempty"`
	// Failover is KindFailover's account; on the serving vLLM's exit it
	// says that the standby took over.
	Failover *Failover `json:"failover,omitempty"`
}

// Roles of the two vLLMs of a warm standby.
const (
	RoleServing = "serving"
	RoleStandby = "standby"
)

// Failover is one change of the vLLM the proxy routes to.
type Failover struct {
	From string `json:"from"` // the vLLM that served: "a" or "b"
	To   string `json:"to"`   // the one that serves now
	// Swap: a planned change, not a death: the standby came ready on the
	// ladder's rung while the serving vLLM ran another one.
	Swap bool   `json:"swap,omitempty"`
	Why  string `json:"why"`
	// Left is when the serving vLLM left ready (its death seen); At is
	// the switch. Seconds is At - Left.
	Left    time.Time `json:"left"`
	At      time.Time `json:"at"`
	Seconds float64   `json:"seconds"`
	// FirstTokenSeconds: from Left to the first new token of a stream
	// the death cut, written to its client after the switch (0: none was
	// cut, or none continued yet). Set after the event, in status only.
	FirstTokenSeconds float64 `json:"first_token_seconds,omitempty"`
}

// Admission is the proxy's limit: the bound in force (rung, memory, trend,
// reopening, pressure), the limit, why, and whether the memory cost model
// is confident.
type Admission struct {
	Bound     string `json:"bound"`
	Limit     int    `json:"limit"`
	Why       string `json:"why"`
	Confident bool   `json:"confident"`
}

// Failure is one death of vLLM with its cause and what the guard did about it.
type Failure struct {
	Time         time.Time       `json:"time"`
	PID          int             `json:"pid"`
	Exit         string          `json:"exit"` // "exit code 0", "killed by SIGKILL", ...
	ExitCode     int             `json:"exit_code"`
	Signal       string          `json:"signal,omitempty"`
	Phase        cause.Phase     `json:"phase"`
	Verdict      cause.Verdict   `json:"verdict"`
	Decision     policy.Decision `json:"decision"`
	RungBefore   policy.Rung     `json:"rung_before"`
	Uptime       time.Duration   `json:"uptime_ns"`
	Lines        []cause.Line    `json:"-"` // the kept output, oldest first (incidents)
	MemFractions []float64       `json:"-"` // GPU fraction of the last samples, oldest first
}

// Probe is a failed probe: which step, what it answered.
type Probe struct {
	Step   string `json:"step"` // health | models | completion | ...
	Status int    `json:"status,omitempty"`
	Error  string `json:"error"`
}

// Alert is an alert raised (Active) or cleared.
type Alert struct {
	Name     string `json:"name"`
	Active   bool   `json:"active"`
	Severity string `json:"severity,omitempty"`
	Message  string `json:"message,omitempty"`
	GPU      int    `json:"gpu"`
}
