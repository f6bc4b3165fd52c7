package supervisor

// The decisions live in package heart (the step, its state, its table);
// these names keep the executor's and the tests' code short.

import "github.com/vllm-guard/vllm-guard/internal/supervisor/heart"

type (
	core           = heart.Core
	ports          = heart.Ports
	facts          = heart.Facts
	effect         = heart.Effect
	fxEnter        = heart.FxEnter
	fxStatus       = heart.FxStatus
	fxPublish      = heart.FxPublish
	fxLog          = heart.FxLog
	fxArm          = heart.FxArm
	fxDisarm       = heart.FxDisarm
	fxReadFree     = heart.FxReadFree
	fxReadRelease  = heart.FxReadRelease
	fxCheckPort    = heart.FxCheckPort
	fxLaunch       = heart.FxLaunch
	fxStop         = heart.FxStop
	fxKill         = heart.FxKill
	fxKillHolders  = heart.FxKillHolders
	fxProbe        = heart.FxProbe
	fxEndProbing   = heart.FxEndProbing
	fxFinishRun    = heart.FxFinishRun
	fxRefresh      = heart.FxRefresh
	fxReadIO       = heart.FxReadIO
	fxReady        = heart.FxReady
	fxPolicyStart  = heart.FxPolicyStart
	fxClassify     = heart.FxClassify
	fxDecide       = heart.FxDecide
	fxRestore      = heart.FxRestore
	fxAskRestore   = heart.FxAskRestore
	fxObserveCost  = heart.FxObserveCost
	fxApplyConfig  = heart.FxApplyConfig
	fxReload       = heart.FxReload
	fxAskRung      = heart.FxAskRung
	fxReply        = heart.FxReply
	fxResetProfile = heart.FxResetProfile
	fxSavePolicy   = heart.FxSavePolicy
	fxGroupGone    = heart.FxGroupGone
	logger         = heart.Logger
	cleanup        = heart.Cleanup
	progress       = heart.Progress
	timerKind      = heart.TimerKind
	evKind         = heart.EvKind
	pumpFacts      = heart.PumpFacts
	event          = heart.Event
	launched       = heart.Launched
	gpuRead        = heart.GPURead
	ending         = heart.Ending
	run            = heart.Run
	subState       = heart.SubState
	cell           = heart.Cell
	request        = heart.Request
	Holder         = heart.Holder
)

const (
	probeReady        = heart.ProbeReady
	probeHealth       = heart.ProbeHealth
	probePaused       = heart.ProbePaused
	fastRetryEvery    = heart.FastRetryEvery
	fastRetryFor      = heart.FastRetryFor
	refusedProbeLimit = heart.RefusedProbeLimit
	tPoll             = heart.TPoll
	tLive             = heart.TLive
	tCost             = heart.TCost
	tDying            = heart.TDying
	tExiting          = heart.TExiting
	tStopKill         = heart.TStopKill
	tRelease          = heart.TRelease
	tBackoff          = heart.TBackoff
	tFreeMemory       = heart.TFreeMemory
	tFastRetry        = heart.TFastRetry
	tDrain            = heart.TDrain
	tPortRetry        = heart.TPortRetry
	timerKinds        = heart.TimerKinds
	evBegin           = heart.EvBegin
	evAPIGone         = heart.EvAPIGone
	evTreeGone        = heart.EvTreeGone
	evStartupComplete = heart.EvStartupComplete
	evProgress        = heart.EvProgress
	evProbe           = heart.EvProbe
	evCleaned         = heart.EvCleaned
	evGPURead         = heart.EvGPURead
	evPortRead        = heart.EvPortRead
	evStop            = heart.EvStop
	evKill            = heart.EvKill
	evRestart         = heart.EvRestart
	evHeartbeat       = heart.EvHeartbeat
	evIORead          = heart.EvIORead
	evOOMRead         = heart.EvOOMRead
	evLaunched        = heart.EvLaunched
	evClassified      = heart.EvClassified
	evDecided         = heart.EvDecided
	evRestored        = heart.EvRestored
	evRestoreDue      = heart.EvRestoreDue
	evRung            = heart.EvRung
	evKilledHolders   = heart.EvKilledHolders
	evTimer           = heart.EvTimer
	evKinds           = heart.EvKinds
	evRequest         = heart.EvRequest
	portRetryFirst    = heart.PortRetryFirst
	subIdle           = heart.SubIdle
	subCheckGPU       = heart.SubCheckGPU
	subWaitGPU        = heart.SubWaitGPU
	subCheckPort      = heart.SubCheckPort
	subWaitPort       = heart.SubWaitPort
	subWaitGroup      = heart.SubWaitGroup
	subStarting       = heart.SubStarting
	subReady          = heart.SubReady
	subEngineDead     = heart.SubEngineDead
	subServerExiting  = heart.SubServerExiting
	subAskingPaused   = heart.SubAskingPaused
	subDraining       = heart.SubDraining
	subStopTerm       = heart.SubStopTerm
	subStopKill       = heart.SubStopKill
	subCleaning       = heart.SubCleaning
	subReleasing      = heart.SubReleasing
	subBackoff        = heart.SubBackoff
	subFailed         = heart.SubFailed
	subGaveUp         = heart.SubGaveUp
	subStopped        = heart.SubStopped
	subStates         = heart.SubStates
)

var (
	subStateNames   = heart.SubStateNames
	publicState     = heart.PublicState
	decisionTimer   = heart.DecisionTimer
	table           = heart.Table
	step            = heart.Step
	judgeHang       = heart.JudgeHang
	engineDeadGrace = heart.EngineDeadGrace
	bindHost        = heart.BindHost
)
