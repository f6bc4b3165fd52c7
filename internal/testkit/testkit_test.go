package testkit

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { Main(m) }

// fakeTB records the failure WaitFor reports instead of ending the test.
type fakeTB struct {
	testing.TB
	failure string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	f := &fakeTB{}
	WaitFor(f, "the fifth look", 30*time.Second, func() bool { calls++; return calls == 5 })
	if f.failure != "" || calls != 5 {
		t.Fatalf("failure %q after %d looks; want none after 5", f.failure, calls)
	}
}

func TestWaitForFailsWhenTheBoundPasses(t *testing.T) {
	f := &fakeTB{}
	start := time.Now()
	calls := 0
	WaitFor(f, "nothing", 20*time.Millisecond, func() bool { calls++; return false })
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Errorf("gave up after %s, before the bound", took)
	}
	if want := "timed out after 20ms waiting for nothing"; f.failure != want {
		t.Errorf("failure %q, want %q", f.failure, want)
	}
	if calls < 1 {
		t.Error("gave up without looking")
	}
}

// The pace backs off from a millisecond but never beyond maxPause.
func TestPollPace(t *testing.T) {
	var at []time.Time
	Poll(30*time.Second, func() bool { at = append(at, time.Now()); return len(at) == 60 })
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < firstPause {
			t.Fatalf("look %d came %s after the previous one; want at least %s", i, gap, firstPause)
		}
	}
}

// PollEvery looks no faster than its pace.
func TestPollEveryPace(t *testing.T) {
	const pause = 5 * time.Millisecond
	var at []time.Time
	if !PollEvery(30*time.Second, pause, func() bool { at = append(at, time.Now()); return len(at) == 10 }) {
		t.Fatal("PollEvery gave up before the condition held")
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < pause {
			t.Fatalf("look %d came %s after the previous one; want at least %s", i, gap, pause)
		}
	}
}

type fakeM struct {
	code int
	run  func()
}

func (m fakeM) Run() int {
	if m.run != nil {
		m.run()
	}
	return m.code
}

func blockOn(ch chan struct{}) { <-ch }

func TestRunFailsALeakAfterPassingTests(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	cleaned := false
	var stderr bytes.Buffer
	code := run(fakeM{run: func() { go blockOn(release) }}, func() { cleaned = true }, &stderr, nil)
	if code != 1 || !strings.Contains(stderr.String(), "goleak") || !strings.Contains(stderr.String(), "blockOn") {
		t.Errorf("exit %d, stderr %q; want 1 and the leaked goroutine named", code, stderr.String())
	}
	if !cleaned {
		t.Error("cleanup did not run")
	}
}

func TestRunKeepsTheTestsFailure(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	cleaned := false
	var stderr bytes.Buffer
	code := run(fakeM{code: 3, run: func() { go blockOn(release) }}, func() { cleaned = true }, &stderr, nil)
	if code != 3 || stderr.Len() != 0 || !cleaned {
		t.Errorf("exit %d, stderr %q, cleaned %v; want the tests' 3, no leak report, cleaned", code, stderr.String(), cleaned)
	}
}

func TestRunPassesTheOptions(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var stderr bytes.Buffer
	code := run(fakeM{run: func() { go blockOn(release) }}, nil, &stderr,
		[]goleak.Option{goleak.IgnoreAnyFunction("github.com/vllm-guard/vllm-guard/internal/testkit.blockOn")})
	if code != 0 {
		t.Errorf("exit %d, stderr %q; want 0 with the goroutine ignored", code, stderr.String())
	}
}
