package status

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

func TestReadyIn(t *testing.T) {
	st := Status{State: StateStarting, StartedAt: t0}
	if got := st.ReadyInText(t0.Add(time.Second)); got != "" {
		t.Errorf("before the launch: %q", got)
	}
	st.Expected = &Expected{Basis: "unknown: no earlier start of this model on rung 0 seen"}
	if _, ok := st.ReadyIn(t0.Add(time.Second)); ok {
		t.Error("unknown: ReadyIn ok")
	}
	if got := st.ReadyInText(t0.Add(time.Second)); got != "ready time unknown (no earlier start of this model on rung 0 seen)" {
		t.Errorf("unknown: %q", got)
	}
	st.Expected = &Expected{TimeToReady: 52 * time.Second, From: 3, Basis: "3 earlier starts of this model on rung 0"}
	if left, ok := st.ReadyIn(t0.Add(11 * time.Second)); !ok || left != 41*time.Second {
		t.Errorf("after 11 s: %s %v", left, ok)
	}
	if got := st.ReadyInText(t0.Add(11 * time.Second)); got != "ready in ~41 s (from 3 earlier starts of this model on rung 0)" {
		t.Errorf("after 11 s: %q", got)
	}
	// Past the expected time: never negative.
	if left, ok := st.ReadyIn(t0.Add(time.Minute)); !ok || left != 0 {
		t.Errorf("after a minute: %s %v", left, ok)
	}
	if got := st.ReadyInText(t0.Add(time.Minute)); got != "taking longer than expected (usually ~52 s, from 3 earlier starts of this model on rung 0)" {
		t.Errorf("after a minute: %q", got)
	}
	st.State = StateReady
	if _, ok := st.ReadyIn(t0); ok || st.ReadyInText(t0) != "" {
		t.Error("ready: nothing is expected")
	}
}

func TestApprox(t *testing.T) {
	for d, want := range map[time.Duration]string{41 * time.Second: "41 s", 99 * time.Second: "99 s", 200 * time.Second: "3 min 20 s",
		5 * time.Minute: "5 min", 12*time.Minute + 40*time.Second: "13 min", 65 * time.Minute: "1 h 5 min"} {
		if got := Approx(d); got != want {
			t.Errorf("%s: %q, want %q", d, got, want)
		}
	}
}
