package supervisor

import "github.com/vllm-guard/vllm-guard/internal/policy"

// policyWriter saves the policy's state off the machine's goroutine. A
// save is a temp file, two fsyncs and a rename: tens of milliseconds on a
// slow or network disk, and the loop must not wait on it (it did, before
// publishing ready: READY=1 came ~80 ms after vLLM answered, with 40 ms
// fsyncs). Only the newest state matters, so an older one not yet written
// is replaced; Run flushes the last one before it returns.
type policyWriter struct {
	next chan policy.State // the newest state not yet written (at most one)
	quit chan struct{}
	done chan struct{}
}

// startPolicyWriter starts the writer for one Run.
func (s *Supervisor) startPolicyWriter() {
	w := &policyWriter{next: make(chan policy.State, 1), quit: make(chan struct{}), done: make(chan struct{})}
	s.writer = w
	go func() {
		defer close(w.done)
		for {
			select {
			case st := <-w.next:
				s.persist(st)
			case <-w.quit:
				select {
				case st := <-w.next:
					s.persist(st)
				default:
				}
				return
			}
		}
	}()
}

// stopPolicyWriter writes the state still pending and waits for the writer.
func (s *Supervisor) stopPolicyWriter() {
	close(s.writer.quit)
	<-s.writer.done
	s.writer = nil
}

// savePolicy hands the policy's state to the writer (the machine's
// goroutine is the only caller, so the replace below cannot race another
// sender); outside Run it saves at once.
func (s *Supervisor) savePolicy() {
	var st policy.State
	s.withPolicy(func(p *policy.Policy) { st = p.State() })
	w := s.writer
	if w == nil {
		s.persist(st)
		return
	}
	select {
	case <-w.next: // not written yet: the newer state replaces it
	default:
	}
	w.next <- st
}
