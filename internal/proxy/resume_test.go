package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// fakeLLM is a vLLM that streams like 0.32.0 with return_token_ids: a
// greedy model whose next token is a function of the whole sequence, so
// that a continuation from a prefix of token ids gives exactly what the
// uninterrupted request would have. Each request takes the next cut the
// test queued: after that many tokens the fake marks vLLM down (the
// supervisor noticing the death) and closes the connection.
type fakeLLM struct {
	t    *testing.T
	r    *rig
	mu   sync.Mutex
	cuts []int // per request in order: tokens before the cut; -1 none
	seen []fakeReq
	// style of the cut: "" a reset, "error" vLLM's engine-failure event,
	// "abort" finish_reason abort (a planned restart's drain ran out),
	// "failover" a reset read only after the guard saw vLLM go and made
	// another ready (a warm standby took over).
	style string
	// merge: two tokens to a chunk, as vLLM sends when its reader falls
	// behind.
	merge bool
}

type fakeReq struct {
	path string
	body map[string]any
}

func fakeText(id int) string { return fmt.Sprintf("w%d ", id) }

// partial: the fake's tokens whose text comes with the next token's, as
// the bytes of a character split over several tokens.
func partial(id int) bool { return id >= 100 && id%5 == 0 }

func nextToken(seq []int) int {
	h := len(seq) * 7
	for i, id := range seq {
		h += (i + 1) * id
	}
	return 100 + h%37
}

func (f *fakeLLM) handler(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/detokenize" {
		http.NotFound(w, req) // (the ledger then keeps to the ids it knows end a character)
		return
	}
	if req.URL.Path == "/v1/models" {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model","max_model_len":200}]}`)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	f.mu.Lock()
	cut := -1
	if len(f.cuts) > 0 {
		cut, f.cuts = f.cuts[0], f.cuts[1:]
	}
	f.seen = append(f.seen, fakeReq{path: req.URL.Path, body: body})
	merge, errStyle := f.merge, f.style == "error"
	f.mu.Unlock()
	chat := req.URL.Path == "/v1/chat/completions"
	var prompt []int
	switch {
	case chat:
		prompt = []int{1, 2}
		for _, m := range body["messages"].([]any) {
			for _, r := range m.(map[string]any)["content"].(string) {
				prompt = append(prompt, int(r))
			}
		}
		prompt = append(prompt, 3)
	default:
		switch p := body["prompt"].(type) {
		case string:
			prompt = []int{1}
			for _, r := range p {
				prompt = append(prompt, int(r))
			}
		case []any:
			for _, x := range p {
				prompt = append(prompt, int(x.(float64)))
			}
		}
	}
	maxTokens := 200 - len(prompt)
	if v, ok := body["max_tokens"].(float64); ok {
		maxTokens = int(v)
	} else if _, set := body["max_tokens"]; !set && !chat {
		maxTokens = 16
	}
	if v, ok := body["max_completion_tokens"].(float64); ok {
		maxTokens = int(v)
	}
	var stops []string
	switch s := body["stop"].(type) {
	case string:
		stops = []string{s}
	case []any:
		for _, x := range s {
			stops = append(stops, x.(string))
		}
	}
	include, _ := body["include_stop_str_in_output"].(bool)
	ids, _ := body["return_token_ids"].(bool)
	so, _ := body["stream_options"].(map[string]any)
	usage := so != nil && so["include_usage"] == true
	hold := 0
	if !include {
		for _, s := range stops {
			hold = max(hold, len(s)-1)
		}
	}

	id, obj := "cmpl-1", "text_completion"
	if chat {
		id, obj = "chatcmpl-1", "chat.completion.chunk"
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	sentAny := false
	send := func(v any) {
		sentAny = true
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		w.(http.Flusher).Flush()
	}
	chunk := func(choice map[string]any) map[string]any {
		return map[string]any{"id": id, "object": obj, "created": 1700000000, "model": "m", "choices": []any{choice}}
	}
	if chat {
		c := chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})
		if ids {
			c["prompt_token_ids"] = prompt
		}
		send(c)
	}
	seq := append([]int(nil), prompt...)
	out, sent, pend := "", 0, ""
	var batchIDs []int
	promptSent := false
	batchText := ""
	if last := prompt[len(prompt)-1]; partial(last) {
		// As vLLM 0.32.0's detokenizer, primed with a prompt that ends
		// inside a character.
		out = "GARBAGE"
	}
	for n := 1; n <= maxTokens; n++ {
		if n-1 == cut {
			choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": "abort", "stop_reason": nil, "token_ids": []int{}}
			if chat {
				choice["delta"] = map[string]any{"content": ""}
			} else {
				choice["text"] = ""
			}
			f.die(w, chunk(choice), sentAny || errStyle)
			return
		}
		tok := nextToken(seq)
		seq = append(seq, tok)
		if partial(tok) && n < maxTokens {
			pend += fakeText(tok) // not a whole character yet: no text
		} else {
			out += pend + fakeText(tok)
			pend = ""
		}
		var finish, stopReason any
		if n == maxTokens {
			finish = "length"
		}
		for _, s := range stops {
			if i := strings.Index(out, s); i >= 0 {
				finish, stopReason = "stop", s
				if include {
					out = out[:i+len(s)]
				} else {
					out = out[:i]
				}
				break
			}
		}
		end := len(out)
		if finish == nil {
			end = max(sent, len(out)-hold)
		}
		batchText += out[sent:end]
		batchIDs = append(batchIDs, tok)
		sent = end
		if merge && n%2 == 1 && finish == nil {
			continue
		}
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish, "stop_reason": stopReason}
		if chat {
			choice["delta"] = map[string]any{"content": batchText}
		} else {
			choice["text"] = batchText
		}
		if ids {
			choice["token_ids"] = batchIDs
			if n <= 2 && !chat && !promptSent {
				choice["prompt_token_ids"] = prompt
				promptSent = true
			}
		}
		batchIDs, batchText = nil, ""
		send(chunk(choice))
		if finish != nil {
			if usage {
				send(map[string]any{"id": id, "object": obj, "created": 1700000000, "model": "m", "choices": []any{},
					"usage": map[string]int{"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}})
			}
			break
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// die marks vLLM down and cuts the stream, as a death does.
func (f *fakeLLM) die(w http.ResponseWriter, abort map[string]any, answered bool) {
	f.mu.Lock()
	style := f.style
	f.mu.Unlock()
	if answered {
		f.r.up.set(func(u *fakeUp) { u.ready = false })
		f.r.p.Notify()
		if style != "abort" {
			f.r.p.Died() // the guard records the failure (an abort is a planned restart's)
		}
		if style == "failover" {
			f.r.up.set(func(u *fakeUp) { u.ready = true })
			f.r.p.Notify()
		}
	}
	// else: a connection closed before any answer, while the guard still
	// calls vLLM ready (it did not notice a death yet): the proxy sends the
	// request again without waiting for the test.
	if style == "abort" {
		b, _ := json.Marshal(abort)
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
		return
	}
	if style == "error" {
		fmt.Fprint(w, `data: {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "param": null, "code": 500}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	if style == "flat-error" {
		fmt.Fprint(w, `data: {"object": "error", "message": "EngineCore encountered an issue.", "type": "InternalServerError", "param": null, "code": 500}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

func (f *fakeLLM) queue(cuts ...int) { f.mu.Lock(); f.cuts = append(f.cuts, cuts...); f.mu.Unlock() }

func (f *fakeLLM) requests() []fakeReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeReq(nil), f.seen...)
}

func newFakeLLM(t *testing.T) *fakeLLM {
	f := &fakeLLM{t: t}
	f.r = newRig(t, proxyConfig(), 8, f.handler)
	return f
}

// streamed is what a client made of a stream.
type streamed struct {
	text      string
	ids       []int
	role      int // role deltas
	finishes  []string
	usage     []map[string]int
	done      int
	errors    int
	comments  int
	ids2      int // chunks carrying token_ids or prompt_token_ids
	idsField  []string
	objects   map[string]bool
	chunkIDs  map[string]bool
	createds  map[float64]bool
	afterDone bool
}

// run posts body and reads the whole stream; onComment is called at the
// first comment of each hold (the test then brings vLLM back).
func (f *fakeLLM) run(path, body string, onComment func()) streamed {
	f.t.Helper()
	resp, err := f.r.client.Post(f.r.front.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		f.t.Fatalf("HTTP %d", resp.StatusCode)
	}
	s := streamed{objects: map[string]bool{}, chunkIDs: map[string]bool{}, createds: map[float64]bool{}}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return s
		}
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, ":") {
			if !strings.Contains(line, "vLLM restarting after") || !strings.HasSuffix(line, "; resuming") {
				f.t.Errorf("comment %q", line)
			}
			s.comments++
			if strings.Contains(line, "the stream was cut") { // a hold's first
				onComment()
			}
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if s.done > 0 {
			s.afterDone = true
		}
		if data == "[DONE]" {
			s.done++
			continue
		}
		var c struct {
			ID             string           `json:"id"`
			Object         string           `json:"object"`
			Created        float64          `json:"created"`
			Error          *json.RawMessage `json:"error"`
			PromptTokenIDs []int            `json:"prompt_token_ids"`
			Choices        []struct {
				Index          int
				Text           *string
				Delta          *struct{ Role, Content *string }
				FinishReason   *string `json:"finish_reason"`
				TokenIDs       []int   `json:"token_ids"`
				PromptTokenIDs []int   `json:"prompt_token_ids"`
			}
			Usage map[string]int
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			f.t.Fatalf("event %q: %v", data, err)
		}
		if c.Error != nil {
			s.errors++
			continue
		}
		s.objects[c.Object] = true
		s.chunkIDs[c.ID] = true
		s.createds[c.Created] = true
		if c.Usage != nil {
			s.usage = append(s.usage, c.Usage)
		}
		if c.PromptTokenIDs != nil {
			s.ids2++
		}
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				f.t.Errorf("choice index %d", ch.Index)
			}
			if ch.Text != nil {
				s.text += *ch.Text
			}
			if ch.Delta != nil {
				if ch.Delta.Role != nil {
					s.role++
				}
				if ch.Delta.Content != nil {
					s.text += *ch.Delta.Content
				}
			}
			if ch.FinishReason != nil {
				s.finishes = append(s.finishes, *ch.FinishReason)
			}
			if ch.TokenIDs != nil || ch.PromptTokenIDs != nil {
				s.ids2++
			}
			s.ids = append(s.ids, ch.TokenIDs...)
		}
	}
}

// bringBack is what a test does at a hold's first comment: vLLM is
// ready again.
func (f *fakeLLM) bringBack() {
	if _, ready := f.r.up.Target(); ready {
		return // never down: a connection closed before any answer, sent again once
	}
	// Once the stream is held (vLLM coming back before the hold began is
	// another case: the guard never saw it down).
	testkit.WaitFor(f.t, "the stream held", 30*time.Second, func() bool { return f.r.p.Stats().Paused > 0 })
	f.r.up.set(func(u *fakeUp) { u.ready = true })
	f.r.p.Notify()
}

func (f *fakeLLM) counter(name, label, value string) float64 {
	f.t.Helper()
	return metricValue(f.t, f.r.reg, name, label, value)
}

var _ = prometheus.NewRegistry

func TestStreamCutContinuesExactly(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		merge            bool
	}{
		{"completions", "/v1/completions", `{"model":"m","temperature":0,"prompt":"hello","max_tokens":24,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, false},
		{"chat", "/v1/chat/completions", `{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":24,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, false},
		{"chat no limit", "/v1/chat/completions", `{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}],"stream":true,"return_token_ids":true}`, false},
		{"completions merged", "/v1/completions", `{"model":"m","temperature":0,"prompt":"hello","max_tokens":24,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, true},
		{"chat merged", "/v1/chat/completions", `{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":24,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeLLM(t)
			f.merge = tc.merge
			want := f.run(tc.path, tc.body, func() { t.Fatal("held without a cut") })
			if len(want.ids) == 0 || want.done != 1 || len(want.finishes) != 1 {
				t.Fatalf("uninterrupted: %+v", want)
			}
			rewound, replayed := 0, 0
			cuts := min(len(want.ids)-1, 30)
			for k := 1; k <= cuts; k++ {
				f.queue(k, -1)
				before := len(f.requests())
				got := f.run(tc.path, tc.body, f.bringBack)
				if fmt.Sprint(got.ids) != fmt.Sprint(want.ids) || got.text != want.text {
					t.Fatalf("cut after %d: ids %v text %q\nwant ids %v text %q", k, got.ids, got.text, want.ids, want.text)
				}
				if got.done != 1 || got.afterDone || got.errors != 0 || fmt.Sprint(got.finishes) != fmt.Sprint(want.finishes) || (got.comments == 0 && !(tc.merge && k == 1)) {
					t.Fatalf("cut after %d: %d [DONE], %d errors, finishes %v, %d comments", k, got.done, got.errors, got.finishes, got.comments)
				}
				if fmt.Sprint(got.usage) != fmt.Sprint(want.usage) {
					t.Fatalf("cut after %d: usage %v, want %v", k, got.usage, want.usage)
				}
				if len(got.objects) != 1 || len(got.chunkIDs) != 1 || len(got.createds) != 1 || got.role != want.role {
					t.Fatalf("cut after %d: objects %v ids %v created %v roles %d: want one shape", k, got.objects, got.chunkIDs, got.createds, got.role)
				}
				reqs := f.requests()[before:]
				if len(reqs) == 2 && tc.merge && k == 1 && fmt.Sprint(reqs[1].body) == fmt.Sprint(reqs[0].body) {
					replayed++ // the first chunk (two tokens) never left
					continue
				}
				if len(reqs) != 2 || reqs[1].path != "/v1/completions" {
					t.Fatalf("cut after %d: requests %+v, want the original and a continuation", k, reqs)
				}
				c := reqs[1].body
				prefix := len(c["prompt"].([]any)) - len(prompt(t, reqs[0]))
				if prefix > k || (!tc.merge && prefix < k-3) {
					t.Fatalf("continuation prompt holds %d generated ids, want the %d delivered (less those without text yet)", prefix, k)
				}
				if prefix < k {
					rewound++
				}
				if mt, ok := c["max_tokens"].(float64); !ok || (strings.Contains(tc.body, "24") && int(mt) != 24-prefix) || int(mt) > 200-len(prompt(t, reqs[0]))-prefix {
					t.Fatalf("continuation max_tokens %v, want %d", c["max_tokens"], 24-prefix)
				}
				if c["return_token_ids"] != true || c["stream"] != true {
					t.Fatalf("continuation %v", c)
				}
			}
			if v := f.counter("vllm_guard_proxy_resumed_total", "how", "continued"); v != float64(cuts-replayed) {
				t.Fatalf("continued %v, want %d", v, cuts)
			}
			if n := f.r.p.Stats().Resumed; n != uint64(cuts) {
				t.Fatalf("status says %d resumed; %d streams were replayed or continued", n, cuts)
			}
			if rewound == 0 {
				t.Fatal("fixture: no cut came after an id without text")
			}
		})
	}
}

func prompt(t *testing.T, r fakeReq) []int {
	t.Helper()
	if m, ok := r.body["messages"].([]any); ok {
		n := 3
		for _, x := range m {
			n += len([]rune(x.(map[string]any)["content"].(string)))
		}
		return make([]int, n)
	}
	return make([]int, 1+len([]rune(r.body["prompt"].(string))))
}

func TestStreamCutTokenIDsStayHiddenUnlessAsked(t *testing.T) {
	f := newFakeLLM(t)
	body := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}],"max_tokens":12,"stream":true}`
	want := f.run("/v1/chat/completions", body, func() { t.Fatal("held without a cut") })
	f.queue(5, -1)
	got := f.run("/v1/chat/completions", body, f.bringBack)
	if got.text != want.text || got.ids2 != 0 || want.ids2 != 0 || got.done != 1 {
		t.Fatalf("got %q (%d chunks with ids), want %q and none", got.text, got.ids2, want.text)
	}
	if r := f.requests()[0].body; r["return_token_ids"] != true {
		t.Fatalf("vLLM was not asked for token ids: %v", r)
	}
}

// Issue 42: with a warm standby the guard shows the proxy vLLM's loss and
// the standby's readiness at once, and the proxy may read the cut only
// after both: the loss since the stream was sent is still the death that
// cut it, so the stream is continued (on the standby), whole, with no
// error event — not ended as a cut "while vLLM stayed up".
func TestStreamCutReadAfterAFailoverIsContinued(t *testing.T) {
	f := newFakeLLM(t)
	f.style = "failover"
	var continued atomic.Int32
	f.r.p.SetOnContinued(func(time.Time) { continued.Add(1) })
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		body := `{"model":"m","temperature":0,"prompt":"hello","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true}`
		want := f.run(path, body, func() { t.Fatal("held without a cut") })
		f.queue(4, -1)
		got := f.run(path, body, func() {})
		if got.text != want.text || got.errors != 0 || got.done != 1 || fmt.Sprint(got.finishes) != fmt.Sprint(want.finishes) {
			t.Fatalf("%s: got %+v\nwant %+v", path, got, want)
		}
	}
	if n := f.counter("vllm_guard_proxy_resumed_total", "how", "continued"); n != 2 || continued.Load() != 2 {
		t.Fatalf("continued %v (the hook heard %d), want 2", n, continued.Load())
	}
}

func TestStreamCutBeforeFirstTokenIsReplayed(t *testing.T) {
	for _, tc := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`},
		{"completions", "/v1/completions", `{"model":"m","temperature":0,"prompt":"hi","max_tokens":8,"stream":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeLLM(t)
			want := f.run(tc.path, tc.body, func() { t.Fatal("held without a cut") })
			f.queue(0, -1)
			got := f.run(tc.path, tc.body, f.bringBack)
			if got.text != want.text || got.role != want.role || got.done != 1 || got.errors != 0 || len(got.finishes) != 1 {
				t.Fatalf("got %+v\nwant %+v", got, want)
			}
			reqs := f.requests()
			if len(reqs) != 3 || reqs[2].path != tc.path {
				t.Fatalf("requests %+v: want the original sent again", reqs)
			}
			if v := f.counter("vllm_guard_proxy_resumed_total", "how", "replayed"); v != 1 {
				t.Fatalf("replayed %v", v)
			}
		})
	}
}

// vLLM's engine-failure event, and an abort (a planned restart's drain
// that ran out of time), are cuts like a reset.
func TestEngineErrorAndAbortAreResumed(t *testing.T) {
	for _, style := range []string{"error", "flat-error", "abort"} {
		t.Run(style, func(t *testing.T) {
			f := newFakeLLM(t)
			f.style = style
			for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
				body := `{"model":"m","temperature":0,"prompt":"hello","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true}`
				want := f.run(path, body, func() { t.Fatal("held without a cut") })
				f.queue(4, -1)
				got := f.run(path, body, f.bringBack)
				if got.text != want.text || got.errors != 0 || got.done != 1 || fmt.Sprint(got.finishes) != fmt.Sprint(want.finishes) {
					t.Fatalf("%s: got %+v\nwant %+v", path, got, want)
				}
			}
		})
	}
}

func TestStreamCutSeveralTimes(t *testing.T) {
	cfg := proxyConfig()
	cfg.ResumeLimit = 4
	f := &fakeLLM{t: t}
	f.r = newRig(t, cfg, 8, f.handler)
	body := `{"model":"m","temperature":0,"prompt":"hello","max_tokens":20,"stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`
	want := f.run("/v1/completions", body, func() { t.Fatal("held without a cut") })
	f.queue(3, 4, 5, -1)
	got := f.run("/v1/completions", body, f.bringBack)
	if fmt.Sprint(got.ids) != fmt.Sprint(want.ids) || got.text != want.text || got.done != 1 || fmt.Sprint(got.usage) != fmt.Sprint(want.usage) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestStreamCutBeyondTheLimitEnds(t *testing.T) {
	f := newFakeLLM(t)
	body := `{"model":"m","temperature":0,"prompt":"hello","max_tokens":20,"stream":true}`
	// The continuation dies before it gives anything: no progress.
	f.style = "error"
	f.queue(3, 0)
	got := f.run("/v1/completions", body, f.bringBack)
	if got.errors != 1 {
		t.Fatalf("got %+v: want the error event after %d sends", got, 2)
	}
	if v := f.counter("vllm_guard_proxy_resume_failed_total", "reason", nrLimit); v != 1 {
		t.Fatalf("not resumed (limit) %v", v)
	}
}

func TestStopStringAcrossTheCut(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("include=", keep), func(t *testing.T) {
			f := newFakeLLM(t)
			plain := f.run("/v1/completions", `{"model":"m","temperature":0,"prompt":"hello","max_tokens":30,"stream":true,"return_token_ids":true}`, func() {})
			const k = 12
			// A stop string over the end of token k and the start of
			// token k+1: vLLM holds its first part back when it is cut.
			a, b := fakeText(plain.ids[k-1]), fakeText(plain.ids[k])
			stop := a[len(a)-3:] + b[:2]
			if strings.Index(plain.text, stop) < len(plain.text[:strings.Index(plain.text, a)]) {
				t.Skip("fixture: stop string occurs earlier")
			}
			body := fmt.Sprintf(`{"model":"m","temperature":0,"prompt":"hello","max_tokens":30,"stream":true,"return_token_ids":true,"stop":[%q,"zzzzzzz"],"include_stop_str_in_output":%v}`, stop, keep)
			want := f.run("/v1/completions", body, func() { t.Fatal("held without a cut") })
			for _, cut := range []int{k - 2, k} {
				f.queue(cut, -1)
				got := f.run("/v1/completions", body, f.bringBack)
				if got.text != want.text || fmt.Sprint(got.finishes) != fmt.Sprint(want.finishes) || got.done != 1 {
					t.Fatalf("cut after %d: %q %v, want %q %v", cut, got.text, got.finishes, want.text, want.finishes)
				}
				if fmt.Sprint(got.ids) != fmt.Sprint(want.ids) {
					t.Fatalf("cut after %d: ids %v, want %v", cut, got.ids, want.ids)
				}
			}
		})
	}
}

func TestIneligibleStreamKeepsTheErrorEvent(t *testing.T) {
	f := newFakeLLM(t)
	f.queue(3)
	got := f.run("/v1/completions", `{"model":"m","prompt":"hello","max_tokens":20,"stream":true,"n":2}`, func() { t.Fatal("held an n=2 stream") })
	if got.errors != 1 || got.comments != 0 {
		t.Fatalf("got %+v: want today's error event", got)
	}
	if r := f.requests()[0].body; r["return_token_ids"] != nil {
		t.Fatalf("an ineligible request was changed: %v", r)
	}
	if v := f.counter("vllm_guard_proxy_resume_failed_total", "reason", nrN); v != 1 {
		t.Fatalf("not resumed (n) %v", v)
	}
}

func TestPlanStream(t *testing.T) {
	for body, want := range map[string]string{
		`{"stream":true,"prompt":"x"}`:                                          "",
		`{"stream":true,"prompt":"x","n":1}`:                                    "",
		`{"stream":true,"prompt":"x","n":3}`:                                    nrN,
		`{"stream":true,"prompt":"x","best_of":2}`:                              "",
		`{"stream":true,"prompt":"x","use_beam_search":true}`:                   nrBeamSearch,
		`{"stream":true,"prompt":"x","echo":true}`:                              nrEcho,
		`{"stream":true,"prompt":"x","logprobs":2}`:                             nrLogprobs,
		`{"stream":true,"prompt":"x","suffix":"y"}`:                             nrSuffix,
		`{"stream":true,"prompt":["a","b"]}`:                                    nrPrompts,
		`{"stream":true,"prompt":[1,2,3]}`:                                      "",
		`{"stream":true,"prompt":"x","guided_json":{}}`:                         "",
		`{"stream":true,"prompt":"x","structured_outputs":{"regex":"a"}}`:       nrStructured,
		`{"stream":true,"prompt":"x","response_format":{"type":"text"}}`:        "",
		`{"stream":true,"prompt":"x","response_format":{"type":"json_object"}}`: nrStructured,
	} {
		pl, reason := planStream("/v1/completions", []byte(body))
		if reason != want || (want == "" && pl == nil) {
			t.Errorf("%s: %q, want %q", body, reason, want)
		}
	}
	for body, want := range map[string]string{
		`{"stream":true,"messages":[]}`:                                                 "",
		`{"stream":true,"messages":[],"tool_choice":"required"}`:                        nrStructured,
		`{"stream":true,"messages":[],"tool_choice":{"type":"function"}}`:               nrStructured,
		`{"stream":true,"messages":[],"tools":[{}]}`:                                    nrTools,
		`{"stream":true,"messages":[],"tools":[{}],"tool_choice":"none"}`:               "",
		`{"stream":true,"messages":[],"logprobs":true}`:                                 nrLogprobs,
		`{"stream":true,"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`: nrMultimodal,
	} {
		pl, reason := planStream("/v1/chat/completions", []byte(body))
		if reason != want || (want == "" && pl == nil) {
			t.Errorf("%s: %q, want %q", body, reason, want)
		}
	}
	if pl, reason := planStream("/v1/completions", []byte(`{"prompt":"x"}`)); pl != nil || reason != "" {
		t.Errorf("a request that is not a stream: %v %q", pl, reason)
	}
}

func TestMentionsAcrossPieces(t *testing.T) {
	word := []byte(`"stream"`)
	body := []byte(`{"prompt":"x","stream":true}`)
	for cut := range len(body) {
		if !mentions([][]byte{body[:cut], body[cut:]}, word) {
			t.Fatalf("not found with the body cut at %d", cut)
		}
	}
	if mentions([][]byte{[]byte(`{"prompt":"st`), []byte(`ream_x"}`)}, word) {
		t.Fatal("found what is not there")
	}
}

// The proxy reads vLLM's events itself: whatever comes, it must not panic,
// and a chunk it passes on is JSON.
func FuzzResumeEvent(f *testing.F) {
	f.Add([]byte(`data: {"id":"c","choices":[{"index":0,"text":"ab","token_ids":[1,2],"prompt_token_ids":[5],"finish_reason":null}]}`), false)
	f.Add([]byte(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1]}`), true)
	f.Add([]byte(`data: {"choices":[{"delta":{"content":"x","reasoning":"y"},"finish_reason":"abort","token_ids":[3]}],"usage":{"prompt_tokens":1}}`), true)
	f.Add([]byte(`data: {"error":{"code":500,"type":"InternalServerError"}}`), false)
	f.Add([]byte(`data: {"choices":[],"usage":{"completion_tokens":"x"}}`), false)
	f.Add([]byte("data: [DONE]"), false)
	f.Add([]byte(`: comment`), false)
	f.Fuzz(func(t *testing.T, ev []byte, chat bool) {
		path, body := "/v1/completions", `{"stream":true,"prompt":"x","stop":["ab","c"],"stream_options":{"include_usage":true}}`
		if chat {
			path, body = "/v1/chat/completions", `{"stream":true,"messages":[],"stop":"xy"}`
		}
		plan, _ := planStream(path, []byte(body))
		rr := httptest.NewRecorder()
		p := New(proxyConfig(), &fakeUp{ready: true, seqs: 1}, nil, nil)
		s := &resumer{p: p, w: &recorder{ResponseWriter: rr, rc: http.NewResponseController(rr)}, plan: plan, sends: 1, headerSent: true,
			st: &reqState{}, r: httptest.NewRequest(http.MethodPost, path, nil)}
		s.text = &stopText{stops: plan.stops, keep: plan.keepStop}
		s.text.init()
		for i := range 3 {
			if i == 2 {
				s.text.cut()
				s.continuing = true
				s.led.regen, s.led.regenRaw = []int{1}, "a"
			}
			s.event(ev)
		}
		for _, line := range strings.Split(rr.Body.String(), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" && !json.Valid([]byte(d)) && bytes.HasPrefix(ev, []byte("data: {")) && json.Valid(bytes.TrimPrefix(ev, []byte("data: "))) {
				t.Fatalf("passed on %q", d)
			}
		}
	})
}

// stopText passes on every character it is given, in order, holding back
// no more than the longest stop string less one, until a stop string.
func FuzzStopText(f *testing.F) {
	f.Add("abcabc", "ca", 2, false)
	f.Add("héllo wörld", "ö", 3, true)
	f.Add("xxxx", "xxxxx", 1, false)
	f.Fuzz(func(t *testing.T, text, stop string, pieces int, keep bool) {
		if stop == "" || !utf8.ValidString(text) || !utf8.ValidString(stop) || pieces <= 0 || pieces > 50 {
			return
		}
		st := &stopText{stops: []string{stop}, keep: keep}
		st.init()
		out := ""
		step := max(1, len(text)/pieces)
		for i, n := 0, 0; i < len(text); n++ {
			end := min(len(text), i+step)
			for end < len(text) && !utf8.RuneStart(text[end]) {
				end++
			}
			if n == 1 {
				st.cut()
			}
			got, stopped := st.feed(text[i:end], false, nil)
			i = end
			out += got
			if stopped != nil {
				return // a stop string across the cut: the stream ends
			}
			if !keep && utf8.RuneCountInString(st.pending) > st.hold {
				t.Fatalf("holds back %q, more than %d characters", st.pending, st.hold)
			}
		}
		if out+st.rest() != text {
			t.Fatalf("gave %q, want %q", out, text)
		}
	})
}
