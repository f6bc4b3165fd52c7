package starttimes

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

func start(model string, rung int, ttr time.Duration, cold bool) Start {
	return Start{Model: model, Rung: rung, TimeToReady: ttr, Cold: cold, Boot: "b1", At: t0}
}

func TestExpectIsUnknownBeforeTheFirstStart(t *testing.T) {
	var h History
	if e, ok := h.Expect("m", 0, true); ok {
		t.Fatalf("expected %+v from no start", e)
	}
	h = h.Add(start("other", 0, time.Minute, true)).Add(start("m", 1, time.Minute, true))
	if e, ok := h.Expect("m", 0, true); ok {
		t.Fatalf("expected %+v from starts of another model or rung", e)
	}
}

func TestExpectPrefersTheRecentStarts(t *testing.T) {
	var h History
	h = h.Add(start("m", 0, 100*time.Second, false))
	if e, ok := h.Expect("m", 0, false); !ok || e.TimeToReady != 100*time.Second || e.From != 1 {
		t.Fatalf("one start of 100 s: %+v %v", e, ok)
	}
	h = h.Add(start("m", 0, 40*time.Second, false))
	// Weights 2 (newest) and 1: (2×40 + 100)/3 = 60 s.
	if e, _ := h.Expect("m", 0, false); e.TimeToReady != 60*time.Second || e.From != 2 {
		t.Fatalf("100 s then 40 s: %+v, want 60 s from 2", e)
	}
	for range 10 {
		h = h.Add(start("m", 0, 30*time.Second, false))
	}
	// The 100 s and 40 s starts are older than the Recent newest.
	if e, _ := h.Expect("m", 0, false); e.TimeToReady != 30*time.Second || e.From != Recent {
		t.Fatalf("after 10 starts of 30 s: %+v, want 30 s from %d", e, Recent)
	}
}

func TestExpectPrefersTheSameKind(t *testing.T) {
	var h History
	h = h.Add(start("m", 0, 52*time.Second, true)).Add(start("m", 0, 31*time.Second, false)).Add(start("m", 0, 33*time.Second, false))
	if e, _ := h.Expect("m", 0, true); e.TimeToReady != 52*time.Second || e.From != 1 || !e.Cold {
		t.Fatalf("cold: %+v, want the cold start's 52 s", e)
	}
	if e, _ := h.Expect("m", 0, false); e.From != 2 || e.Cold || e.TimeToReady < 31*time.Second || e.TimeToReady > 33*time.Second {
		t.Fatalf("warm: %+v, want from the 2 warm starts", e)
	}
	// Only warm starts seen: a cold start expects what they took.
	w := History{}.Add(start("m", 0, 31*time.Second, false))
	if e, ok := w.Expect("m", 0, true); !ok || e.TimeToReady != 31*time.Second || e.Cold {
		t.Fatalf("cold with only warm starts: %+v %v", e, ok)
	}
}

func TestCold(t *testing.T) {
	h := History{}.Add(start("m", 0, time.Second, true))
	if h.Cold("m", "b1") || !h.Cold("m", "b2") || !h.Cold("n", "b1") || h.Cold("m", "") {
		t.Fatal("cold: the first start of a model since a boot (an unknown boot: never cold)")
	}
}

func TestRemainingIsNeverNegative(t *testing.T) {
	if Remaining(41*time.Second, 10*time.Second) != 31*time.Second || Remaining(41*time.Second, time.Minute) != 0 {
		t.Fatal("Remaining")
	}
}

func TestAddIsBounded(t *testing.T) {
	var h History
	for i := range 3 * MaxStarts {
		h = h.Add(start("m"+string(rune('a'+i%40)), i%3, time.Duration(i+1)*time.Second, false))
	}
	if len(h.Starts) > MaxStarts {
		t.Fatalf("%d starts kept, at most %d", len(h.Starts), MaxStarts)
	}
	per := map[key]int{}
	for _, s := range h.Starts {
		per[keyOf(s)]++
	}
	for k, n := range per {
		if n > MaxPerKey {
			t.Fatalf("%v: %d starts kept, at most %d", k, n, MaxPerKey)
		}
	}
	// The newest is kept.
	if last := h.Starts[len(h.Starts)-1]; last.TimeToReady != time.Duration(3*MaxStarts)*time.Second {
		t.Fatalf("the newest start was dropped: %+v", last)
	}
}

func TestCleanDropsWhatCannotBeAStart(t *testing.T) {
	h := History{Starts: []Start{
		start("m", 0, time.Second, false),
		start("", 0, time.Second, false),
		start("m", 0, -time.Second, false),
		start("m", 0, 0, false),
		start("m", -1, time.Second, false),
		start(strings.Repeat("x", 10000), 0, time.Second, false),
		start("m", 0, 30*24*time.Hour, false),
	}}
	c, dropped := h.Clean()
	if len(c.Starts) != 1 || dropped != 6 {
		t.Fatalf("clean: %d kept, %d dropped; want 1 and 6", len(c.Starts), dropped)
	}
}

func TestBookSavesTheNewestOnce(t *testing.T) {
	b := NewBook(History{})
	var saved []int
	save := func(h History) error { saved = append(saved, len(h.Starts)); return nil }
	b.Save(save) // nothing new
	b.Add(start("m", 0, time.Second, true))
	b.Add(start("m", 0, time.Second, false))
	b.Save(save)
	b.Save(save)
	if len(saved) != 1 || saved[0] != 2 {
		t.Fatalf("saves: %v, want one of 2 starts", saved)
	}
	b.Add(start("m", 0, time.Second, false))
	if err := b.Save(func(History) error { return errors.New("disk full") }); err == nil {
		t.Fatal("a failed save not said")
	}
	b.Save(save)
	if len(saved) != 2 || saved[1] != 3 {
		t.Fatalf("after a failed save the record is saved again: %v", saved)
	}
	if e, ok, cold := b.Expect("m", 0, "b1"); !ok || cold || e.From == 0 {
		t.Fatalf("book: %+v %v %v", e, ok, cold)
	}
}

func TestDescribe(t *testing.T) {
	if got := (Expected{From: 3}).Describe(0); got != "3 earlier starts of this model on rung 0" {
		t.Error(got)
	}
	if got := (Expected{From: 1, Cold: true}).Describe(2); got != "1 earlier cold start of this model on rung 2" {
		t.Error(got)
	}
}
