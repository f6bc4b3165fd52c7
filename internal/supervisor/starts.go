package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// The record of this host's starts (Options.StartTimes): at each launch
// the status gets the time to ready expected of it; at ready the start is
// added, and the record saved off the loop (the policy's writer).

// startsKey is the model a start is recorded under: as vLLM loads it.
func (s *Supervisor) startsKey() string {
	if s.args != nil && s.args.Model != "" {
		return s.args.Model
	}
	return s.model
}

// expectStart puts the time to ready expected of the start on rung in
// the status (From 0: unknown, no earlier start seen), and notes whether
// the start is cold.
func (m *machine) expectStart(rung policy.Rung) {
	s := m.s
	if s.starts == nil {
		return
	}
	e, ok, cold := s.starts.Expect(s.startsKey(), rung.Index, s.boot)
	m.res.cold = cold
	exp := &status.Expected{TimeToReady: e.TimeToReady, From: e.From, Cold: e.Cold, Basis: e.Describe(rung.Index)}
	if !ok {
		exp = &status.Expected{Basis: fmt.Sprintf("unknown: no earlier start of this model on rung %d seen", rung.Index)}
	}
	s.update(m.at, func(st *Status) { st.Expected = exp })
}

// recordStart adds the start that became ready to the record.
func (m *machine) recordStart(f fxReady) {
	s := m.s
	if s.starts == nil {
		return
	}
	rec := starttimes.Start{Model: s.startsKey(), Rung: s.status.Load().Rung.Index, At: m.at, Boot: s.boot, Cold: m.res.cold, TimeToReady: f.TTR}
	for _, p := range f.Phases {
		rec.Phases = append(rec.Phases, starttimes.Phase{Name: p.Name, Took: p.Took})
	}
	s.starts.Add(rec)
	s.saveStarts()
}

// saveStarts has the record saved: by the writer while Run runs, else at
// once.
func (s *Supervisor) saveStarts() {
	if w := s.writer; w != nil {
		select {
		case w.starts <- struct{}{}:
		default: // a save is pending: it takes the newest record
		}
		return
	}
	s.writeStarts()
}

// writeStarts saves the newest record, unless it was saved already.
func (s *Supervisor) writeStarts() {
	if s.starts == nil || s.saveStartsTo == nil {
		return
	}
	t0 := time.Now()
	if err := s.starts.Save(s.saveStartsTo); err != nil {
		s.log.Warn("the record of vLLM's start times was not saved: the expected time to ready after a restart of the guard learns afresh",
			zap.Error(err), zap.Duration("took", time.Since(t0)))
	}
}
