package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// helperEnv makes the test binary a client that asks the guard on the
// named socket for its status and exits: the second-uid test runs it as
// another user.
const helperEnv = "VLLM_GUARD_CONTROL_TEST_STATUS"

// Exit codes of the helper.
const (
	helperOK     = 0
	helperDenied = 13
	helperOther  = 3
)

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		os.Exit(statusHelper(path))
	}
	if path := os.Getenv(impostorEnv); path != "" {
		os.Exit(serveImpostor(path))
	}
	if path := os.Getenv(guardEnv); path != "" {
		os.Exit(serveGuard(path))
	}
	testkit.Main(m)
}

func statusHelper(path string) int {
	c := NewClient(path)
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Status(ctx)
	switch {
	case err == nil:
		fmt.Println("ok")
		return helperOK
	case errors.Is(err, syscall.EACCES):
		fmt.Println(err)
		return helperDenied
	default:
		fmt.Println(err)
		return helperOther
	}
}

// fakeBackend records what the control API asked of it.
type fakeBackend struct {
	mu        sync.Mutex
	doc       Doc
	incs      []state.Incident
	incErr    error
	actionErr error
	restarts  []string // peers that asked
	resets    []string
	lastN     int
	alive     bool
	why       string
}

func newFakeBackend(st status.State) *fakeBackend {
	d := fixtureDoc()
	d.Guard.State = st
	if st != status.StateReady {
		d.Guard.Reason = "loading: probe refused"
	}
	return &fakeBackend{doc: d, alive: true}
}

func (f *fakeBackend) Doc() Doc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.doc
}

func (f *fakeBackend) setState(st status.State, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.doc.Guard.State, f.doc.Guard.Reason = st, reason
}

func (f *fakeBackend) Restart(_ context.Context, peer string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.actionErr != nil {
		return f.actionErr
	}
	f.restarts = append(f.restarts, peer)
	return nil
}

func (f *fakeBackend) ResetProfile(_ context.Context, peer string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.actionErr != nil {
		return f.actionErr
	}
	f.resets = append(f.resets, peer)
	return nil
}

func (f *fakeBackend) Incidents(n int, each func(state.Incident) error) error {
	f.mu.Lock()
	f.lastN = n
	if f.incErr != nil {
		f.mu.Unlock()
		return f.incErr
	}
	out := f.incs
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	f.mu.Unlock()
	for _, inc := range out {
		if err := each(inc); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeBackend) Alive() (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alive, f.why
}

// shortDir is a temp folder with a path short enough for a unix socket
// (t.TempDir() paths can pass the 107-byte limit).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "vg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
