package guard

import (
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/alerts"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/incident"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// Issue 41 item 6: a state that cannot be saved (here its folder is gone
// from under the guard, as a full or failed disk) is said in status,
// metrics and the state_not_saved alert, naming the rung a restarted
// guard resumes (the one on disk); the old warning said "rung 0".
func TestStateNotSavedIsSaidBeyondTheLog(t *testing.T) {
	g, _ := newTestGuard(t)
	g.savePolicy(policy.State{Rung: 1})
	if sv := g.Doc().Saved; sv == nil || !sv.OK || sv.SavedRung != 1 {
		t.Fatalf("after a save: %+v", sv)
	}
	if err := os.RemoveAll(g.store.Dir()); err != nil {
		t.Fatal(err)
	}
	g.savePolicy(policy.State{Rung: 2})
	sv := g.Doc().Saved
	if sv == nil || sv.OK || sv.SavedRung != 1 || sv.Error == "" || sv.Since.IsZero() {
		t.Errorf("status after a failed save: %+v; want not saved, rung 1 on disk, why and since", sv)
	}
	var raised *alerts.Event
	for _, e := range g.alert.InForce() {
		if e.Alert == alerts.StateNotSaved {
			raised = &e
		}
	}
	if raised == nil || !strings.Contains(raised.Message, "resumes rung 1") || !strings.Contains(raised.Message, "rung 2 in force") {
		t.Errorf("state_not_saved alert: %+v", raised)
	}
	rec := httptest.NewRecorder()
	g.met.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "vllm_guard_state_saved 0\n") {
		t.Errorf("/metrics lacks vllm_guard_state_saved 0")
	}
	// A second failure is the same episode: one alert.
	g.savePolicy(policy.State{Rung: 3})
	n := 0
	for _, e := range g.alert.InForce() {
		if e.Alert == alerts.StateNotSaved {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d state_not_saved alerts in force after two failed saves, want 1", n)
	}
}

// An incident record that cannot be written (a disk full even after the
// oldest records went) is said the same way, not only in the log.
func TestRecordNotWrittenIsSaidBeyondTheLog(t *testing.T) {
	g, _ := newTestGuard(t)
	g.bus.Publish(events.Event{Kind: events.KindIncident, Reason: incident.NotWritten + "write: no space left on device"})
	if sv := g.Doc().Saved; sv == nil || sv.OK || !strings.Contains(sv.Error, "an incident record could not be written") {
		t.Errorf("status after a record not written: %+v", sv)
	}
	raised := false
	for _, e := range g.alert.InForce() {
		raised = raised || e.Alert == alerts.StateNotSaved
	}
	if !raised {
		t.Error("no state_not_saved alert for a record not written")
	}
}
