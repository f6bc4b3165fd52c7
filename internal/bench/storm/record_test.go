package main

import (
	"testing"
	"time"
)

const ms = time.Millisecond

func samples(start, step time.Duration, oks ...bool) []sample {
	var out []sample
	for i, ok := range oks {
		out = append(out, sample{at: start + time.Duration(i)*step, ok: ok})
	}
	return out
}

func TestAvailabilityIsTimeWeightedAfterTheLoad(t *testing.T) {
	// Ready from 2 s to 6 s, sampled every second, window [2 s, 10 s].
	ss := samples(0, time.Second, false, false, true, true, true, true, false, false, false, false)
	if got := availability(ss, 2*time.Second, 10*time.Second, 10*time.Second); got != 0.5 {
		t.Fatalf("availability %v, want 0.5", got)
	}
	// A run that ended at 6 s: its last sample holds only until then, the
	// rest of the window is down.
	ss = samples(0, time.Second, false, false, true, true, true, true)
	if got := availability(ss, 2*time.Second, 6*time.Second, 10*time.Second); got != 0.5 {
		t.Fatalf("availability of an early end %v, want 0.5", got)
	}
	if got := availability(nil, time.Second, time.Second, time.Second); got != 0 {
		t.Fatalf("empty window: %v", got)
	}
}

func TestFirstStableSkipsShortStretchesAndToleratesOneBlip(t *testing.T) {
	// 3 ok (too short), 2 down, then 8 ok with one isolated blip inside.
	ss := samples(0, 100*ms, true, true, true, false, false, true, true, true, false, true, true, true, true)
	at, ok := firstStable(ss, 500*ms, 2*time.Second)
	if !ok || at != 500*ms {
		t.Fatalf("first stable at %s (%v), want 500ms", at, ok)
	}
	if _, ok := firstStable(samples(0, 100*ms, true, true, false, false), 500*ms, 400*ms); ok {
		t.Fatal("a 200 ms stretch counted as stable for 500 ms")
	}
	// A stretch still open at the end counts up to the end.
	if at, ok := firstStable(samples(0, 100*ms, false, true, true), 500*ms, time.Second); !ok || at != 100*ms {
		t.Fatalf("open stretch: %s %v", at, ok)
	}
}

func TestAlertLeadsPairEachOOMWithItsEpisode(t *testing.T) {
	starts := []time.Duration{0, 10 * time.Second, 20 * time.Second}
	alerts := []time.Duration{3 * time.Second, 4 * time.Second, 25 * time.Second}
	ooms := []time.Duration{8 * time.Second, 15 * time.Second, 29 * time.Second}
	got := alertLeads(starts, alerts, ooms)
	want := []time.Duration{5 * time.Second, -1, 4 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("leads %v, want %v (an alert of an earlier start does not cover a later OOM)", got, want)
		}
	}
}
