package heart

import (
	"slices"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// What a run's load shows while it starts: its phases, with when each
// began (their times go to the record of starts at ready), and the
// current phase's progress where vLLM reports one.

// PhaseMark is a load phase and when its first line came.
type PhaseMark struct {
	Name string
	At   time.Time
}

// PhaseTime is how long a load phase took: from its first line to the
// next phase's, the last one to ready.
type PhaseTime struct {
	Name string
	Took time.Duration
}

// NotePhase keeps the pump's load phase in the run's data when it is new,
// and returns it.
func (m *Core) NotePhase() string {
	ph := m.Pump.Phase
	if n := len(m.R.Phases); ph != "" && (n == 0 || m.R.Phases[n-1].Name != ph) {
		m.R.Phases = append(slices.Clip(m.R.Phases), PhaseMark{Name: ph, At: m.Now}) // Step's core given stays as it was
	}
	return ph
}

// NoteProgress keeps vLLM's last progress bar in the run's data when it
// belongs to the phase ph, and returns what the status shows of it (nil:
// the phase reports none).
func (m *Core) NoteProgress(ph string) *status.LoadProgress {
	p := m.Pump.Progress
	if p.Total <= 0 || p.Phase != ph {
		m.R.Progress = status.LoadProgress{}
		return nil
	}
	m.R.Progress = p
	return &p
}

// PhaseTimes is how long each load phase of the run took, at ready (now).
func (m *Core) PhaseTimes() []PhaseTime {
	var out []PhaseTime
	for i, p := range m.R.Phases {
		end := m.Now
		if i+1 < len(m.R.Phases) {
			end = m.R.Phases[i+1].At
		}
		out = append(out, PhaseTime{Name: p.Name, Took: end.Sub(p.At)})
	}
	return out
}

// ShownProgress is the run's load progress while its phase is the pump's
// (nil: none to show).
func (m *Core) ShownProgress() *status.LoadProgress {
	if p := m.R.Progress; p.Total > 0 && p.Phase == m.Pump.Phase {
		return &p
	}
	return nil
}
