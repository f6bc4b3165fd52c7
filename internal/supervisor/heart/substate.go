package heart

// The machine's sub-states, in the spirit of systemd's service sub-states
// (STOP_SIGTERM, STOP_SIGKILL, AUTO_RESTART): each names what the machine
// waits for. The public State an operator sees is read from one table of
// them (publicState); nothing else sets it.
type SubState int

const (
	SubIdle          SubState = iota // not started yet
	SubCheckGPU                      // reading NVML before a start: health, then free memory
	SubWaitGPU                       // no room on the GPU, or a GPU needs a reset: read again every sample
	SubCheckPort                     // trying vLLM's bind of its port, off the loop, before the launch
	SubWaitPort                      // another process holds vLLM's port: try again with backoff
	SubWaitGroup                     // [group]: the old tree is gone; the group's go is waited for before the launch
	SubStarting                      // vLLM launched, loading; readiness probed
	SubReady                         // vLLM answered the readiness probe; liveness, stuck and restore watched
	SubEngineDead                    // ready, but /health said the engine is dead: vLLM's own exit is waited for, for a grace
	SubServerExiting                 // ready, but the API server finished (its port closed): its process's exit is waited for, up to stop_timeout
	SubAskingPaused                  // ready, but stuck by the counters: vLLM's /is_paused is asked before the verdict
	SubDraining                      // a planned stop waits for the proxy's requests in flight before SIGTERM
	SubStopTerm                      // SIGTERM sent (or the API server gone): SIGKILL when the stop timeout fires
	SubStopKill                      // the tree was killed (a hang, the stop timeout, a second signal): waiting for it to go
	SubCleaning                      // the keeper is gone; what outlived it is being killed off the loop
	SubReleasing                     // after a failure: waiting for the old tree's GPU memory
	SubBackoff                       // waiting the decided delay before the next start
	SubFailed                        // gave up, staying to answer status until asked to stop
	SubGaveUp                        // gave up: Run returns with the decision's exit code
	SubStopped                       // stopped on request: Run returns
	SubStates
)

var SubStateNames = [SubStates]string{
	SubIdle: "idle", SubCheckGPU: "check_gpu", SubWaitGPU: "wait_gpu", SubCheckPort: "check_port", SubWaitPort: "wait_port", SubWaitGroup: "wait_group", SubStarting: "starting", SubReady: "ready",
	SubEngineDead: "engine_dead", SubServerExiting: "server_exiting", SubAskingPaused: "asking_paused",
	SubDraining: "draining", SubStopTerm: "stop_sigterm", SubStopKill: "stop_sigkill", SubCleaning: "cleaning",
	SubReleasing: "releasing", SubBackoff: "backoff", SubFailed: "failed", SubGaveUp: "gave_up", SubStopped: "stopped",
}

func (s SubState) String() string { return SubStateNames[s] }

// PublicState is the State each sub-state shows: the one place the public
// state comes from.
var PublicState = [SubStates]State{
	SubIdle:          StateStarting,
	SubCheckGPU:      StateStarting,
	SubWaitGPU:       StateWaitingGPU,
	SubCheckPort:     StateStarting,
	SubWaitPort:      StateBackoff,
	SubWaitGroup:     StateStarting,
	SubStarting:      StateStarting,
	SubReady:         StateReady,
	SubEngineDead:    StateReady,
	SubServerExiting: StateReady,
	SubAskingPaused:  StateReady,
	SubDraining:      StateStopping,
	SubStopTerm:      StateStopping,
	SubStopKill:      StateStopping,
	SubCleaning:      StateStopping,
	SubReleasing:     StateWaitingGPU,
	SubBackoff:       StateBackoff,
	SubFailed:        StateFailed,
	SubGaveUp:        StateFailed,
	SubStopped:       StateStopped,
}

// Running: vLLM was launched and is starting or ready.
func (s SubState) Running() bool { return s == SubStarting || s.Ready() }

// Ready: vLLM answered the readiness probe and its run has not begun to
// end; it may be waiting on a verdict (engine_dead, server_exiting,
// asking_paused).
func (s SubState) Ready() bool {
	return s == SubReady || s == SubEngineDead || s == SubServerExiting || s == SubAskingPaused
}

// Stopping: the run is ending and its tree is not gone yet.
func (s SubState) Stopping() bool { return s == SubDraining || s == SubStopTerm || s == SubStopKill }

// Done: Run returns.
func (s SubState) Done() bool { return s == SubGaveUp || s == SubStopped }

// Update changes the public status at the event's time.
func (m *Core) Update(f func(*Status)) { m.Do(FxStatus{m.Now, f}) }

// Enter moves the machine to sub-state to; the public status takes that
// sub-state's State, with reason ("" keeps the reason shown) and what more
// sets (nil: nothing).
func (m *Core) Enter(to SubState, reason string, more func(*Status)) {
	if m.Sub != to {
		m.Do(FxEnter{m.Sub, to})
	}
	m.Sub = to
	m.Update(func(st *Status) {
		st.State = PublicState[to]
		if st.State != StateStarting {
			st.Progress, st.Expected = nil, nil // a load's, shown only while starting
		}
		if reason != "" {
			st.Reason = reason
		}
		if more != nil {
			more(st)
		}
	})
}
