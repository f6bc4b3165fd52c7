package guardrun

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// bound ends a test that would never pass; nothing here is timed.
const bound = 30 * time.Second

// sh starts a stand-in guard: a shell script with the event stream on
// fd 3, as the real guard's `--events /dev/fd/3`.
func sh(t testing.TB, script string) *Guard {
	t.Helper()
	g := Start(t, Spec{Argv: []string{"/bin/sh", "-c", script}, Env: os.Environ()})
	t.Cleanup(func() { g.Stop(bound) })
	return g
}

// A log line, a line that is not JSON and two events reach the test in
// order; the exit code is there once both streams were read to the end.
func TestStreamsAreReadToTheEnd(t *testing.T) {
	g := sh(t, `echo '{"msg":"starting vLLM"}' >&2
echo 'not json' >&2
echo '{"seq":1,"kind":"state","state":"starting"}' >&3
echo '{"seq":2,"kind":"ready"}' >&3
exit 3`)
	if code := g.WaitExit(bound); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
	if raw := g.Raw(); len(raw) != 2 || raw[1] != "not json" {
		t.Errorf("raw lines %q, want both lines", raw)
	}
	if logs := g.Logs(); len(logs) != 1 || logs[0]["msg"] != "starting vLLM" {
		t.Errorf("JSON entries %v, want the one", logs)
	}
	if e := g.WaitEvent("ready", 1, bound, OfKind(events.KindReady)); e.Seq != 2 {
		t.Errorf("ready event %+v, want seq 2", e)
	}
	if n := g.CountEvents(InState("starting")); n != 1 {
		t.Errorf("%d changes into starting, want 1", n)
	}
	if n := g.CountLogs(func(m map[string]any) bool { return m["msg"] == "starting vLLM" }); n != 1 {
		t.Errorf("%d matching log entries, want 1", n)
	}
}

// A wait wakes on the line it waits for: the stand-in writes it only
// after the test has seen a first one and answered through a file.
func TestWaitLogWakesOnTheLine(t *testing.T) {
	dir := t.TempDir()
	g := sh(t, fmt.Sprintf(`echo '{"msg":"first"}' >&2
while [ ! -e %s/go ]; do sleep 0.01; done
echo '{"msg":"second"}' >&2
exec sleep 1000`, dir))
	g.WaitLog("the first line", 1, bound, func(m map[string]any) bool { return m["msg"] == "first" })
	if err := os.WriteFile(dir+"/go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m := g.WaitLog("the second line", 1, bound, func(m map[string]any) bool { return m["msg"] == "second" })
	if m["msg"] != "second" {
		t.Fatalf("got %v", m)
	}
}

// fakeTB records a wait's failure instead of ending the test.
type fakeTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatal(args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprint(args...)
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(format string, args ...any) { f.Fatal(fmt.Sprintf(format, args...)) }

// A wait for what never comes fails as soon as the guard has exited,
// saying so with its code and with the scene's own explanation.
func TestUntilFailsWhenTheGuardExitsFirst(t *testing.T) {
	g := sh(t, `exit 4`)
	ft := &fakeTB{TB: t}
	g.t = ft
	g.Explain = func() string { return "vLLM printed nothing" }
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Until("a thing that never comes", bound, func() bool { return false })
	}()
	<-done
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if !strings.Contains(ft.msg, "guard exited (code 4) before a thing that never comes") || !strings.Contains(ft.msg, "vLLM printed nothing") {
		t.Fatalf("failure %q, want the exit, its code and the explanation", ft.msg)
	}
}

// Stop kills a guard that ignores SIGTERM once its bound has passed.
func TestStopKillsAGuardThatIgnoresSIGTERM(t *testing.T) {
	g := sh(t, `trap '' TERM
echo '{"msg":"SIGTERM ignored"}' >&2
exec sleep 1000`)
	g.WaitLog("the trap set", 1, bound, func(m map[string]any) bool { return m["msg"] == "SIGTERM ignored" })
	g.Stop(10 * time.Millisecond)
	ws := g.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the guard ended with %v, want SIGKILL", ws)
	}
}
