package proxy

import (
	"io"
	"sync"
)

// awaiting is the proxy's own count of the requests it sent to vLLM that
// have had no byte of their answer's body yet: prefilling, queued in the
// engine, or generating a non-streaming answer. vLLM publishes its
// running/waiting gauges only after an engine step and counts prompt
// tokens only when a prefill completes, so an engine that hangs in its
// first step after idle, or one long prefill, shows nothing in vLLM's
// metrics; the supervisor's stuck check reads this count instead.
type awaiting struct {
	mu      sync.Mutex
	pending map[*awaitEntry]struct{}
}

// awaitEntry is one request sent upstream; done is safe to call twice.
type awaitEntry struct {
	a      *awaiting
	tokens float64 // the request's estimated prompt tokens
}

func (a *awaiting) add(tokens float64) *awaitEntry {
	e := &awaitEntry{a: a, tokens: tokens}
	a.mu.Lock()
	if a.pending == nil {
		a.pending = map[*awaitEntry]struct{}{}
	}
	a.pending[e] = struct{}{}
	a.mu.Unlock()
	return e
}

func (e *awaitEntry) done() {
	e.a.mu.Lock()
	delete(e.a.pending, e)
	e.a.mu.Unlock()
}

// snapshot is how many requests await their first byte and the largest
// prompt among them.
func (a *awaiting) snapshot() (requests int, largestPrompt float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for e := range a.pending {
		largestPrompt = max(largestPrompt, e.tokens)
	}
	return len(a.pending), largestPrompt
}

// firstByteBody ends its request's wait at the first byte of the body, at
// its end (an empty body) or when it is closed unread.
type firstByteBody struct {
	io.ReadCloser
	e *awaitEntry
}

func (b *firstByteBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 || err != nil {
		b.e.done()
	}
	return n, err
}

func (b *firstByteBody) Close() error {
	b.e.done()
	return b.ReadCloser.Close()
}

// Awaiting is how many requests the proxy sent to vLLM that have had no
// byte of their answer yet, and the largest estimated prompt (tokens)
// among them. The supervisor's stuck check counts them as work in flight
// and allows the largest prompt time to prefill.
func (p *Proxy) Awaiting() (requests int, largestPrompt float64) { return p.await.snapshot() }
