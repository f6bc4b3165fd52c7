// Package starttimes owns what this host's earlier starts of vLLM took:
// one record per start that became ready (its model, rung, whether it was
// the first of that model since the host booted, its time to ready and
// its load phases' times), and the time to ready expected of the next
// start of the same model on the same rung. It is pure: it reads no clock
// and no file; the guard's state folder keeps the records
// (internal/state, starts.json).
package starttimes

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Bounds of the record: a few KiB on disk whatever happens.
const (
	MaxPerKey   = 8   // starts kept per model and rung
	MaxStarts   = 128 // starts kept in all (the oldest go first)
	Recent      = 5   // the starts an expectation is made of, newest first
	maxModelLen = 512
	maxTTR      = 7 * 24 * time.Hour // longer is not a start's time
	maxPhases   = 16
)

// Start is one start of vLLM that became ready.
type Start struct {
	Model string    `json:"model"` // as vLLM loads it (its --model or positional argument)
	Rung  int       `json:"rung"`
	At    time.Time `json:"at"` // when it became ready
	// Boot is the host's boot id when it started; Cold says it was the
	// first start of this model since that boot (nothing of its weights
	// in the page cache yet, as far as the guard can tell).
	Boot        string        `json:"boot,omitempty"`
	Cold        bool          `json:"cold"`
	TimeToReady time.Duration `json:"time_to_ready_ns"`
	Phases      []Phase       `json:"phases,omitempty"` // in the order vLLM went through them
}

// Phase is how long one load phase took: from its first line to the
// next phase's (the last one: to ready).
type Phase struct {
	Name string        `json:"phase"`
	Took time.Duration `json:"took_ns"`
}

// History is the record of starts, oldest first.
type History struct {
	Starts []Start `json:"starts"`
}

// Expected is the time to ready expected of a start, and how many
// earlier starts it was learned from.
type Expected struct {
	TimeToReady time.Duration
	From        int
	Cold        bool // learned from first starts since a boot (else from later ones, or from both when only those were seen)
}

// Remaining is what is left of expected after elapsed: never negative.
func Remaining(expected, elapsed time.Duration) time.Duration { return max(expected-elapsed, 0) }

// Add returns h with s added, the oldest starts of its model and rung
// beyond MaxPerKey and the oldest in all beyond MaxStarts dropped. h is
// not changed.
func (h History) Add(s Start) History {
	out := History{Starts: append(slices.Clip(h.Starts), s)}
	return out.bounded()
}

// bounded drops the oldest starts beyond the bounds.
func (h History) bounded() History {
	per := map[key]int{}
	keep := make([]bool, len(h.Starts))
	n := 0
	for i := len(h.Starts) - 1; i >= 0; i-- {
		k := keyOf(h.Starts[i])
		if per[k] < MaxPerKey && n < MaxStarts {
			per[k]++
			n++
			keep[i] = true
		}
	}
	out := History{Starts: make([]Start, 0, n)}
	for i, s := range h.Starts {
		if keep[i] {
			out.Starts = append(out.Starts, s)
		}
	}
	return out
}

type key struct {
	model string
	rung  int
}

func keyOf(s Start) key { return key{s.Model, s.Rung} }

// Clean is h as read from a file another process could have written:
// starts that cannot be a start's (no model, a time to ready not above
// zero or over a week) are dropped, the rest bounded. It says how many
// were dropped.
func (h History) Clean() (History, int) {
	out := History{}
	dropped := 0
	for _, s := range h.Starts {
		if s.Model == "" || len(s.Model) > maxModelLen || s.TimeToReady <= 0 || s.TimeToReady > maxTTR || s.Rung < 0 || len(s.Boot) > 64 {
			dropped++
			continue
		}
		if len(s.Phases) > maxPhases {
			s.Phases = s.Phases[:maxPhases]
		}
		out.Starts = append(out.Starts, s)
	}
	b := out.bounded()
	return b, dropped + len(out.Starts) - len(b.Starts)
}

// Cold reports whether a start of model now would be the first since the
// host booted (boot: its boot id; "" when unknown: never cold).
func (h History) Cold(model, boot string) bool {
	if boot == "" {
		return false
	}
	for _, s := range h.Starts {
		if s.Model == model && s.Boot == boot {
			return false
		}
	}
	return true
}

// Expect is the time to ready expected of a start of model on rung, cold
// or not: a weighted mean of the Recent newest earlier starts of the same
// model and rung (the newest weighs most), of the same kind (cold or
// warm) when there are such, else of both. ok is false before any start
// of the model on the rung was seen.
func (h History) Expect(model string, rung int, cold bool) (Expected, bool) {
	var same, all []time.Duration
	for i := len(h.Starts) - 1; i >= 0; i-- {
		s := h.Starts[i]
		if s.Model != model || s.Rung != rung {
			continue
		}
		all = append(all, s.TimeToReady)
		if s.Cold == cold {
			same = append(same, s.TimeToReady)
		}
	}
	from, kind := same, cold
	if len(same) == 0 {
		from, kind = all, false
	}
	if len(from) == 0 {
		return Expected{}, false
	}
	from = from[:min(len(from), Recent)]
	var sum, weights float64
	for i, d := range from {
		w := float64(len(from) - i)
		sum += w * float64(d)
		weights += w
	}
	return Expected{TimeToReady: time.Duration(sum / weights), From: len(from), Cold: kind && len(same) > 0}, true
}

// Describe is where e came from, in the operator's words: "3 earlier
// starts of this model on rung 0".
func (e Expected) Describe(rung int) string {
	kind := ""
	if e.Cold {
		kind = "cold "
	}
	s := "s"
	if e.From == 1 {
		s = ""
	}
	return fmt.Sprintf("%d earlier %sstart%s of this model on rung %d", e.From, kind, s, rung)
}

// Book is the record in use by a running guard: its supervisors add to
// it and ask it from their loops; a writer saves it off them. Safe for
// concurrent use.
type Book struct {
	mu      sync.Mutex
	h       History
	version uint64 // one more at each Add

	saveMu  sync.Mutex
	written uint64 // the version last saved
}

// NewBook is a book that begins with h (as read from the state folder).
func NewBook(h History) *Book { return &Book{h: h} }

// Expect is History.Expect over the book, with whether the start would
// be cold on the host booted as boot.
func (b *Book) Expect(model string, rung int, boot string) (Expected, bool, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cold := b.h.Cold(model, boot)
	e, ok := b.h.Expect(model, rung, cold)
	return e, ok, cold
}

// Add records a start that became ready.
func (b *Book) Add(s Start) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.h = b.h.Add(s)
	b.version++
}

// History is a copy of the record.
func (b *Book) History() History {
	b.mu.Lock()
	defer b.mu.Unlock()
	return History{Starts: slices.Clone(b.h.Starts)}
}

// Save hands the newest record to save unless it was saved already; one
// save at a time, so an older record never replaces a newer one.
func (b *Book) Save(save func(History) error) error {
	b.saveMu.Lock()
	defer b.saveMu.Unlock()
	b.mu.Lock()
	h, v := History{Starts: slices.Clone(b.h.Starts)}, b.version
	b.mu.Unlock()
	if v == b.written {
		return nil
	}
	if err := save(h); err != nil {
		return err
	}
	b.written = v
	return nil
}
