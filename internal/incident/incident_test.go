package incident

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

type memStore struct {
	mu   sync.Mutex
	err  error
	recs []state.Incident
}

func (s *memStore) AddIncident(inc state.Incident) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return "", s.err
	}
	s.recs = append(s.recs, inc)
	return "/state/incidents/x.json", nil
}

func (s *memStore) UpdateIncident(at time.Time, cause cause.Cause, update func(*state.Incident)) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.recs {
		if s.recs[i].Time.Equal(at) && s.recs[i].Cause == cause {
			update(&s.recs[i])
			return true, nil
		}
	}
	return false, s.err
}

func oomFailure(at time.Time) *events.Failure {
	lines := make([]cause.Line, 0, 300)
	for i := 1; i <= 300; i++ {
		lines = append(lines, cause.Line{N: i, Text: "line"})
	}
	return &events.Failure{Time: at, ExitCode: 1, Phase: cause.PhaseReady, Lines: lines,
		Verdict:  cause.Verdict{Cause: cause.CauseOOM, Confidence: "high", Summary: "GPU out of memory"},
		Decision: policy.Decision{Action: policy.ActionRestart, Rung: policy.Rung{Index: 1}, Delay: 5 * time.Second}}
}

func TestRecorderWritesOneRecordPerFailure(t *testing.T) {
	store := &memStore{}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	snap := gpumon.Snapshot{Devices: []gpumon.Device{{Trend: gpumon.TrendClimbing, History: []float64{0.80, 0.90, 0.99}}}}
	r := New(store, func() gpumon.Snapshot { return snap }, 200, time.Second, zap.NewNop())
	r.Handle(events.Event{Kind: events.KindReady})
	r.Handle(events.Event{Kind: events.KindExited, Failure: oomFailure(at)})
	r.Close()
	if len(store.recs) != 1 {
		t.Fatalf("%d records", len(store.recs))
	}
	inc := store.recs[0]
	if inc.Cause != cause.CauseOOM || len(inc.LastLines) != 200 || inc.RungAfter.Index != 1 || inc.MemoryTrend != "climbing" ||
		len(inc.Memory) != 3 || !inc.Memory[0].T.Equal(at.Add(-2*time.Second)) || inc.Memory[2].Fraction != 0.99 {
		t.Fatalf("record %+v", inc)
	}
	if last := r.Last(); last == nil || last.Cause != cause.CauseOOM {
		t.Fatalf("last %+v", last)
	}
}

func TestAFailedWriteStillShowsTheIncident(t *testing.T) {
	store := &memStore{err: errors.New("no space left on device")}
	r := New(store, func() gpumon.Snapshot { return gpumon.Snapshot{} }, 10, time.Second, zap.NewNop())
	r.Handle(events.Event{Kind: events.KindExited, Failure: oomFailure(time.Now())})
	r.Close()
	if last := r.Last(); last == nil || last.Cause != cause.CauseOOM || len(last.LastLines) != 10 {
		t.Fatalf("last %+v after a failed write", last)
	}
}

// TestAssembleKeepsTheGPUFault: a gpu_fault's record names the GPU, the
// XID and the ECC counts.
func TestAssembleKeepsTheGPUFault(t *testing.T) {
	g := &cause.GPUFault{Device: 0, UUID: "GPU-a", XID: 94, Meaning: cause.XIDMeaning(94), ECCBefore: 1, ECCAfter: 2, Source: "nvml"}
	inc := Assemble(events.Failure{Time: time.Unix(1, 0), Verdict: cause.Verdict{Cause: cause.CauseGPUFault, GPU: g}}, gpumon.Snapshot{}, 10, time.Second)
	b, err := json.Marshal(inc)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"gpu":{"device":0,"uuid":"GPU-a","xid":94`, `"ecc_uncorrected_before":1`, `"ecc_uncorrected_after":2`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("record %s lacks %s", b, want)
		}
	}
}

// A request the proxy refused to send again at a death is named in that
// death's record; an old one is not. The record counts what the proxy held.
func TestRecordNamesTheSuspectRequest(t *testing.T) {
	store := &memStore{}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	r := New(store, func() gpumon.Snapshot { return gpumon.Snapshot{} }, 10, time.Second, zap.NewNop())
	r.SetHeld(func() state.HeldRequests { return state.HeldRequests{Requests: 5, PausedStreams: 2} })
	r.NoteSuspect(state.SuspectRequest{Time: at.Add(-time.Hour), Path: "/v1/old"})
	r.NoteSuspect(state.SuspectRequest{Time: at.Add(-time.Millisecond), Path: "/v1/completions", Client: "10.0.0.7", BodyBytes: 900000, PromptTokens: 225000, Deaths: 2})
	r.Handle(events.Event{Kind: events.KindExited, Failure: oomFailure(at)})
	r.Handle(events.Event{Kind: events.KindExited, Failure: oomFailure(at.Add(time.Second))})
	r.Close()
	if len(store.recs) != 2 || len(store.recs[0].Suspects) != 1 || store.recs[0].Suspects[0].Client != "10.0.0.7" ||
		store.recs[0].Suspects[0].BodyBytes != 900000 || len(store.recs[1].Suspects) != 0 ||
		store.recs[0].Held == nil || *store.recs[0].Held != (state.HeldRequests{Requests: 5, PausedStreams: 2}) {
		t.Fatalf("records %+v; want the first to name the recent suspect only, the second none", store.recs)
	}
}

// The account of what became of a death's requests comes after the
// record: the recorder tells the proxy of the death as it records it, and
// the account handed back under the death's number lands in that record on
// disk (and in status's last incident); an earlier death's account handed
// over at the next death lands in its own record.
func TestRecorderPutsTheDeathsRequestsInItsRecord(t *testing.T) {
	store, _, err := state.Open(t.TempDir(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	r := New(store, func() gpumon.Snapshot { return gpumon.Snapshot{} }, 10, time.Second, zap.NewNop())
	var deaths uint64
	var early *state.DeathRequests
	r.SetDeaths(func() uint64 {
		deaths++
		if deaths == 2 {
			// The proxy hands over the first death's account, one request
			// still going, as it counts the second.
			r.NoteRequests(1, *early)
		}
		return deaths
	})
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	early = &state.DeathRequests{RequestOutcomes: state.RequestOutcomes{Touched: 2, Replayed: 1, Pending: 1},
		NonStreaming: &state.RequestOutcomes{Touched: 2, Replayed: 1, Pending: 1}, UnfinishedAt: "next_death"}
	r.Handle(events.Event{Kind: events.KindExited, Failure: oomFailure(at)})
	r.Handle(events.Event{Kind: events.KindExited, Failure: oomFailure(at.Add(time.Minute))})
	second := state.DeathRequests{RequestOutcomes: state.RequestOutcomes{Touched: 1, Continued: 1},
		Streams: &state.RequestOutcomes{Touched: 1, Continued: 1}}
	r.NoteRequests(2, second)
	r.NoteRequests(7, second) // no such death: nothing
	if last := r.Last(); last == nil || last.Requests == nil || last.Requests.Continued != 1 {
		t.Errorf("status's last incident lacks its requests: %+v", last)
	}
	r.Close()
	incs, err := store.Incidents(0)
	if err != nil || len(incs) != 2 {
		t.Fatalf("records %+v %v", incs, err)
	}
	if got := incs[1].Requests; got == nil || got.Pending != 1 || got.UnfinishedAt != "next_death" || got.NonStreaming.Replayed != 1 {
		t.Errorf("first death's record: requests %+v", got)
	}
	if got := incs[0].Requests; got == nil || got.Continued != 1 || got.Streams.Touched != 1 || got.Pending != 0 {
		t.Errorf("second death's record: requests %+v", got)
	}
}
