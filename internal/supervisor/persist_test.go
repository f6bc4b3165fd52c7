package supervisor

import (
	"reflect"
	"sync"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// READY does not wait for the state file (issue 24 item 12). Saving the
// policy's state is two fsyncs; the loop saved before it published ready,
// so on a disk with 40 ms fsyncs READY=1 came ~80 ms after vLLM answered.
// Here the save at ready does not finish until the test lets it: vLLM is
// ready and the event is out meanwhile, and Run writes that state before
// it returns.
func TestMachineReadyDoesNotWaitForTheStateFile(t *testing.T) {
	runScenario(t, nil, func(t *testing.T, s *scenario) {
		release := make(chan struct{})
		var mu sync.Mutex
		var saved []policy.State
		s.persist = func(st policy.State) {
			mu.Lock()
			n := len(saved)
			mu.Unlock()
			if n >= 1 { // the launch's save went through; later ones wait
				<-release
			}
			mu.Lock()
			saved = append(saved, st)
			mu.Unlock()
		}
		s.start()
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		s.ready() // fails when the loop is stuck in the save
		if n := len(s.kinds(events.KindReady)); n != 1 {
			t.Fatalf("%d ready events while the state file is being written, want 1", n)
		}
		close(release)
		s.wantStopped(0, "the stop")
		mu.Lock()
		defer mu.Unlock()
		if len(saved) < 2 || !reflect.DeepEqual(saved[len(saved)-1], s.sup.pol.State()) {
			t.Fatalf("saved %d states before Run returned; want the launch's, and the newest last", len(saved))
		}
	})
}
