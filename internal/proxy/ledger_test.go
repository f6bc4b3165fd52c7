package proxy

import (
	"fmt"
	"testing"
)

// Where a continuation starts, as a table: the ledger at the cut, the
// request's sampling, and what the client sees → the ids the continuation
// starts after, what it must give again, or why it cannot.
func TestLedgerCut(t *testing.T) {
	for _, c := range []struct {
		name          string
		chunks        []chunkIn
		greedy, shown bool
		reason        string
		from          int   // ids in the continuation's prompt
		regen         []int // ids it must give again (greedy)
		phantom       int   // the client's chunks of ids rolled back
	}{
		{"every chunk one id with text", []chunkIn{{[]int{1}, "a"}, {[]int{2}, "b"}}, false, true, "", 2, nil, 0},
		{"greedy, after a chunk without text", []chunkIn{{[]int{1}, "a"}, {[]int{2}, ""}}, true, true, "", 1, []int{2}, 0},
		{"greedy, after two ids", []chunkIn{{[]int{1}, "a"}, {[]int{2, 3}, "bc"}}, true, false, "", 1, []int{2, 3}, 0},
		{"sampled, ids hidden, no text since", []chunkIn{{[]int{1}, "a"}, {[]int{2}, ""}, {[]int{3}, ""}}, false, false, "", 1, nil, 2},
		{"sampled, ids shown", []chunkIn{{[]int{1}, "a"}, {[]int{2}, ""}}, false, true, nrSplitChar, 2, nil, 0},
		{"sampled, text since", []chunkIn{{[]int{1}, "a"}, {[]int{2, 3}, "b"}}, false, false, nrSplitChar, 3, nil, 0},
		{"nothing whole yet, greedy", []chunkIn{{[]int{1, 2}, "ab"}}, true, true, "", 0, []int{1, 2}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var l ledger
			for _, ch := range c.chunks {
				l.add(ch.ids, ch.raw, len(ch.ids) == 1)
			}
			reason := l.cut(c.greedy, c.shown)
			if reason != c.reason || len(l.ids) != c.from || fmt.Sprint(l.regen) != fmt.Sprint(c.regen) || l.phantom != c.phantom {
				t.Fatalf("cut: %q, from %d, regen %v, phantom %d; want %q, %d, %v, %d", reason, len(l.ids), l.regen, l.phantom,
					c.reason, c.from, c.regen, c.phantom)
			}
		})
	}
}

type chunkIn struct {
	ids []int
	raw string
}

// A greedy continuation's chunks are matched against what the client has:
// the same ids and text are dropped, new ones pass, other ones end it.
func TestLedgerMatch(t *testing.T) {
	l := ledger{regen: []int{2, 3}, regenRaw: "bc"}
	if ids, raw, ok := l.match([]int{2}, "b"); !ok || len(ids) != 0 || raw != "" {
		t.Fatalf("the first id again: %v %q %v", ids, raw, ok)
	}
	if ids, raw, ok := l.match([]int{3, 4}, "cd"); !ok || fmt.Sprint(ids) != "[4]" || raw != "d" || l.regenerating() {
		t.Fatalf("the last id again and a new one: %v %q %v", ids, raw, ok)
	}
	l = ledger{regen: []int{2}, regenRaw: "b"}
	if _, _, ok := l.match([]int{5}, "x"); ok {
		t.Fatal("another id taken as the client's")
	}
	l = ledger{regen: []int{2}, regenRaw: "b"}
	if _, _, ok := l.match([]int{2}, "x"); ok {
		t.Fatal("another text taken as the client's")
	}
}
