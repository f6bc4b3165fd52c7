package main

import (
	"context"
	"sync"
)

// scheduler admits requests: at most max run at once, the rest wait FIFO.
// It keeps the counts vLLM exports and that drive the memory model.
type scheduler struct {
	mu       sync.Mutex
	max      int
	running  int
	queue    []*ticket
	admitted int   // prompt tokens of running + waiting requests
	kvInUse  int64 // prompt + generated tokens of running requests
	prompts  int64 // vllm:prompt_tokens_total
	gens     int64 // vllm:generation_tokens_total
	// vllm:request_prompt_tokens: the prompt size of each finished
	// request that was prefilled (size → requests), and their sum.
	finishedPrompts map[int]int64
	finishedSum     int64
	changed         chan struct{}
}

type ticket struct {
	prompt  int
	granted bool
	ch      chan struct{}
}

type schedSnapshot struct {
	Running, Waiting, AdmittedPrompt int
	KVInUse, PromptTotal, GenTotal   int64
}

func newScheduler(max int) *scheduler {
	return &scheduler{max: max, changed: make(chan struct{}, 1), finishedPrompts: map[int]int64{}}
}

func (s *scheduler) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// admit waits for a slot. On a nil error the caller must call finish.
func (s *scheduler) admit(ctx context.Context, prompt int) error {
	s.mu.Lock()
	s.admitted += prompt
	if s.running < s.max && len(s.queue) == 0 {
		s.startLocked(prompt)
		s.mu.Unlock()
		s.notify()
		return nil
	}
	t := &ticket{prompt: prompt, ch: make(chan struct{})}
	s.queue = append(s.queue, t)
	s.mu.Unlock()
	s.notify()
	select {
	case <-t.ch:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if t.granted {
		// Granted while the client left: give the slot back.
		s.mu.Unlock()
		s.finish(prompt, 0)
		return ctx.Err()
	}
	for i, q := range s.queue {
		if q == t {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			break
		}
	}
	s.admitted -= prompt
	s.mu.Unlock()
	s.notify()
	return ctx.Err()
}

func (s *scheduler) startLocked(prompt int) {
	s.running++
	s.kvInUse += int64(prompt)
}

// prefilled counts a running request's prompt as processed (vLLM counts
// prompt tokens when the engine has run the prefill: a wedged engine
// admits requests but never advances the counter).
func (s *scheduler) prefilled(prompt int) {
	s.mu.Lock()
	s.prompts += int64(prompt)
	s.mu.Unlock()
}

// finish releases a running request's slot and starts the next waiter.
func (s *scheduler) finish(prompt, generated int) {
	s.mu.Lock()
	s.running--
	s.admitted -= prompt
	s.kvInUse -= int64(prompt + generated)
	for s.running < s.max && len(s.queue) > 0 {
		t := s.queue[0]
		s.queue = s.queue[1:]
		t.granted = true
		s.startLocked(t.prompt)
		close(t.ch)
	}
	s.mu.Unlock()
	s.notify()
}

// requestFinished records a prefilled request's prompt when it ends, as
// vLLM observes vllm:request_prompt_tokens for each finished request.
func (s *scheduler) requestFinished(prompt int) {
	s.mu.Lock()
	s.finishedPrompts[prompt]++
	s.finishedSum += int64(prompt)
	s.mu.Unlock()
}

// promptHistogram is vllm:request_prompt_tokens: for each bound the
// finished requests whose prompt was at most that many tokens, then the
// count and the sum of their prompts.
func (s *scheduler) promptHistogram(bounds []int) (cumulative []int64, count, sum int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cumulative = make([]int64, len(bounds))
	for size, n := range s.finishedPrompts {
		count += n
		for i, b := range bounds {
			if size <= b {
				cumulative[i] += n
			}
		}
	}
	return cumulative, count, s.finishedSum
}

// bucketsOneTwoFive are vLLM's histogram bounds for token counts: 1, 2, 5,
// 10, 20, 50, … up to max (its build_1_2_5_buckets).
func bucketsOneTwoFive(max int) []int {
	var out []int
	for exp := 1; ; exp *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*exp > max {
				return out
			}
			out = append(out, m*exp)
		}
	}
}

func (s *scheduler) generated(n int) {
	s.mu.Lock()
	s.gens += int64(n)
	s.kvInUse += int64(n)
	s.mu.Unlock()
}

func (s *scheduler) snapshot() schedSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return schedSnapshot{
		Running: s.running, Waiting: len(s.queue), AdmittedPrompt: s.admitted,
		KVInUse: s.kvInUse, PromptTotal: s.prompts, GenTotal: s.gens,
	}
}
