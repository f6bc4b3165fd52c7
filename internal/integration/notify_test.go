package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/notify/notifytest"
)

// These tests read the guard's real sd_notify datagrams from a unixgram
// socket given as NOTIFY_SOCKET (not parallel: NOTIFY_SOCKET is process-wide).

func TestNoREADYBeforeACompletionSucceeds(t *testing.T) {
	sock := notifytest.Listen(t)
	s := newScene(t)
	s.env["FAKEVLLM_FAULT"] = "never_ready"
	s.start()
	// Several readiness probes answered and failed: each a chance to send
	// READY=1, counted, not timed. A datagram sent before the event was
	// published is queued on the socket by then.
	s.WaitEvent("three answered readiness probes", 3, 30*time.Second, answeredProbeFailure)
	for _, m := range sock.Drain() {
		if strings.Contains(m, "READY=1") {
			t.Fatalf("READY=1 sent although no completion succeeded: %q", m)
		}
	}
}

func TestREADYAfterReadyAndExtendDuringALongLoad(t *testing.T) {
	sock := notifytest.Listen(t)
	s := newScene(t)
	// 4 s of load for two EXTENDs a second apart: only a guard stalled for
	// 3 s would send fewer (and its watchdog would fail first).
	s.env["FAKEVLLM_LOAD_WEIGHTS"] = "4s"
	s.env["FAKEVLLM_PROGRESS_EVERY"] = "200ms"
	s.start()
	seen := sock.Await(t, "READY=1", func(m string) bool { return strings.Contains(m, "READY=1") }, 30*time.Second)
	extends := 0
	for _, m := range seen {
		if strings.HasPrefix(m, "EXTEND_TIMEOUT_USEC=") {
			extends++
		}
	}
	if extends < 2 {
		t.Fatalf("%d EXTEND_TIMEOUT_USEC during a 4 s load with progress, want at least 2; datagrams:\n%s", extends, strings.Join(seen, "\n"))
	}
	// The event and the datagram travel separately: the event may lag.
	s.WaitEvent("the ready event to match READY=1", 1, 30*time.Second, isReady)
}

func TestSTATUSChangesOnOOM(t *testing.T) {
	sock := notifytest.Listen(t)
	s := newScene(t)
	s.env["FAKEVLLM_SEQ_COST_MIB"] = "64"
	s.env["FAKEVLLM_BACKGROUND_SEQS"] = "200"
	s.env["FAKEVLLM_BACKGROUND_AFTER"] = "200ms"
	s.extra = "\n[restart]\ninitial_delay = \"200ms\"\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	seen := sock.Await(t, "a STATUS naming the OOM", func(m string) bool {
		return strings.HasPrefix(m, "STATUS=") && strings.Contains(m, "oom")
	}, 60*time.Second)
	var before string
	for _, m := range seen[:len(seen)-1] {
		if strings.HasPrefix(m, "STATUS=ready") {
			before = m
		}
	}
	if before == "" {
		t.Fatalf("no STATUS=ready before the OOM; datagrams:\n%s", strings.Join(seen, "\n"))
	}
	sock.Await(t, "STATUS ready on rung 1", func(m string) bool {
		return strings.HasPrefix(m, "STATUS=ready") && strings.Contains(m, "rung 1")
	}, 60*time.Second)
}
