package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/admission"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// admitterUp is an Upstream that also decides the bound (the guard's role).
type admitterUp struct {
	*fakeUp
	mu sync.Mutex
	b  admission.Bound
}

func (a *admitterUp) Admission() admission.Bound { a.mu.Lock(); defer a.mu.Unlock(); return a.b }

// memoryBound: room for 1 000 MiB; a request costs 1 MiB plus 4 KiB a
// prompt token.
func memoryBound() admission.Bound {
	return admission.Bound{Limit: 100, RoomBytes: 1000 << 20, Bound: admission.BoundMemory, Why: "test",
		Model: admission.CostModel{Confident: true, PerSeq: 1 << 20, PerToken: 4 << 10}}
}

func newAdmissionRig(t *testing.T, b admission.Bound, h http.HandlerFunc) *rig {
	t.Helper()
	r := newRig(t, proxyConfig(), 256, h)
	r.p.up = &admitterUp{fakeUp: r.up, b: b}
	r.p.refresh()
	return r
}

// freeOnFailure lets whatever the gate still holds go when a test ends
// early (a failed test would otherwise wait on the front server's close).
func freeOnFailure(t *testing.T, g *gate) {
	t.Cleanup(func() {
		if t.Failed() {
			for range 10 {
				g.release <- struct{}{}
			}
		}
	})
}

func completion(tokens int) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": strings.Repeat("abcd", tokens)})
	return string(b)
}

func (r *rig) post(ctx context.Context, body string) result {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, hdr: resp.Header, body: string(b), err: err}
}

func (r *rig) goPost(body string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- r.post(context.Background(), body) }()
	return ch
}

func TestPromptTokens(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       float64
	}{
		{"prompt string", `{"prompt": "abcdefgh"}`, 2},
		{"prompt list", `{"prompt": ["abcd", "abcdabcd"]}`, 3},
		{"token ids", `{"prompt": [1, 2, 3, 4, 5]}`, 5},
		{"lists of token ids", `{"prompt": [[1, 2], [3]]}`, 3},
		{"messages", `{"messages": [{"role": "system", "content": "abcd"}, {"role": "user", "content": "abcdabcd"}]}`, 3},
		{"content parts", `{"messages": [{"role": "user", "content": [{"type": "text", "text": "abcdabcd"}, {"type": "image_url", "image_url": {"url": "x"}}]}]}`, 2},
		{"embeddings input", `{"input": "abcdabcdabcd"}`, 3},
		{"runes, not bytes", `{"prompt": "ééééé\u00e9éé"}`, 2},
		{"not JSON: a quarter of its bytes", `not json at all!`, 4},
		{"no prompt", `{"model": "m"}`, 0},
	} {
		if got := PromptTokens([]byte(c.body)); got != c.want {
			t.Errorf("%s: %v tokens, want %v", c.name, got, c.want)
		}
	}
}

// A request that alone would need more than the room is refused at once
// with 413, naming the limit; it is never queued.
func TestRequestTooLargeForMemoryIs413(t *testing.T) {
	g := newGate()
	r := newAdmissionRig(t, memoryBound(), g.handler)
	freeOnFailure(t, g)
	// 1 MiB + 2 000 000 tokens × 4 KiB ≈ 7.6 GiB > 1 000 MiB.
	res := r.post(context.Background(), completion(2_000_000))
	if res.err != nil || res.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("want 413, got %d %q (%v)", res.code, res.body, res.err)
	}
	if !strings.Contains(res.body, "1000 MiB") || !strings.Contains(res.body, "headroom") {
		t.Errorf("the answer does not name the limit: %s", res.body)
	}
	s := r.p.Stats()
	if s.RejectedBy[reasonTooLargeForMemory] != 1 || s.Queued != 0 || g.n() != 0 {
		t.Fatalf("stats %+v, upstream saw %d", s, g.n())
	}
	if got := metricValue(t, r.reg, "vllm_guard_proxy_rejected_total", "reason", reasonTooLargeForMemory); got != 1 {
		t.Errorf("rejected{too_large_for_memory} = %v", got)
	}
}

// Under the memory bound the proxy admits by predicted memory, not count:
// two requests of 400 MiB fit the 1 000 MiB room, a third waits though the
// count limit (100) is far away, and goes once one ends.
func TestAdmissionByPredictedMemory(t *testing.T) {
	g := newGate()
	r := newAdmissionRig(t, memoryBound(), g.handler)
	freeOnFailure(t, g)
	big := completion(100_000) // ≈ 1 MiB + 390.6 MiB
	var done []<-chan result
	for range 3 {
		done = append(done, r.goPost(big))
	}
	testkit.WaitFor(t, "2 upstream, 1 queued", 30*time.Second, func() bool { return g.n() == 2 && r.p.Stats().Queued == 1 })
	s := r.p.Stats()
	if s.Inflight != 2 || s.Bound != admission.BoundMemory || s.MemoryInflightBytes > s.MemoryRoomBytes || s.MemoryInflightBytes < 780<<20 {
		t.Fatalf("stats %+v: want 2 in flight of about 400 MiB each within 1000 MiB, bound memory", s)
	}
	if s.PromptTokensInflight != 2*100_000 {
		t.Errorf("prompt tokens in flight %v, want %d", s.PromptTokensInflight, 2*100_000)
	}
	// Small requests do not jump the queue (FIFO): the big one waits first.
	small := r.goPost(completion(10))
	testkit.WaitFor(t, "the small request queued", 30*time.Second, func() bool { return r.p.Stats().Queued == 2 })
	g.release <- struct{}{}
	testkit.WaitFor(t, "the queued big request and the small one forwarded", 30*time.Second, func() bool { return g.n() == 4 })
	for range 3 {
		g.release <- struct{}{}
	}
	for _, ch := range append(done, small) {
		mustOK(t, <-ch)
	}
	// A slot is given back once the handler returns, which may be after
	// the client has read its answer.
	testkit.WaitFor(t, "every slot given back", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
	if s := r.p.Stats(); s.Inflight != 0 || s.MemoryInflightBytes != 0 || s.PromptTokensInflight != 0 {
		t.Fatalf("after all ended: %+v", s)
	}
	if got := metricValue(t, r.reg, "vllm_guard_proxy_limit_bound", "bound", "memory"); got != 1 {
		t.Errorf("proxy_limit_bound{memory} = %v, want 1", got)
	}
}

// The window the guard's samples read: the fewest and most in flight since
// the last call, and the prompt tokens at the fewest.
func TestWindowReportsTheSpanInFlight(t *testing.T) {
	g := newGate()
	r := newAdmissionRig(t, memoryBound(), g.handler)
	freeOnFailure(t, g)
	r.p.Window() // start a window
	var done []<-chan result
	for i := range 3 {
		done = append(done, r.goPost(completion(100*(i+1))))
	}
	testkit.WaitFor(t, "3 upstream", 30*time.Second, func() bool { return g.n() == 3 })
	w := r.p.Window()
	if w.MinInflight != 0 || w.MaxInflight != 3 || w.MeanTokens != 200 {
		t.Fatalf("window %+v: want 0..3 in flight, 200 tokens a request", w)
	}
	w = r.p.Window()
	if w.MinInflight != 3 || w.MaxInflight != 3 || w.MinTokens != 600 {
		t.Fatalf("held still: %+v, want 3..3 with 600 tokens", w)
	}
	for range 3 {
		g.release <- struct{}{}
	}
	for _, ch := range done {
		mustOK(t, <-ch)
	}
}
