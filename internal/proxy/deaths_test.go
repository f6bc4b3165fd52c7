package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// deathVLLM answers nothing until the test kills it: each request in flight
// then loses its connection (a stream after its first token). Once
// restarted it answers everything.
type deathVLLM struct {
	inflight  chan string // a request reached vLLM (its kind)
	died      chan struct{}
	restarted atomic.Bool
}

func (v *deathVLLM) handler(w http.ResponseWriter, req *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(req.Body).Decode(&body)
	stream := body["stream"] == true
	if v.restarted.Load() {
		switch {
		case req.URL.Path == "/v1/embeddings":
			io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}`)
		case stream:
			// The continuation: its prompt is the prompt's ids and the one
			// delivered.
			if fmt.Sprint(body["prompt"]) != "[1 2 5]" {
				http.Error(w, fmt.Sprintf("continuation prompt %v, want [1 2 5]", body["prompt"]), 400)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"id":"cmpl-9","object":"text_completion","created":2,"model":"m","choices":[{"index":0,"text":"b","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[6]}]}`+"\n\ndata: [DONE]\n\n")
		default:
			io.WriteString(w, `{"id":"cmpl-2","object":"text_completion","choices":[{"index":0,"text":"replayed","finish_reason":"length"}]}`)
		}
		return
	}
	kind := "non-streaming"
	if stream {
		kind = "stream"
		if body["n"] == 2.0 {
			kind = "n=2 stream"
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[5],"prompt_token_ids":[1,2]}]}`+"\n\n")
		w.(http.Flusher).Flush()
	}
	v.inflight <- kind
	<-v.died
	killConn(w)
}

// One death touches a stream that had its first token (continued), a
// non-streaming request (replayed), a stream of n = 2 (not resumed: n) and
// a request that arrives while vLLM reloads (served after the hold): the
// account handed over says so, per kind, once the last of them has
// finished and not before.
func TestDeathAccountPerKind(t *testing.T) {
	v := &deathVLLM{inflight: make(chan string, 8), died: make(chan struct{})}
	r, _ := newHoldRig(t, proxyConfig(), 8, v.handler)
	handed := make(chan handover, 4)
	r.p.SetOnDeathRequests(func(id uint64, req state.DeathRequests) { handed <- handover{id, req} })

	stream := r.send("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,"stream":true}`)
	nonStreaming := r.send("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2}`)
	n2 := r.send("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,"n":2,"stream":true}`)
	seen := map[string]bool{}
	for range 3 {
		seen[<-v.inflight] = true
	}
	if len(seen) != 3 {
		t.Fatalf("requests in flight at vLLM: %v", seen)
	}

	// vLLM dies: the guard sees it go and records the failure; the
	// connections close.
	r.setReady(false)
	death := r.p.Died()
	close(v.died)
	if got := <-n2; got.code != 200 || !strings.Contains(got.body, `"error"`) {
		t.Fatalf("the n = 2 stream: %d %q; want the error event", got.code, got.body)
	}
	arrival := r.send("/v1/embeddings", `{"model":"m","input":"x"}`)
	testkit.WaitFor(t, "the stream, the non-streaming request and the arrival held", 30*time.Second, func() bool { return r.p.Stats().Held == 3 })
	select {
	case h := <-handed:
		t.Fatalf("account handed over while requests were still held: %+v", h)
	default:
	}

	v.restarted.Store(true)
	r.setReady(true)
	for name, ch := range map[string]<-chan result{"stream": stream, "non-streaming": nonStreaming, "arrival": arrival} {
		got := <-ch
		if got.code != 200 || strings.Contains(got.body, `"error"`) {
			t.Errorf("%s: %d %q; want an answer", name, got.code, got.body)
		}
	}
	h := <-handed
	want := state.DeathRequests{
		RequestOutcomes:  state.RequestOutcomes{Touched: 4, Continued: 1, Replayed: 1, ServedAfterHold: 1, NotResumed: map[string]int{"n": 1}},
		Streams:          &state.RequestOutcomes{Touched: 2, Continued: 1, NotResumed: map[string]int{"n": 1}},
		NonStreaming:     &state.RequestOutcomes{Touched: 1, Replayed: 1},
		ArrivedWhileDown: &state.RequestOutcomes{Touched: 1, ServedAfterHold: 1},
	}
	if h.id != death || !reflect.DeepEqual(h.req, want) {
		got, _ := json.Marshal(h.req)
		exp, _ := json.Marshal(want)
		t.Fatalf("death %d's account:\n got %s\nwant %s (death %d)", h.id, got, exp, death)
	}
	select {
	case h := <-handed:
		t.Fatalf("a second account: %+v", h)
	default:
	}
}

// vLLM dies again while it reloads, then the guard stops: each death's
// account is handed over then, with the request still held as pending and
// why; the held request is in both (the second death kept it away too),
// and its end after the stop changes neither.
func TestDeathAccountAtNextDeathAndStop(t *testing.T) {
	r, _ := newHoldRig(t, proxyConfig(), 8, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	handed := make(chan handover, 4)
	r.p.SetOnDeathRequests(func(id uint64, req state.DeathRequests) { handed <- handover{id, req} })
	r.setReady(false)
	first := r.p.Died()
	held := r.send("/v1/completions", `{"model":"m","prompt":"hi"}`)
	testkit.WaitFor(t, "the request held", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
	second := r.p.Died()
	pending := func(at string) state.DeathRequests {
		return state.DeathRequests{RequestOutcomes: state.RequestOutcomes{Touched: 1, Pending: 1},
			ArrivedWhileDown: &state.RequestOutcomes{Touched: 1, Pending: 1}, UnfinishedAt: at}
	}
	if h := <-handed; h.id != first || !reflect.DeepEqual(h.req, pending(UnfinishedNextDeath)) {
		t.Fatalf("at the second death: death %d's account %+v; want death %d's, the held request pending", h.id, h.req, first)
	}
	r.p.Stopping()
	if h := <-handed; h.id != second || !reflect.DeepEqual(h.req, pending(UnfinishedGuardStop)) {
		t.Fatalf("at the stop: death %d's account %+v; want death %d's, the held request pending", h.id, h.req, second)
	}
	if got := <-held; got.code != http.StatusServiceUnavailable {
		t.Fatalf("the held request at the stop: %d %q; want 503", got.code, got.body)
	}
	select {
	case h := <-handed:
		t.Fatalf("an account after the stop: %+v", h)
	default:
	}
}

// A loss of vLLM the guard never records as a death (a planned restart, the
// first load) gives no account, and does not leak into the next death's.
func TestNoAccountWithoutADeath(t *testing.T) {
	r, _ := newHoldRig(t, proxyConfig(), 8, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	handed := make(chan handover, 4)
	r.p.SetOnDeathRequests(func(id uint64, req state.DeathRequests) { handed <- handover{id, req} })
	r.setReady(false)
	held := r.send("/v1/completions", `{"model":"m","prompt":"hi"}`)
	testkit.WaitFor(t, "the request held", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
	r.setReady(true)
	if got := <-held; got.code != 200 {
		t.Fatalf("held request: %d %q", got.code, got.body)
	}
	r.setReady(false)
	death := r.p.Died()
	r.setReady(true)
	if h := <-handed; h.id != death || h.req.Touched != 0 || h.req.Pending != 0 {
		t.Fatalf("the death's account %+v (death %d); want death %d's, touching nothing", h.req, h.id, death)
	}
}
