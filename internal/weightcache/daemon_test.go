package weightcache

import (
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The daemon's output is logged a line at a time, tqdm's carriage-return
// states as lines of their own, a line split over writes whole, and the
// last lines kept for the reports of its deaths.
func TestLineLog(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	l := newLineLog(zap.New(core))
	for _, w := range []string{"INFO start\n\rLoading safetensors checkpoint shards:   0% Completed | 0/1\n",
		"\rLoading safetensors checkpoint shards: 100% Completed | 1/1\n\n", "Weight cache target daemon rank 0 ser", "ving on /x.sock\n"} {
		if n, err := l.Write([]byte(w)); n != len(w) || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Message)
	}
	want := []string{"INFO start", "Loading safetensors checkpoint shards:   0% Completed | 0/1",
		"Loading safetensors checkpoint shards: 100% Completed | 1/1", "Weight cache target daemon rank 0 serving on /x.sock"}
	if !slices.Equal(got, want) || !slices.Equal(l.last(), want) {
		t.Fatalf("logged %q, kept %q; want %q", got, l.last(), want)
	}
	for i := range 2 * keptLines {
		l.Write([]byte(strings.Repeat("x", i+1) + "\n"))
	}
	if k := l.last(); len(k) != keptLines || k[keptLines-1] != strings.Repeat("x", 2*keptLines) {
		t.Fatalf("kept %d lines, the last %q", len(k), k[len(k)-1])
	}
}
