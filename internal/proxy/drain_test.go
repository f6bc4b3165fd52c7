package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Merged vLLM's drain (issue 23 item 5): during a planned restart a new
// request is accepted and finished at once with finish_reason "abort" and
// nothing generated (200, no 503); once the engine is gone, 500. The proxy
// holds a request that produced nothing and sends it again, body and all,
// once vLLM is back; one that produced tokens is passed on, never sent
// again.
func TestPlannedRestartResendsOnlyWhatProducedNothing(t *testing.T) {
	const (
		emptyAbort     = `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"","finish_reason":"abort"}],"usage":{"prompt_tokens":3,"completion_tokens":0,"total_tokens":3}}`
		emptyChatAbort = `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"abort"}],"usage":{"prompt_tokens":3,"completion_tokens":0}}`
		emptyStream    = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"abort\"}]}\n\ndata: [DONE]\n\n"
		producedAbort  = `{"choices":[{"index":0,"text":"Hello wor","finish_reason":"abort"}],"usage":{"completion_tokens":3}}`
		producedStream = "data: {\"choices\":[{\"index\":0,\"text\":\"Hel\",\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"abort\"}]}\n\ndata: [DONE]\n\n"
		resentAnswer   = `{"choices":[{"index":0,"text":"fresh","finish_reason":"length"}]}`
	)
	for _, tc := range []struct {
		name   string
		status int
		ctype  string
		first  string
		resent bool
	}{
		{"empty aborted completion", 200, "application/json", emptyAbort, true},
		{"empty aborted chat", 200, "application/json", emptyChatAbort, true},
		{"empty aborted stream", 200, "text/event-stream", emptyStream, true},
		{"engine gone: 500", 500, "application/json", `{"error":{"message":"EngineDeadError"}}`, true},
		{"aborted after tokens", 200, "application/json", producedAbort, false},
		{"stream aborted after tokens", 200, "text/event-stream", producedStream, false},
		{"a 503 is vLLM's answer, not a drain", 503, "application/json", `{"error":"busy"}`, false},
	} {
		// One path for planned restarts with resume on or off (issue 30 item 5).
		for _, resume := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/resume=%v", tc.name, resume), func(t *testing.T) {
				var calls atomic.Int32
				var r *rig
				cfg := proxyConfig()
				cfg.Resume = resume
				r = newRig(t, cfg, 4, func(w http.ResponseWriter, req *http.Request) {
					b, _ := io.ReadAll(req.Body)
					if calls.Add(1) == 1 {
						// The planned restart begins: the guard says not
						// ready, and vLLM, draining, answers.
						r.up.set(func(f *fakeUp) { f.ready = false })
						r.p.Notify()
						w.Header().Set("Content-Type", tc.ctype)
						w.WriteHeader(tc.status)
						io.WriteString(w, tc.first)
						return
					}
					if string(b) != `{"prompt":"again"}` {
						t.Errorf("sent again with body %q", b)
					}
					io.WriteString(w, resentAnswer)
				})
				res := make(chan result, 1)
				go func() {
					resp, err := r.client.Post(r.front.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"again"}`))
					if err != nil {
						res <- result{err: err}
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					res <- result{code: resp.StatusCode, body: string(b)}
				}()
				if tc.resent {
					testkit.WaitFor(t, "the request held for vLLM", 30*time.Second, func() bool { return r.p.Stats().UpstreamRetries > 0 })
					r.up.set(func(f *fakeUp) { f.ready = true })
					r.p.Notify()
					got := <-res
					if got.code != 200 || got.body != resentAnswer || calls.Load() != 2 {
						t.Fatalf("%d %q after %d calls (err %v); want the answer to the request sent again", got.code, got.body, calls.Load(), got.err)
					}
					return
				}
				got := <-res
				if got.code != tc.status || got.body != tc.first || calls.Load() != 1 {
					t.Fatalf("%d %q after %d calls (err %v); want vLLM's answer passed on unchanged, sent once", got.code, got.body, calls.Load(), got.err)
				}
			})
		}
	}
}

// FuzzProducedNothing: any answer is judged without panicking, and its
// body reaches the client byte for byte whatever the judgement.
func FuzzProducedNothing(f *testing.F) {
	f.Add("application/json", `{"choices":[{"text":"","finish_reason":"abort"}]}`)
	f.Add("text/event-stream", "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"abort\"}]}\n\ndata: [DONE]\n\n")
	f.Add("text/event-stream", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
	f.Fuzz(func(t *testing.T, ctype, body string) {
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {ctype}}, Body: io.NopCloser(strings.NewReader(body))}
		producedNothing(resp)
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != body {
			t.Fatalf("body %q after judging, want %q (err %v)", b, body, err)
		}
	})
}
