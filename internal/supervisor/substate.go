package supervisor

// The machine's sub-states, in the spirit of systemd's service sub-states
// (STOP_SIGTERM, STOP_SIGKILL, AUTO_RESTART): each names what the machine
// waits for. The public State an operator sees is read from one table of
// them (publicState); nothing else sets it.
type subState int

const (
	subIdle          subState = iota // not started yet
	subCheckGPU                      // reading NVML before a start: health, then free memory
	subWaitGPU                       // no room on the GPU, or a GPU needs a reset: read again every sample
	subCheckPort                     // trying vLLM's bind of its port, off the loop, before the launch
	subWaitPort                      // another process holds vLLM's port: try again with backoff
	subStarting                      // vLLM launched, loading; readiness probed
	subReady                         // vLLM answered the readiness probe; liveness, stuck and restore watched
	subEngineDead                    // ready, but /health said the engine is dead: vLLM's own exit is waited for, for a grace
	subServerExiting                 // ready, but the API server finished (its port closed): its process's exit is waited for, up to stop_timeout
	subAskingPaused                  // ready, but stuck by the counters: vLLM's /is_paused is asked before the verdict
	subDraining                      // a planned stop waits for the proxy's requests in flight before SIGTERM
	subStopTerm                      // SIGTERM sent (or the API server gone): SIGKILL when the stop timeout fires
	subStopKill                      // the tree was killed (a hang, the stop timeout, a second signal): waiting for it to go
	subCleaning                      // the keeper is gone; what outlived it is being killed off the loop
	subReleasing                     // after a failure: waiting for the old tree's GPU memory
	subBackoff                       // waiting the decided delay before the next start
	subFailed                        // gave up, staying to answer status until asked to stop
	subGaveUp                        // gave up: Run returns with the decision's exit code
	subStopped                       // stopped on request: Run returns
	subStates
)

var subStateNames = [subStates]string{
	subIdle: "idle", subCheckGPU: "check_gpu", subWaitGPU: "wait_gpu", subCheckPort: "check_port", subWaitPort: "wait_port", subStarting: "starting", subReady: "ready",
	subEngineDead: "engine_dead", subServerExiting: "server_exiting", subAskingPaused: "asking_paused",
	subDraining: "draining", subStopTerm: "stop_sigterm", subStopKill: "stop_sigkill", subCleaning: "cleaning",
	subReleasing: "releasing", subBackoff: "backoff", subFailed: "failed", subGaveUp: "gave_up", subStopped: "stopped",
}

func (s subState) String() string { return subStateNames[s] }

// publicState is the State each sub-state shows: the one place the public
// state comes from.
var publicState = [subStates]State{
	subIdle:          StateStarting,
	subCheckGPU:      StateStarting,
	subWaitGPU:       StateWaitingGPU,
	subCheckPort:     StateStarting,
	subWaitPort:      StateBackoff,
	subStarting:      StateStarting,
	subReady:         StateReady,
	subEngineDead:    StateReady,
	subServerExiting: StateReady,
	subAskingPaused:  StateReady,
	subDraining:      StateStopping,
	subStopTerm:      StateStopping,
	subStopKill:      StateStopping,
	subCleaning:      StateStopping,
	subReleasing:     StateWaitingGPU,
	subBackoff:       StateBackoff,
	subFailed:        StateFailed,
	subGaveUp:        StateFailed,
	subStopped:       StateStopped,
}

// running: vLLM was launched and is starting or ready.
func (s subState) running() bool { return s == subStarting || s.ready() }

// ready: vLLM answered the readiness probe and its run has not begun to
// end; it may be waiting on a verdict (engine_dead, server_exiting,
// asking_paused).
func (s subState) ready() bool {
	return s == subReady || s == subEngineDead || s == subServerExiting || s == subAskingPaused
}

// stopping: the run is ending and its tree is not gone yet.
func (s subState) stopping() bool { return s == subDraining || s == subStopTerm || s == subStopKill }

// done: Run returns.
func (s subState) done() bool { return s == subGaveUp || s == subStopped }

// update changes the public status at the event's time.
func (m *core) update(f func(*Status)) { m.do(fxStatus{m.now, f}) }

// enter moves the machine to sub-state to; the public status takes that
// sub-state's State, with reason ("" keeps the reason shown) and what more
// sets (nil: nothing).
func (m *core) enter(to subState, reason string, more func(*Status)) {
	if m.sub != to {
		m.do(fxEnter{m.sub, to})
	}
	m.sub = to
	m.update(func(st *Status) {
		st.State = publicState[to]
		if reason != "" {
			st.Reason = reason
		}
		if more != nil {
			more(st)
		}
	})
}
