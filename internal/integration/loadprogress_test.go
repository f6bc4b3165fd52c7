package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/notify/notifytest"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Issue 42's must-show: during a load on the simulator, `vllm-guard
// status` shows the shard progress and an expected time to ready once one
// start has been seen. A first guard starts vLLM to ready and stops; a
// second one over the same state folder starts it again with a slow
// weight load (64 shards over 5 minutes: a shard every ~5 s). While it
// loads, status (human and JSON), STATUS= and /metrics show the shards
// vLLM reported and the time to ready learned from the first start (the
// one start it was learned from: exactly its time to ready).
//
// The test waits on events and reads what the guard shows; no assertion
// is on time.
func TestStatusShowsLoadProgressAndExpectedTimeToReady(t *testing.T) {
	// Not parallel: NOTIFY_SOCKET is process-wide. Read as systemd does,
	// all along (the guard's sends block on a full socket).
	notes := systemdReading(t, notifytest.Listen(t))
	s := newScene(t)
	// 320 GiB of weights are 64 shards of 5 GiB (fakevllm/engine.go) on
	// a stand-in GPU large enough to hold them.
	s.writeDevices("GPU-5e1f0000-0000-4000-8000-000000000001 687194767360 536870912 NVIDIA H200 640GB")
	s.env["FAKEVLLM_ERA"] = "v1" // vLLM 0.32.0's bytes: "\r"-led bars on stderr
	s.env["FAKEVLLM_WEIGHTS_GIB"] = "320"
	// A first load of 10 s, longer than the wait for the second's first
	// shard (~5 s) on an idle machine: the view then says "ready in ~N s"
	// (on a loaded one "taking longer than expected", also an expected time).
	s.env["FAKEVLLM_LOAD_WEIGHTS"] = "10s"
	httpPort := testkit.FreePort(t)
	s.httpListen = fmt.Sprintf("127.0.0.1:%d", httpPort)
	s.start()
	first := s.WaitEvent("the first start ready", 1, 60*time.Second, isReady)
	s.stopCleanly(30*time.Second, 30*time.Second)
	if _, err := os.Stat(filepath.Join(s.dir, "state", "starts.json")); err != nil {
		t.Fatalf("the first start was not recorded in the state folder: %v", err)
	}

	s.env["FAKEVLLM_LOAD_WEIGHTS"] = "5m"
	n := s.restart()
	shard := n.WaitEvent("vLLM's bar reporting a shard loaded", 1, 60*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindProgress && e.Progress != nil && e.Progress.Done >= 1
	})
	if p := shard.Progress; p.Phase != "weights" || p.Unit != "shards" || p.Total != 64 {
		t.Fatalf("progress event %+v, want weights' shards out of 64", p)
	}

	// The JSON document: the bar's counts, and the expected time learned
	// from the one earlier start.
	out, err := exec.Command(bins.guard, "status", "--json", "--socket", n.socket()).Output()
	if err != nil && !isExit(err, 1) { // 1: not ready, as it should be
		t.Fatalf("vllm-guard status --json: %v\n%s", err, out)
	}
	d, err := control.DecodeDoc(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	g := d.Guard
	if g.State != "starting" || g.Progress == nil || g.Progress.Total != 64 || g.Progress.Done < 1 || g.Progress.Unit != "shards" {
		t.Fatalf("status --json while loading: state %s, progress %+v; want starting with shards done out of 64", g.State, g.Progress)
	}
	if e := g.Expected; e == nil || e.From != 1 || e.TimeToReady != first.TimeToReady {
		t.Fatalf("status --json: expected %+v, want %s (the first start's time to ready) from 1 earlier start", e, first.TimeToReady)
	}

	// The human view.
	out, _ = exec.Command(bins.guard, "status", "--socket", n.socket()).CombinedOutput()
	view := string(out)
	t.Logf("vllm-guard status while loading:\n%s", view)
	for _, re := range []string{
		`(?m)^  loading +phase weights: \d+/64 shards \(\d+%\) ▕.*▏$`,
		`(?m)^  expected +(ready in ~\d+ s|taking longer than expected \(usually ~\d+ s,) \(?from 1 earlier start of this model on rung 0\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(view) {
			t.Errorf("status view lacks %s:\n%s", re, view)
		}
	}

	// systemd's STATUS= (what `systemctl status` shows): the first start,
	// with none seen before it, said it did not know; this one says when.
	testkit.WaitFor(t, "STATUS= with the shards and the time to ready", 30*time.Second, func() bool {
		return slices.ContainsFunc(notes(), func(m string) bool {
			return strings.HasPrefix(m, "STATUS=starting (weights ") && strings.Contains(m, "/64 shards, ") &&
				(strings.Contains(m, " · ready in ~") || strings.Contains(m, " · overdue (usually ~"))
		})
	})
	if !slices.ContainsFunc(notes(), func(m string) bool { return strings.Contains(m, " · ready in: unknown · ") }) {
		t.Errorf("the first start never said STATUS=… ready in: unknown; datagrams:\n%s", strings.Join(notes(), "\n"))
	}

	// The metrics.
	scrape := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort), 200)
	for _, want := range []string{`vllm_guard_load_progress_ratio{phase="weights",unit="shards"} `, "vllm_guard_expected_seconds_to_ready ",
		fmt.Sprintf("vllm_guard_expected_time_to_ready_seconds %g\n", first.TimeToReady.Seconds())} {
		if !strings.Contains(scrape, "\n"+want) {
			t.Errorf("/metrics while loading lacks %q", want)
		}
	}
}

// systemdReading reads sock's datagrams as they come until the test ends;
// notes returns those read so far.
func systemdReading(t *testing.T, sock *notifytest.Socket) (notes func() []string) {
	var mu sync.Mutex
	var got []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if m, ok := sock.Read(50 * time.Millisecond); ok {
				mu.Lock()
				got = append(got, m)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
}

// isExit reports whether err is a command's exit with code.
func isExit(err error, code int) bool {
	ee, ok := err.(*exec.ExitError)
	return ok && ee.ExitCode() == code
}
