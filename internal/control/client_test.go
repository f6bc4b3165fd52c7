package control

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

func TestClient(t *testing.T) {
	b := newFakeBackend(status.StateReady)
	b.incs = []state.Incident{{ID: "x", Cause: "oom", Summary: "out of memory"}}
	_, path := startSocket(t, b, nil)
	c := NewClient(path)
	defer c.CloseIdleConnections()
	ctx := context.Background()

	d, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := fixtureDoc()
	if !d.Now.Equal(want.Now) || d.Guard.Rung != want.Guard.Rung || d.Guard.Restarts["oom"] != 1 ||
		len(d.GPU.Devices[1].History) != 600 || d.VLLM.Running != 12 || len(d.Alerts) != 2 ||
		d.LastIncident == nil || d.LastIncident.Delay != want.LastIncident.Delay {
		t.Errorf("status over the socket lost data: %+v", d)
	}
	incs, err := c.Incidents(ctx, 5)
	if err != nil || len(incs) != 1 || incs[0].Summary != "out of memory" {
		t.Errorf("Incidents: %v %+v", err, incs)
	}
	b.mu.Lock()
	b.actionErr = errors.New("the guard is stopping")
	b.mu.Unlock()
	err = c.Restart(ctx)
	if err == nil || errors.Is(err, ErrNoGuard) || !strings.Contains(err.Error(), "the guard is stopping (HTTP 409)") {
		t.Errorf("refused restart: %v", err)
	}
}

func TestClientNoGuard(t *testing.T) {
	dir := shortDir(t)
	missing := filepath.Join(dir, "guard.sock")
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()

	for _, path := range []string{missing, stale} {
		c := NewClient(path)
		_, err := c.Status(context.Background())
		if !errors.Is(err, ErrNoGuard) {
			t.Errorf("%s: %v; want ErrNoGuard", path, err)
		}
		if err == nil || !strings.HasPrefix(err.Error(), "no vllm-guard answers on "+path+": is it running? (connect: ") {
			t.Errorf("%s: message %q", path, err)
		}
		for _, f := range []func(context.Context) error{c.Restart, c.ResetProfile} {
			if err := f(context.Background()); !errors.Is(err, ErrNoGuard) {
				t.Errorf("%s: action: %v; want ErrNoGuard", path, err)
			}
		}
		if _, err := c.Incidents(context.Background(), 1); !errors.Is(err, ErrNoGuard) {
			t.Errorf("%s: incidents: %v; want ErrNoGuard", path, err)
		}
	}
	_ = os.Remove(stale)
}
