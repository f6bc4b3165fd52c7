// Package testkit is for tests only: _test.go files import it, the guard's
// own code never does (docs/layers_test.go fails otherwise). It imports
// only the standard library, goleak and internal/freeport.
//
// It holds the helpers every package's tests used to copy:
//
//   - WaitFor (and Poll, its loop; PollEvery at a pace of its own): wait
//     until a condition holds, with a
//     bound that only ends a test that would never pass. Tests never sleep
//     to "wait enough"; they wait for what they need, and the bound is
//     generous because a loaded 2-core machine may take seconds.
//   - Main (and MainWithCleanup): a package's TestMain that runs its tests
//     and then, when they passed, fails the run if goroutines are left
//     (goleak).
//   - FreePort: a TCP port nobody listens on, for a test's guard,
//     simulator or proxy (internal/freeport, which the benchmarks use too).
package testkit

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vllm-guard/vllm-guard/internal/freeport"
)

// The pace of Poll: every millisecond at first, then a little slower, up
// to maxPause, so that a long wait does not spin.
const (
	firstPause = time.Millisecond
	maxPause   = 10 * time.Millisecond
)

// Poll calls cond until it holds (true) or bound passes (false). It looks
// about every millisecond at first, then backs off to every 10 ms, and
// looks once more when bound has passed. cond runs on the caller's
// goroutine, so it may call t.Fatal.
func Poll(bound time.Duration, cond func() bool) bool {
	return poll(bound, firstPause, maxPause, cond)
}

// PollEvery is Poll at a pace of its own: it looks every pause. For a
// condition that costs the system under test something to look at (a
// status request, a scan of /proc) on a loaded machine, where Poll's
// millisecond pace would add load of its own.
func PollEvery(bound, pause time.Duration, cond func() bool) bool {
	return poll(bound, pause, pause, cond)
}

func poll(bound, first, most time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	pause := first
	for {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(pause, left))
		pause = min(pause+pause/8+time.Microsecond, most)
	}
}

// WaitFor waits until cond holds, and fails the test when bound passes
// first. The bound is not a measurement: it only ends a test that will
// never pass, so pass a generous one (30 s for what takes milliseconds).
func WaitFor(t testing.TB, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	if !Poll(bound, cond) {
		t.Fatalf("timed out after %s waiting for %s", bound, what)
	}
}

// FreePort returns a TCP port on 127.0.0.1 nobody listens on right now
// (freeport.Pick), and fails the test when there is none.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Main is a package's TestMain:
//
//	func TestMain(m *testing.M) { testkit.Main(m) }
//
// It runs the tests and, when they passed, fails the run if goroutines
// are left (goleak.Find with opts, which a package passes only for a
// goroutine of its own it cannot end; no package needs one today).
func Main(m *testing.M, opts ...goleak.Option) {
	os.Exit(run(m, nil, os.Stderr, opts))
}

// MainWithCleanup is Main with cleanup run after the tests and before the
// leak check, whatever the tests' outcome (testbin.Cleanup: the binaries a
// package's tests built).
//
// It exists because goleak.VerifyTestMain's own goleak.Cleanup option
// replaces its os.Exit: a leak found then is printed, but the run still
// exits 0. Here a leak always fails the run.
func MainWithCleanup(m *testing.M, cleanup func(), opts ...goleak.Option) {
	os.Exit(run(m, cleanup, os.Stderr, opts))
}

// run is Main's body: the exit code of the tests and the leak check.
func run(m interface{ Run() int }, cleanup func(), stderr io.Writer, opts []goleak.Option) int {
	code := m.Run()
	if cleanup != nil {
		cleanup()
	}
	if code != 0 {
		return code // the tests failed: a goroutine they left says nothing more
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintf(stderr, "goleak: Errors on successful test run: %v\n", err)
		return 1
	}
	return 0
}

// ArgvHas fails t unless the command line argv has each of want (a flag
// with its value, "--nnodes 2"), as whole words; who names it.
func ArgvHas(t testing.TB, who string, argv []string, want ...string) {
	t.Helper()
	line := " " + strings.Join(argv, " ") + " "
	for _, w := range want {
		if !strings.Contains(line, " "+w+" ") {
			t.Errorf("%s's vLLM command %q has no %q", who, argv, w)
		}
	}
}
