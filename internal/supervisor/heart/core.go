// Package heart is the supervisor's step machine: its sub-states, its
// table of cells, and Step, which turns (state, event) into a new state
// and effects, values the supervisor's executor turns into calls. What it
// reads of the world comes in the event; what it needs answered (a
// launch, the classifier's verdict, the restart policy's decision) comes
// back as an event. It imports no collaborator package: no process,
// socket, GPU, file or clock (TestTheHeartReachesNothing).
package heart

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The decisions' side of the machine: core is its state, and each cell
// of the table turns (core, event) into a new core plus effects, values
// the executor (package supervisor) turns into calls. What the decisions read
// of the world comes in the event (its time, the log pump's facts, the
// readings: facts); what they need answered (a launch, the classifier,
// the restart policy) is an effect whose answer comes back as an event.

// Core is the decision state of the machine.
type Core struct {
	Cfg   *config.Config
	Ports Ports // which collaborators there are (fixed at New)
	Fx    []Effect

	Sub       SubState
	Now       time.Time // the time of the event being handled (the loop reads the clock, the decisions read this)
	Pump      PumpFacts // the log pump's facts at the event being handled
	Facts     Facts     // the readings at the event being handled
	StopAsked bool      // the guard is stopping: no new start
	Code      int       // the exit code once done
	EverReady bool
	Pending   *config.Config // a reloaded config for vLLM's next start

	RunN int         // the number of the run in progress, or of the last one
	R    Run         // the run in progress (or the last one): replaced whole at each launch
	Rel  ReleaseWait // after a failure: the wait for the old tree's GPU memory
	Pw   PortWait    // before a launch: the check of vLLM's port, and the wait while another process holds it
	Gw   GroupWait   // [group]: before a launch, the group's go
}

// Ports says which of the supervisor's collaborators are there.
type Ports struct {
	GPU, Health, PortHolder, Tokens, Waiting, Load, InFlight bool
	Extra                                                    []string // vLLM's extra arguments (after --)
}

// Facts are the readings the loop takes as it hands an event over.
type Facts struct {
	Rung            policy.Rung // the policy's current rung
	State           State       // the public status's state and reason
	Reason          string
	TreeGone        bool // the run's whole tree is gone
	APIGone         bool // its API server exited
	ShutdownTimeout time.Duration
	InFlight        int // requests in flight through the proxy
	// tokens: vLLM's running requests and token counters (ok: known);
	// awaiting, prompt: the proxy's requests with no answer byte yet, the
	// largest prompt among them; load: running and waiting requests.
	Running, Tokens          float64
	TokensOK                 bool
	Awaiting                 int
	Prompt                   float64
	LoadRunning, LoadWaiting float64
	LoadOK                   bool
	Fraction                 []float64         // the GPU's last used fraction
	Used, Total              uint64            // the fullest device at the last sample
	SampledAt                time.Time         // when that sample was read
	SampleOK                 bool              // there is one
	GPUs                     []cause.GPUDevice // NVML's word on the run as last sampled (heartbeat; nil: none)
	Lingering                []Lingerer        // what outlived the keeper and is still alive (heartbeat while cleaning)
	Dropped                  uint64            // log lines the pump dropped
}

// Effect is what a decision asks the executor to do.
type Effect interface{ Effect() }

type (
	FxEnter  struct{ From, To SubState }
	FxStatus struct {
		At  time.Time
		Set func(*Status)
	}
	FxPublish struct{ E events.Event }
	FxLog     struct {
		Level  zapcore.Level
		Msg    string
		Fields []zap.Field
	}
	FxArm struct {
		K TimerKind
		D time.Duration
	}
	FxDisarm   struct{ K TimerKind }
	FxReadFree struct {
		Rung  policy.Rung
		Since time.Time
	}
	FxReadRelease struct {
		PIDs []int
		Base []uint64
	}
	FxCheckPort struct {
		Host string
		Port int
	}
	// FxLaunch starts vLLM (heldBy "": else it only says so, the port held
	// by heldBy); answered by evLaunched.
	FxLaunch struct {
		Rung   policy.Rung
		Argv   []string
		Ep     launch.Endpoint
		HeldBy string
	}
	FxStop        struct{}
	FxKill        struct{}
	FxKillHolders struct{ Held []Holder } // answered by evKilledHolders
	FxProbe       struct {
		Kind    ProbeKind
		Level   string
		Timeout time.Duration
	}
	FxEndProbing struct{}
	FxFinishRun  struct{ CheckPort bool }
	FxRefresh    struct{}
	FxReadIO     struct{}
	FxReady      struct {
		TTR    time.Duration
		Phases []PhaseTime // how long each load phase took, in order
	}
	FxPolicyStart struct{}
	// FxClassify reads one death's evidence into a verdict (the
	// classifier, cause.Classify); answered by evClassified.
	FxClassify   struct{ Exit cause.Exit }
	FxDecide     struct{ V cause.Verdict } // the policy's decision after a failure; answered by evDecided
	FxRestore    struct{}                  // one rung up; answered by evRestored
	FxAskRestore struct {
		Peak float64
		Idle bool
	} // is a restore due? answered by evRestoreDue
	FxObserveCost struct {
		Running     float64
		Used, Total uint64
		Describe    bool
	}
	FxApplyConfig struct{ Cfg *config.Config } // vLLM starts on a reloaded configuration
	FxReload      struct {
		Cfg     *config.Config
		Pending bool
	}
	FxAskRung struct{} // answered by evRung
	FxReply   struct {
		Ch  chan error
		Err error
	}
	FxResetProfile struct{ Peer string }
	FxSavePolicy   struct{}
	// FxGroupGone tells the group that this host's tree is gone and its
	// vLLM waits for the go ([group]).
	FxGroupGone struct{}
)

func (FxEnter) Effect()        {}
func (FxStatus) Effect()       {}
func (FxPublish) Effect()      {}
func (FxLog) Effect()          {}
func (FxArm) Effect()          {}
func (FxDisarm) Effect()       {}
func (FxReadFree) Effect()     {}
func (FxReadRelease) Effect()  {}
func (FxCheckPort) Effect()    {}
func (FxLaunch) Effect()       {}
func (FxStop) Effect()         {}
func (FxKill) Effect()         {}
func (FxKillHolders) Effect()  {}
func (FxProbe) Effect()        {}
func (FxEndProbing) Effect()   {}
func (FxFinishRun) Effect()    {}
func (FxRefresh) Effect()      {}
func (FxReadIO) Effect()       {}
func (FxReady) Effect()        {}
func (FxPolicyStart) Effect()  {}
func (FxClassify) Effect()     {}
func (FxDecide) Effect()       {}
func (FxRestore) Effect()      {}
func (FxAskRestore) Effect()   {}
func (FxObserveCost) Effect()  {}
func (FxApplyConfig) Effect()  {}
func (FxReload) Effect()       {}
func (FxAskRung) Effect()      {}
func (FxReply) Effect()        {}
func (FxResetProfile) Effect() {}
func (FxSavePolicy) Effect()   {}
func (FxGroupGone) Effect()    {}

// ProbeKind is which probe an fxProbe sends.
type ProbeKind int

const (
	ProbeReady  ProbeKind = iota // readiness (also the stuck check's 1-token request)
	ProbeHealth                  // liveness: /health
	ProbePaused                  // GET /is_paused
)

func (m *Core) Do(e Effect) { m.Fx = append(m.Fx, e) }

// Step is the decisions: one event into the next core and its effects.
func Step(m Core, e Event) (Core, []Effect) {
	m.Fx = nil
	m.Handle(e)
	return m, m.Fx
}

// Logger records log lines as effects.
type Logger struct{ M *Core }

func (m *Core) Log() Logger { return Logger{m} }

func (l Logger) Info(msg string, f ...zap.Field)  { l.M.Do(FxLog{zapcore.InfoLevel, msg, f}) }
func (l Logger) Warn(msg string, f ...zap.Field)  { l.M.Do(FxLog{zapcore.WarnLevel, msg, f}) }
func (l Logger) Error(msg string, f ...zap.Field) { l.M.Do(FxLog{zapcore.ErrorLevel, msg, f}) }

func (m *Core) Publish(e events.Event)           { m.Do(FxPublish{e}) }
func (m *Core) Arm(k TimerKind, d time.Duration) { m.Do(FxArm{k, d}) }
func (m *Core) Disarm(k TimerKind)               { m.Do(FxDisarm{k}) }
func (m *Core) SavePolicy()                      { m.Do(FxSavePolicy{}) }
