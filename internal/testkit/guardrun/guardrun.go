// Package guardrun is for tests only: one `vllm-guard run` as a test sees
// it, the process with its JSON log and its typed event stream, each read
// to the end. It is the one core of both end-to-end scenes, the
// simulator's (internal/integration) and the real vLLM's
// (internal/integration/realvllm): they write the config, choose the
// binary and the environment, and hold a *Guard for the rest — the
// streams, every wait on them, the exit, the stop.
//
// A test waits on what the guard says (an event, a log entry, its exit),
// never on a sleep: every wait wakes on each new line and event, and its
// bound only ends a test that would never pass.
package guardrun

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// Spec is how to start one guard.
type Spec struct {
	// Argv runs the guard (or a wrapper that ends in it) with
	// `--events /dev/fd/3`: the event stream's pipe is the child's fd 3.
	Argv []string
	Env  []string // the whole environment
	// Skip, when set, drops log lines the test does not keep (a
	// benchmark whose vLLM floods).
	Skip func(line string) bool
}

// Guard is one running (or ended) guard.
type Guard struct {
	t   testing.TB
	Cmd *exec.Cmd
	// Explain, when set, is added to every failure of a wait (the tail of
	// what vLLM printed).
	Explain func() string

	mu      sync.Mutex
	raw     []string         // every log line kept, as written
	logs    []map[string]any // those that are JSON
	evs     []events.Event   // the event stream, in order
	changed chan struct{}    // closed (and replaced) at each new line or event
	evDone  chan struct{}    // the event stream ended (the guard closed it at exit)
	exited  chan struct{}    // the guard exited and both streams were read to the end
	code    int
}

// Start starts the guard and reads its standard error (the JSON log) and
// its event stream in the background. It fails the test when the guard
// cannot start. Stopping it is the caller's (Stop, in its cleanup), after
// which nothing of it runs.
func Start(t testing.TB, spec Spec) *Guard {
	t.Helper()
	g := &Guard{t: t, changed: make(chan struct{}), evDone: make(chan struct{}), exited: make(chan struct{})}
	g.Cmd = exec.Command(spec.Argv[0], spec.Argv[1:]...)
	g.Cmd.Env = spec.Env
	evr, evw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	g.Cmd.ExtraFiles = []*os.File{evw}
	stderr, err := g.Cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Cmd.Start(); err != nil {
		evr.Close()
		evw.Close()
		t.Fatal(err)
	}
	evw.Close() // the guard holds the writing end now
	go g.readEvents(evr)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if spec.Skip != nil && spec.Skip(line) {
				continue
			}
			var m map[string]any
			_ = json.Unmarshal([]byte(line), &m)
			g.mu.Lock()
			g.raw = append(g.raw, line)
			if m != nil {
				g.logs = append(g.logs, m)
			}
			g.wake()
			g.mu.Unlock()
		}
		_ = g.Cmd.Wait()
		// The guard flushed and closed its event stream before it exited;
		// what it wrote is read before anyone hears of the exit.
		<-g.evDone
		g.mu.Lock()
		g.code = g.Cmd.ProcessState.ExitCode()
		g.mu.Unlock()
		close(g.exited)
	}()
	return g
}

// wake tells every wait that something new arrived; g.mu is held.
func (g *Guard) wake() {
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *Guard) readEvents(r *os.File) {
	defer close(g.evDone)
	defer r.Close()
	dec := json.NewDecoder(r)
	for {
		var e events.Event
		if err := dec.Decode(&e); err != nil {
			return
		}
		g.mu.Lock()
		g.evs = append(g.evs, e)
		g.wake()
		g.mu.Unlock()
	}
}

// Events is a copy of the events so far.
func (g *Guard) Events() []events.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.evs)
}

// Raw is a copy of the log lines so far, as the guard wrote them.
func (g *Guard) Raw() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.raw)
}

// Logs is a copy of the JSON log entries so far.
func (g *Guard) Logs() []map[string]any {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.logs)
}

// CountEvents is how many events so far match.
func (g *Guard) CountEvents(match func(events.Event) bool) int {
	n := 0
	for _, e := range g.Events() {
		if match(e) {
			n++
		}
	}
	return n
}

// CountLogs is how many log entries so far match.
func (g *Guard) CountLogs(match func(map[string]any) bool) int {
	n := 0
	for _, m := range g.Logs() {
		if match(m) {
			n++
		}
	}
	return n
}

// Changed is closed at the next log line or event: a test's own loop
// waits on it beside what else it watches.
func (g *Guard) Changed() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// Exited is closed when the guard has exited and both of its streams
// were read to the end.
func (g *Guard) Exited() <-chan struct{} { return g.exited }

// Code is the guard's exit code (valid once Exited is closed).
func (g *Guard) Code() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.code
}

// The pace at which a wait also looks at what is not in the streams (a
// file the guard writes, a process): each new line or event wakes it too.
const lookEvery = 10 * time.Millisecond

// Until waits until cond holds. It looks at each new log line and event,
// and every 10 ms for what is not in them. It fails the test when the
// guard exits first (cond then sees everything the guard wrote) or when
// bound passes: a bound, not a measurement.
func (g *Guard) Until(what string, bound time.Duration, cond func() bool) {
	g.t.Helper()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	look := time.NewTicker(lookEvery)
	defer look.Stop()
	for {
		changed := g.Changed()
		gone := false
		select {
		case <-g.exited:
			gone = true
		default:
		}
		if cond() {
			return
		}
		if gone {
			g.fail("guard exited (code %d) before %s", g.Code(), what)
		}
		select {
		case <-changed:
		case <-g.exited:
		case <-look.C:
		case <-deadline.C:
			if cond() {
				return
			}
			g.fail("timed out after %s waiting for %s", bound, what)
		}
	}
}

func (g *Guard) fail(format string, args ...any) {
	g.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if g.Explain != nil {
		msg += "\n" + g.Explain()
	}
	g.t.Fatal(msg)
}

// WaitEvent waits until n events match, and returns the n-th.
func (g *Guard) WaitEvent(what string, n int, bound time.Duration, match func(events.Event) bool) events.Event {
	g.t.Helper()
	return waitNth(g, what, n, bound, g.Events, match)
}

// WaitLog waits until n log entries match, and returns the n-th.
func (g *Guard) WaitLog(what string, n int, bound time.Duration, match func(map[string]any) bool) map[string]any {
	g.t.Helper()
	return waitNth(g, what, n, bound, g.Logs, match)
}

// waitNth waits until n of what list returns match, and returns the n-th.
func waitNth[T any](g *Guard, what string, n int, bound time.Duration, list func() []T, match func(T) bool) T {
	g.t.Helper()
	var nth T
	g.Until(what, bound, func() bool {
		found := 0
		for _, x := range list() {
			if match(x) {
				if found++; found == n {
					nth = x
					return true
				}
			}
		}
		return false
	})
	return nth
}

// WaitExit waits for the guard to exit and returns its code.
func (g *Guard) WaitExit(bound time.Duration) int {
	g.t.Helper()
	select {
	case <-g.exited:
		return g.Code()
	case <-time.After(bound):
		g.t.Fatalf("guard did not exit within %s", bound)
		return -1
	}
}

// Signal sends sig to the guard.
func (g *Guard) Signal(sig syscall.Signal) {
	g.t.Helper()
	if err := g.Cmd.Process.Signal(sig); err != nil {
		g.t.Fatal(err)
	}
}

// Stop ends the guard if it still runs: SIGTERM, then SIGKILL when it has
// not exited within bound. It returns once the guard has exited and its
// streams are read (a test's cleanup; it never fails the test).
func (g *Guard) Stop(bound time.Duration) {
	select {
	case <-g.exited:
		return
	default:
	}
	_ = g.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(bound):
		_ = g.Cmd.Process.Kill()
		<-g.exited
	}
}

// Event matchers, shared by both scenes.

// OfKind matches the events of kind k.
func OfKind(k events.Kind) func(events.Event) bool {
	return func(e events.Event) bool { return e.Kind == k }
}

// InState matches the change into state st.
func InState(st string) func(events.Event) bool {
	return func(e events.Event) bool { return e.Kind == events.KindState && e.State == st }
}

// ExitedWith matches an exit whose verdict is cause.
func ExitedWith(cause string) func(events.Event) bool {
	return func(e events.Event) bool {
		return e.Kind == events.KindExited && e.Failure != nil && string(e.Failure.Verdict.Cause) == cause
	}
}

// Decided matches a decision event naming d.
func Decided(d string) func(events.Event) bool {
	return func(e events.Event) bool { return e.Kind == events.KindDecision && e.Decision == d }
}

// After matches what match matches, later in the stream than e.
func After(e events.Event, match func(events.Event) bool) func(events.Event) bool {
	return func(x events.Event) bool { return x.Seq > e.Seq && match(x) }
}

// CauseOf is an exit's cause ("" when the event carries no verdict).
func CauseOf(e events.Event) string {
	if e.Failure == nil {
		return ""
	}
	return string(e.Failure.Verdict.Cause)
}
