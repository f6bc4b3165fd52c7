// Package control owns how the outside talks to a running guard: the unix
// control socket (status, incidents, restart, profile reset; mode 0660,
// peer credentials logged for every action), the HTTP endpoints (/livez,
// /readyz, /status, /metrics), the status document they serve, its human
// view, the client for the socket, and the `vllm-guard status`,
// `incidents`, `restart` and `profile reset` commands built on them.
//
// control decides nothing about vLLM: a Backend (the supervisor's wiring)
// answers every question and carries out every action.
package control

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/proxy"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
	"github.com/vllm-guard/vllm-guard/internal/weightcache"
)

// Doc is the status document: JSON of GET /status (socket and HTTP) and of
// `vllm-guard status --json`.
type Doc struct {
	Version      string          `json:"version"`
	Now          time.Time       `json:"now"` // when the guard built the document; the human view's clock
	Guard        status.Status   `json:"guard"`
	GPU          gpumon.Snapshot `json:"gpu"`
	VLLM         vllmstats.Stats `json:"vllm"`
	Alerts       []ActiveAlert   `json:"alerts"`
	LastIncident *state.Incident `json:"last_incident,omitempty"`
	Proxy        *proxy.Stats    `json:"proxy,omitempty"` // nil when [proxy] listen is off
	// Saved says whether the guard's state (rung, counters) is on disk as
	// the guard holds it; nil from a guard that does not say.
	Saved *SavedState `json:"saved_state,omitempty"`
	// Weights is the weight cache daemon ([weights]); nil when the guard
	// runs none. Its processes are named in GPU as the guard's own.
	Weights *weightcache.Status `json:"weight_cache,omitempty"`
	// Standby is the warm standby's two vLLMs; nil without one.
	Standby *Standby `json:"standby,omitempty"`
	// Group is this member's view of a vLLM across hosts; nil without.
	Group *Group `json:"group,omitempty"`
	// Note is set on the summary the TCP /status serves (SummaryNote).
	Note string `json:"note,omitempty"`
}

// SavedState is whether the guard's state reaches state_dir. When it does
// not (a full disk, a read-only folder) the state on disk stays in force:
// a restarted guard resumes SavedRung, not the rung in force now.
type SavedState struct {
	OK        bool      `json:"ok"`
	Dir       string    `json:"dir"`
	SavedRung int       `json:"saved_rung"` // the rung on disk: what a restarted guard resumes
	Error     string    `json:"error,omitempty"`
	Since     time.Time `json:"since,omitzero"` // when saving began to fail
}

// ActiveAlert is one alert in force, as package alerts (their one owner)
// keeps it.
type ActiveAlert struct {
	Name    string    `json:"name"` // gpu_memory_warn | gpu_memory_critical | oom_predicted | oom | gave_up
	Since   time.Time `json:"since"`
	Message string    `json:"message"`
}

// Backend is what the control socket and the HTTP endpoints ask. Its
// methods are called from request goroutines, concurrently.
type Backend interface {
	Doc() Doc
	// Restart asks for a restart of vLLM; peer names who asked
	// ("uid=0 pid=1234"). An error is a refusal an operator reads.
	Restart(ctx context.Context, peer string) error
	// ResetProfile returns the profile to rung 0 at the next restart.
	ResetProfile(ctx context.Context, peer string) error
	// Incidents hands up to n records (all when n ≤ 0), newest first, to
	// each, one at a time (a record that cannot be read comes with
	// Unreadable set); an error from each stops it.
	Incidents(n int, each func(state.Incident) error) error
	// Alive says whether the guard's own loop works (/livez); why says
	// what is wrong when it does not.
	Alive() (ok bool, why string)
}

// AlertsInForce is the alerts in force as the status document shows them,
// oldest first (the order alerts.Dispatcher.InForce gives).
func AlertsInForce(in []alerts.Event) []ActiveAlert {
	out := make([]ActiveAlert, 0, len(in))
	for _, e := range in {
		out = append(out, ActiveAlert{Name: e.Alert, Since: e.Time, Message: e.Message})
	}
	return out
}

// maxDoc bounds a status document read from a guard; a real one is tens
// of KiB (GPU histories included).
const maxDoc = 8 << 20

// DecodeDoc reads a status document, as the client and tools that read
// `status --json` do. Unknown fields are ignored so an older client reads
// a newer guard.
func DecodeDoc(r io.Reader) (Doc, error) {
	var d Doc
	lr := &io.LimitedReader{R: r, N: maxDoc + 1}
	if err := json.NewDecoder(lr).Decode(&d); err != nil {
		if lr.N <= 0 {
			return Doc{}, fmt.Errorf("status document larger than %d bytes: not a vllm-guard status", maxDoc)
		}
		return Doc{}, fmt.Errorf("decode the status document: %w", err)
	}
	return d, nil
}
