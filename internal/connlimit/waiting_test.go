package connlimit

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
)

// A waiting listener (the control socket's): 40 clients at once over a cap
// of 4, each request held until all have arrived or been queued, are all
// answered; none is refused or evicted mid-request, and never more than 4
// connections are open. Close wakes an Accept waiting for a place.
func TestWaitingListenerAnswersEveryoneWithinTheCap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	inner, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l := NewWaiting(inner, 4)
	var mu sync.Mutex
	most := 0
	release := make(chan struct{})
	inHandler := make(chan struct{}, 100)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			most = max(most, l.Open())
			mu.Unlock()
			inHandler <- struct{}{}
			<-release
			io.WriteString(w, "ok")
		}),
		ConnState: l.ConnState,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	const clients = 40
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	errs := make(chan error, clients)
	for i := range clients {
		go func() {
			resp, err := cl.Get(fmt.Sprintf("http://guard/%d", i))
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(b) != "ok" {
					err = fmt.Errorf("%d %q", resp.StatusCode, b)
				}
			}
			errs <- err
		}()
	}
	// The first 4 are in the handler: every place holds a request.
	for range 4 {
		<-inHandler
	}
	close(release)
	for range clients {
		if err := <-errs; err != nil {
			t.Errorf("a client past the cap: %v; want it answered after waiting", err)
		}
	}
	mu.Lock()
	if most > 4 {
		t.Errorf("%d connections open at once; want at most 4", most)
	}
	mu.Unlock()
	if l.Refused() != 0 {
		t.Errorf("%d refused; a waiting listener refuses none", l.Refused())
	}
	tr.CloseIdleConnections()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Fatalf("Serve: %v", err)
	}

	// An Accept waiting for a place returns once the listener closes.
	inner2, err := net.Listen("unix", filepath.Join(t.TempDir(), "t.sock"))
	if err != nil {
		t.Fatal(err)
	}
	l2 := NewWaiting(inner2, 1)
	held, err := net.Dial("unix", inner2.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	first, err := l2.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	waiting, err := net.Dial("unix", inner2.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := l2.Accept()
		if c != nil {
			c.Close()
		}
		accepted <- err
	}()
	l2.Close()
	if err := <-accepted; err == nil {
		t.Fatal("Accept past the cap returned a connection after Close; want an error")
	}
}
