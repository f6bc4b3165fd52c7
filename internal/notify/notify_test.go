package notify

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/notify/notifytest"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const wait = 5 * time.Second

// expect reads the next datagram and fails unless it is want.
func expect(t *testing.T, s *notifytest.Socket, want string) {
	t.Helper()
	got, ok := s.Read(wait)
	if !ok {
		t.Fatalf("no datagram within %s, want %q", wait, want)
	}
	if got != want {
		t.Fatalf("datagram %q, want %q", got, want)
	}
}

func TestReadyOnce(t *testing.T) {
	s := notifytest.Listen(t)
	n := New(zap.NewNop())
	if !n.Enabled() {
		t.Fatal("NOTIFY_SOCKET is set but the notifier is disabled")
	}
	n.Ready()
	n.Ready() // a later readiness (vLLM restarted) is not news to systemd
	n.Status("marker")
	expect(t, s, "READY=1")
	expect(t, s, "STATUS=marker")
}

func TestStatusIsOneLine(t *testing.T) {
	s := notifytest.Listen(t)
	n := New(nil)
	n.Status("ready\nrung 1\r\x1b[31m")
	expect(t, s, "STATUS=ready rung 1  [31m")
}

func TestExtendRateLimited(t *testing.T) {
	s := notifytest.Listen(t)
	n := New(nil)
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	n.Extend(90 * time.Second)
	n.Extend(90 * time.Second)  // same instant: dropped
	advance(ExtendEvery / 2)    // still too soon
	n.Extend(120 * time.Second) // dropped
	n.Extend(0)                 // never sent
	advance(ExtendEvery / 2)
	n.Extend(11 * time.Minute)
	n.Stopping()
	expect(t, s, "EXTEND_TIMEOUT_USEC=90000000")
	expect(t, s, "EXTEND_TIMEOUT_USEC=660000000")
	expect(t, s, "STOPPING=1")
}

func TestNoSocketIsNoop(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "200000")
	core, logs := observer.New(zapcore.DebugLevel)
	n := New(zap.New(core))
	if n.Enabled() {
		t.Fatal("enabled without NOTIFY_SOCKET")
	}
	n.Ready()
	n.Status("x")
	n.Extend(time.Minute)
	n.Stopping()
	done := make(chan struct{})
	go func() { n.RunWatchdog(context.Background(), time.Now); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("RunWatchdog did not return at once without NOTIFY_SOCKET")
	}
	if logs.Len() != 0 {
		t.Fatalf("logged without NOTIFY_SOCKET: %v", logs.All())
	}
}

func TestSendFailureLoggedOnce(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", t.TempDir()+"/nobody-listens.sock")
	core, logs := observer.New(zapcore.InfoLevel)
	n := New(zap.New(core))
	n.Ready()
	n.Status("a")
	n.Status("b")
	if got := logs.FilterMessageSnippet("sd_notify failed").Len(); got != 1 {
		t.Fatalf("%d failure logs for three failed sends, want 1: %v", got, logs.All())
	}
}

func TestWatchdogOtherPID(t *testing.T) {
	s := notifytest.Listen(t)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(1<<22+7)) // meant for another process
	n := New(nil)
	n.RunWatchdog(context.Background(), time.Now) // returns at once, or the test times out
	n.Status("marker")
	expect(t, s, "STATUS=marker")
}

// TestWatchdogStopsWhenLoopWedged: with WATCHDOG_USEC=200ms the pings come
// every 100ms while the loop turns, stop once it stops turning, and resume
// when it turns again.
func TestWatchdogStopsWhenLoopWedged(t *testing.T) {
	s := notifytest.Listen(t)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", "")
	core, logs := observer.New(zapcore.InfoLevel)
	n := New(zap.New(core))

	var frozen atomic.Pointer[time.Time] // nil: the loop turns (lastTurn is now)
	lastTurn := func() time.Time {
		if f := frozen.Load(); f != nil {
			return *f
		}
		return time.Now()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.RunWatchdog(ctx, lastTurn) }()
	defer func() { cancel(); <-done }()

	isPing := func(m string) bool { return m == "WATCHDOG=1" }
	for range 3 {
		s.Await(t, "WATCHDOG=1 while the loop turns", isPing, wait)
	}

	stuck := time.Now()
	frozen.Store(&stuck)
	waitLog(t, logs, "supervisor loop wedged")
	// Pings sent before the wedge was seen are queued: drop them. From the
	// log line on, none may come.
	s.Drain()
	if m, ok := s.Read(5 * 100 * time.Millisecond); ok {
		t.Fatalf("got %q within five ping periods of a wedged loop", m)
	}
	if got := logs.FilterMessageSnippet("supervisor loop wedged").Len(); got != 1 {
		t.Errorf("wedge logged %d times, want once", got)
	}

	frozen.Store(nil)
	s.Await(t, "WATCHDOG=1 after the loop turned again", isPing, wait)
	waitLog(t, logs, "WATCHDOG=1 resumed")
}

func waitLog(t *testing.T, logs *observer.ObservedLogs, snippet string) {
	t.Helper()
	if !testkit.Poll(wait, func() bool { return logs.FilterMessageSnippet(snippet).Len() > 0 }) {
		t.Fatalf("no log %q within %s; logs: %v", snippet, wait, logs.All())
	}
}

func TestStatusLine(t *testing.T) {
	rung1 := policy.Rung{Index: 1, MaxNumSeqs: 128, GPUMemoryUtilization: 0.8}
	oneGPU := gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{Index: 0, Fraction: 0.834}}}
	oom := &status.Failure{Verdict: cause.Verdict{Cause: cause.CauseOOM}}
	for _, tc := range []struct {
		name string
		st   status.Status
		gpu  gpumon.Snapshot
		want string
	}{
		{"ready after oom", status.Status{State: status.StateReady, Rung: rung1, LastFailure: oom}, oneGPU,
			"ready · rung 1 (max_num_seqs 128, util 0.80) · GPU 83% · last: oom"},
		{"starting with phase, no NVML",
			status.Status{State: status.StateStarting, Phase: "weights", Rung: policy.Rung{MaxNumSeqs: 256, GPUMemoryUtilization: 0.85}},
			gpumon.Snapshot{Up: false, Reason: "GPU metrics unavailable"},
			"starting (weights) · rung 0 (max_num_seqs 256, util 0.85) · GPU n/a"},
		{"failed with alerts on two GPUs",
			status.Status{State: status.StateFailed, ExitCode: 78, Rung: rung1},
			gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{Index: 0, Fraction: 0.5}, {Index: 1, Fraction: 0.97}},
				Active: []gpumon.Alert{{Name: "gpu_memory_warn", Device: 1, Active: true}, {Name: "gpu_memory_critical", Device: 1, Active: true},
					{Name: "gpu_memory_warn", Device: 0, Active: true}}},
			"failed (exit 78) · rung 1 (max_num_seqs 128, util 0.80) · GPU 97% (max of 2, GPU 1) · alert: gpu_memory_warn, gpu_memory_critical"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StatusLine(tc.st, tc.gpu); got != tc.want {
				t.Errorf("StatusLine:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestStatusChangesOnOOM: the STATUS= datagram after an OOM differs from
// the one before and names the cause.
func TestStatusChangesOnOOM(t *testing.T) {
	s := notifytest.Listen(t)
	n := New(nil)
	rung0 := policy.Rung{MaxNumSeqs: 256, GPUMemoryUtilization: 0.85}
	gpu := gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{Fraction: 0.99}}}
	n.Status(StatusLine(status.Status{State: status.StateReady, Rung: rung0}, gpu))
	before, _ := s.Read(wait)
	n.Status(StatusLine(status.Status{State: status.StateBackoff, Rung: policy.Rung{Index: 1, MaxNumSeqs: 128, GPUMemoryUtilization: 0.8},
		LastFailure: &status.Failure{Verdict: cause.Verdict{Cause: cause.CauseOOM}}}, gpu))
	after, _ := s.Read(wait)
	if before == after || !strings.HasPrefix(after, "STATUS=backoff") || !strings.HasSuffix(after, "last: oom") {
		t.Fatalf("STATUS before the OOM %q, after %q: want a backoff line ending in \"last: oom\"", before, after)
	}
}

func FuzzStatusLine(f *testing.F) {
	f.Add("starting", "weights", "oom", 0.5)
	f.Add("ready\n", "graphs\r\n", "crash\x00", 1.2)
	f.Fuzz(func(t *testing.T, state, phase, why string, frac float64) {
		st := status.Status{State: status.State(state), Phase: phase,
			LastFailure: &status.Failure{Verdict: cause.Verdict{Cause: cause.Cause(why)}}}
		line := StatusLine(st, gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{Fraction: frac}}})
		if strings.ContainsAny(line, "\n\r\x00") {
			t.Fatalf("StatusLine is not one line: %q", line)
		}
	})
}
