package supervisor

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The decisions' side of the machine: core is its state, and each cell
// of the table turns (core, event) into a new core plus effects, values
// the executor (machine_exec.go) turns into calls. What the decisions read
// of the world comes in the event (its time, the log pump's facts, the
// readings: facts); what they need answered (a launch, the classifier,
// the restart policy) is an effect whose answer comes back as an event.

// core is the decision state of the machine.
type core struct {
	cfg   *config.Config
	ports ports // which collaborators there are (fixed at New)
	fx    []effect

	sub       subState
	now       time.Time // the time of the event being handled (the loop reads the clock, the decisions read this)
	pump      pumpFacts // the log pump's facts at the event being handled
	facts     facts     // the readings at the event being handled
	stopAsked bool      // the guard is stopping: no new start
	code      int       // the exit code once done
	everReady bool
	pending   *config.Config // a reloaded config for vLLM's next start

	runN int         // the number of the run in progress, or of the last one
	r    run         // the run in progress (or the last one): replaced whole at each launch
	rel  releaseWait // after a failure: the wait for the old tree's GPU memory
	pw   portWait    // before a launch: the check of vLLM's port, and the wait while another process holds it
}

// ports says which of the supervisor's collaborators are there.
type ports struct {
	gpu, health, portHolder, tokens, waiting, load, inFlight bool
	extra                                                    []string // vLLM's extra arguments (after --)
}

// facts are the readings the loop takes as it hands an event over.
type facts struct {
	rung            policy.Rung // the policy's current rung
	state           State       // the public status's state and reason
	reason          string
	treeGone        bool // the run's whole tree is gone
	apiGone         bool // its API server exited
	shutdownTimeout time.Duration
	inFlight        int // requests in flight through the proxy
	// tokens: vLLM's running requests and token counters (ok: known);
	// awaiting, prompt: the proxy's requests with no answer byte yet, the
	// largest prompt among them; load: running and waiting requests.
	running, tokens          float64
	tokensOK                 bool
	awaiting                 int
	prompt                   float64
	loadRunning, loadWaiting float64
	loadOK                   bool
	fraction                 []float64          // the GPU's last used fraction
	used, total              uint64             // the fullest device at the last sample
	sampledAt                time.Time          // when that sample was read
	sampleOK                 bool               // there is one
	gpus                     []policy.GPUDevice // NVML's word on the run as last sampled (heartbeat; nil: none)
	lingering                []lingerer         // what outlived the keeper and is still alive (heartbeat while cleaning)
	dropped                  uint64             // log lines the pump dropped
}

// effect is what a decision asks the executor to do.
type effect interface{ effect() }

type (
	fxEnter  struct{ from, to subState }
	fxStatus struct {
		at  time.Time
		set func(*Status)
	}
	fxPublish struct{ e events.Event }
	fxLog     struct {
		level  zapcore.Level
		msg    string
		fields []zap.Field
	}
	fxArm struct {
		k timerKind
		d time.Duration
	}
	fxDisarm   struct{ k timerKind }
	fxReadFree struct {
		rung  policy.Rung
		since time.Time
	}
	fxReadRelease struct {
		pids []int
		base []uint64
	}
	fxCheckPort struct {
		host string
		port int
	}
	// fxLaunch starts vLLM (heldBy "": else it only says so, the port held
	// by heldBy); answered by evLaunched.
	fxLaunch struct {
		rung   policy.Rung
		argv   []string
		ep     launch.Endpoint
		heldBy string
	}
	fxStop        struct{}
	fxKill        struct{}
	fxKillHolders struct{ held []Holder } // answered by evKilledHolders
	fxProbe       struct {
		kind    probeKind
		level   string
		timeout time.Duration
	}
	fxEndProbing  struct{}
	fxFinishRun   struct{ checkPort bool }
	fxUnwatch     struct{}
	fxRefresh     struct{}
	fxReadIO      struct{}
	fxReady       struct{ ttr time.Duration }
	fxPolicyStart struct{}
	// fxClassify reads one death's evidence into a verdict (the
	// classifier, policy.Classify); answered by evClassified.
	fxClassify   struct{ exit policy.Exit }
	fxDecide     struct{ v policy.Verdict } // the policy's decision after a failure; answered by evDecided
	fxRestore    struct{}                   // one rung up; answered by evRestored
	fxAskRestore struct {
		peak float64
		idle bool
	} // is a restore due? answered by evRestoreDue
	fxObserveCost struct {
		running     float64
		used, total uint64
		describe    bool
	}
	fxDescribeCost struct{}
	fxApplyConfig  struct{ cfg *config.Config } // vLLM starts on a reloaded configuration
	fxReload       struct {
		cfg     *config.Config
		pending bool
	}
	fxAskRung struct{} // answered by evRung
	fxReply   struct {
		ch  chan error
		err error
	}
	fxResetProfile struct{ peer string }
	fxSavePolicy   struct{}
)

func (fxEnter) effect()        {}
func (fxStatus) effect()       {}
func (fxPublish) effect()      {}
func (fxLog) effect()          {}
func (fxArm) effect()          {}
func (fxDisarm) effect()       {}
func (fxReadFree) effect()     {}
func (fxReadRelease) effect()  {}
func (fxCheckPort) effect()    {}
func (fxLaunch) effect()       {}
func (fxStop) effect()         {}
func (fxKill) effect()         {}
func (fxKillHolders) effect()  {}
func (fxProbe) effect()        {}
func (fxEndProbing) effect()   {}
func (fxFinishRun) effect()    {}
func (fxUnwatch) effect()      {}
func (fxRefresh) effect()      {}
func (fxReadIO) effect()       {}
func (fxReady) effect()        {}
func (fxPolicyStart) effect()  {}
func (fxClassify) effect()     {}
func (fxDecide) effect()       {}
func (fxRestore) effect()      {}
func (fxAskRestore) effect()   {}
func (fxObserveCost) effect()  {}
func (fxDescribeCost) effect() {}
func (fxApplyConfig) effect()  {}
func (fxReload) effect()       {}
func (fxAskRung) effect()      {}
func (fxReply) effect()        {}
func (fxResetProfile) effect() {}
func (fxSavePolicy) effect()   {}

// probeKind is which probe an fxProbe sends.
type probeKind int

const (
	probeReady  probeKind = iota // readiness (also the stuck check's 1-token request)
	probeHealth                  // liveness: /health
	probePaused                  // GET /is_paused
)

func (m *core) do(e effect) { m.fx = append(m.fx, e) }

// step is the decisions: one event into the next core and its effects.
func step(m core, e event) (core, []effect) {
	m.fx = nil
	m.handle(e)
	return m, m.fx
}

// logger records log lines as effects.
type logger struct{ m *core }

func (m *core) log() logger { return logger{m} }

func (l logger) Info(msg string, f ...zap.Field)  { l.m.do(fxLog{zapcore.InfoLevel, msg, f}) }
func (l logger) Warn(msg string, f ...zap.Field)  { l.m.do(fxLog{zapcore.WarnLevel, msg, f}) }
func (l logger) Error(msg string, f ...zap.Field) { l.m.do(fxLog{zapcore.ErrorLevel, msg, f}) }

func (m *core) publish(e events.Event)           { m.do(fxPublish{e}) }
func (m *core) arm(k timerKind, d time.Duration) { m.do(fxArm{k, d}) }
func (m *core) disarm(k timerKind)               { m.do(fxDisarm{k}) }
func (m *core) savePolicy()                      { m.do(fxSavePolicy{}) }
