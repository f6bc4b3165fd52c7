package guard

import (
	"context"
	"fmt"
	"github.com/vllm-guard/vllm-guard/internal/buildinfo"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// The guard answers the control socket and the HTTP endpoints.
var _ control.Backend = (*Guard)(nil)

// Doc builds the status document from the parts' snapshots.
func (g *Guard) Doc() control.Doc {
	st := g.pair.Status()
	gpu := g.gpu.Snapshot()
	d := control.Doc{Version: buildinfo.Get().Version, Now: time.Now(), Guard: st, GPU: gpu, VLLM: g.stats.Latest(),
		Alerts: control.AlertsInForce(g.alert.InForce())}
	d.LastIncident = g.inc.Last()
	d.Saved = g.savedDoc()
	d.Weights = g.wc.status()
	d.Standby = g.pair.standbyDoc()
	d.Group = g.member.doc(d.Now)
	if g.proxy != nil {
		st := g.proxy.Stats()
		d.Proxy = &st
	}
	return d
}

func (g *Guard) Restart(ctx context.Context, peer string) error { return g.pair.Restart(ctx, peer) }

func (g *Guard) ResetProfile(ctx context.Context, peer string) error {
	return g.pair.ResetProfile(ctx, peer)
}

func (g *Guard) Incidents(n int, each func(state.Incident) error) error {
	return g.store.EachIncident(n, each)
}

// wedgedAfter is how long the supervisor's loop may go without turning
// before /livez calls the guard wedged (it turns at least every second).
const wedgedAfter = 30 * time.Second

func (g *Guard) Alive() (bool, string) {
	if st := g.pair.Status(); st.State == status.StateFailed {
		return false, "gave up: " + st.Reason
	}
	if since := time.Since(g.pair.LastTurn()); since > wedgedAfter {
		return false, fmt.Sprintf("the supervisor's loop has not turned for %s", since.Round(time.Second))
	}
	return true, ""
}
