package integration

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// 200 operators ask for the status at once, each on its own connection,
// and one of them asks for a restart halfway through: every status is
// answered with a whole document, and vLLM restarts exactly once.
func TestConcurrentOperatorsOneRestart(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.start()
	s.WaitEvent("ready", 1, 30*time.Second, isReady)

	const clients = 200
	var (
		wg       sync.WaitGroup
		answered atomic.Int32
		half     = make(chan struct{})
		once     sync.Once
		mu       sync.Mutex
		errs     []error
	)
	restartErr := make(chan error, 1)
	go func() {
		<-half
		c := control.NewClient(s.socket())
		defer c.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		restartErr <- c.Restart(ctx)
	}()
	start := make(chan struct{})
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := control.NewClient(s.socket())
			defer c.CloseIdleConnections()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, err := c.Status(ctx)
			if err == nil && !slices.Contains(status.States, d.Guard.State) {
				err = &badState{string(d.Guard.State)}
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			if answered.Add(1) == clients/2 {
				once.Do(func() { close(half) })
			}
		}()
	}
	close(start)
	wg.Wait()
	once.Do(func() { close(half) }) // the restart is asked even if half failed
	for _, err := range errs[:min(len(errs), 5)] {
		t.Errorf("status: %v", err)
	}
	if n := answered.Load(); n != clients {
		t.Fatalf("%d of %d status requests answered", n, clients)
	}
	if err := <-restartErr; err != nil {
		t.Fatalf("restart: %v", err)
	}
	s.WaitEvent("ready after the restart", 2, 30*time.Second, isReady)
	if n := s.CountEvents(decided(events.DecisionRestart)); n != 1 {
		t.Fatalf("%d restarts accepted, want 1", n)
	}
	if n := s.CountEvents(isStarting); n != 2 {
		t.Fatalf("%d launches, want 2", n)
	}
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("an operator's restart was logged as %d failures", n)
	}
}

type badState struct{ state string }

func (e *badState) Error() string { return "status names an unknown state " + e.state }
