package heart

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/config"
)

// What the decisions read of the executor's answers: a probe's, a
// process's end, what does not die, who holds GPU memory, an operator's
// request.

func (r ProbeResult) Refusal() bool {
	return r.Status >= 400 && r.Status <= 499 && r.Status != 408 && r.Status != 429 // (Request Timeout, Too Many Requests: they heal)
}

type ProbeResult struct {
	OK      bool
	Status  int    // HTTP status; 0 when no answer
	Step    string // health | models | completion | embeddings | classify | pooling
	Err     string // why not ok
	Refused bool   // connection refused: vLLM is still loading (or gone)
	// Explains: err is worth the status reason (a missing API key, a served
	// name /v1/models does not list): the operator must act.
	Explains bool
	Probe    string // ok: the request that answered, e.g. "auto: POST /v1/embeddings (task embed)"
	Paused   bool   // step "paused": vLLM said {"is_paused": true}
	// Own: the answer came over connections to a listener of vLLM's own
	// tree (vllmOnly checked each one).
	Own bool
}

// ExitInfo is how vLLM's API server ended (the keeper's report).
type ExitInfo struct {
	Code         int    // -1 when killed by a signal
	Signal       string // "" when it exited
	StartFailure string // the command could not be started because of itself: vLLM's configuration
	GuardFailure string // the guard could not start vLLM because of an error of its own
}

func (e ExitInfo) String() string {
	switch {
	case e.GuardFailure != "":
		return "the guard could not start vLLM: " + e.GuardFailure
	case e.StartFailure != "":
		return "could not start: " + e.StartFailure
	case e.Signal != "":
		return "killed by " + e.Signal
	default:
		return "exit code " + strconv.Itoa(e.Code)
	}
}

// Holder is a process holding GPU memory.
type Holder struct {
	PID     int
	Bytes   uint64
	Command string
}

func HoldersText(hs []Holder) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		c := h.Command
		if c == "" {
			c = "?"
		}
		parts = append(parts, fmt.Sprintf("pid %d (%s) %.1f GiB", h.PID, c, float64(h.Bytes)/(1<<30)))
	}
	return strings.Join(parts, ", ")
}

type Request struct {
	Kind  string // "restart" | "reset_profile" | "reload"
	Peer  string
	Why   string         // a restart the guard asks for itself: why ("": an operator's)
	Cfg   *config.Config // reload: the new configuration
	Reply chan error
}

// Lingerer is a process that outlived the keeper and is not dead yet.
type Lingerer struct {
	PID   int
	State byte   // /proc/PID/stat's state: D is uninterruptible sleep (stuck in the kernel)
	WChan string // the kernel function it waits in, when readable
}

// LingeringText says which processes do not die and where they are stuck:
// "pid 1234 does not die: state D in nvidia_…".
func LingeringText(ls []Lingerer) string {
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		t := fmt.Sprintf("pid %d does not die: state %c", l.PID, l.State)
		if l.WChan != "" && l.WChan != "0" {
			t += " in " + l.WChan
		}
		parts = append(parts, t)
	}
	return strings.Join(parts, "; ")
}
