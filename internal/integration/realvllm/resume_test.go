package realvllm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// resumeClient waits through a whole restart of the real vLLM (a cold
// start on two loaded cores takes up to startBound).
var resumeClient = &http.Client{Timeout: startBound + exitBound}

// resumeRequest is one of the scenario's requests: completions or chat,
// greedy, a fixed number of tokens (the end token ignored), the token ids
// asked for so that the client can compare them.
func resumeRequest(i int, chat, stream bool, maxTokens int) (path string, body map[string]any) {
	body = map[string]any{"model": model("tiny-llama"), "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true,
		"stream": stream, "return_token_ids": true}
	prompt := fmt.Sprintf("request %d: the guard keeps vLLM serving through every restart", i)
	if chat {
		body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
		return "/v1/chat/completions", body
	}
	body["prompt"] = prompt
	return "/v1/completions", body
}

// clientView is what one client of the proxy received.
type clientView struct {
	status int
	ids    []int  // the generated token ids, in order
	text   string // the text or content, in order
	done   bool   // a stream ended with [DONE]
	errEv  bool   // a stream carried an error event
	finish []string
	roles  int // chat: role deltas seen
	err    error
	raw    string
	// A stream the proxy held at a cut: when its first hold comment came
	// (": vllm-guard: vLLM restarting after …"), and the first chunk with
	// token ids after it (the first continued token).
	cutAt, continuedAt time.Time
}

// streamIDs reads a streaming answer: token ids, text, finish reasons,
// [DONE], error events. progress, if set, gets the count of ids so far.
func streamIDs(url string, body map[string]any, progress func(n int)) clientView {
	b, _ := json.Marshal(body)
	resp, err := resumeClient.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return clientView{err: err}
	}
	defer resp.Body.Close()
	v := clientView{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		v.raw = string(raw)
		return v
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), ": vllm-guard: ") && v.cutAt.IsZero() {
			v.cutAt = time.Now()
		}
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			v.done = true
			continue
		}
		if strings.HasPrefix(line, `{"error"`) {
			v.errEv = true
			v.raw += line + "\n"
			continue
		}
		var chunk struct {
			Choices []struct {
				Text         string  `json:"text"`
				TokenIDs     []int   `json:"token_ids"`
				FinishReason *string `json:"finish_reason"`
				Delta        struct {
					Role    *string `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		for _, c := range chunk.Choices {
			if len(c.TokenIDs) > 0 && !v.cutAt.IsZero() && v.continuedAt.IsZero() {
				v.continuedAt = time.Now()
			}
			v.ids = append(v.ids, c.TokenIDs...)
			v.text += c.Text
			if c.Delta.Content != nil {
				v.text += *c.Delta.Content
			}
			if c.Delta.Role != nil {
				v.roles++
			}
			if c.FinishReason != nil {
				v.finish = append(v.finish, *c.FinishReason)
			}
		}
		if progress != nil {
			progress(len(v.ids))
		}
	}
	if err := sc.Err(); err != nil {
		v.err = err
	}
	return v
}

// wholeIDs sends a non-streaming request and reads its token ids.
func wholeIDs(url string, body map[string]any) clientView {
	b, _ := json.Marshal(body)
	resp, err := resumeClient.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return clientView{err: err}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	v := clientView{status: resp.StatusCode, raw: string(raw)}
	var doc struct {
		Choices []struct {
			TokenIDs     []int  `json:"token_ids"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal(raw, &doc) == nil {
		for _, c := range doc.Choices {
			v.ids = append(v.ids, c.TokenIDs...)
			v.finish = append(v.finish, c.FinishReason)
		}
	}
	return v
}

// TestNoClientSeesVLLMDie: through the guard's proxy, a death of the real
// vLLM (--stream-interval 2: several ids a chunk) costs its clients only
// time. 16 greedy streams of up to 64 tokens (8 completions, 8 chat, half
// of them with a stop string near their end) and 4 non-streaming requests
// are in flight when the
// EngineCore is killed (SIGKILL: a crash) or frozen (SIGSTOP: the guard
// kills it as hung) about 10 tokens in; every stream ends with [DONE], no
// error event, one finish reason, and exactly the token ids and text of
// the same request run uninterrupted; each non-streaming request gets one 200; 8
// requests sent while vLLM reloads all get 200. The death's incident record
// then accounts for every one of them, as the clients saw it.
func TestNoClientSeesVLLMDie(t *testing.T) {
	scenario(t, "a death under 16 streams (2 ids a chunk, half with stop strings) and 4 requests through the proxy (SIGKILL, SIGSTOP of the EngineCore): every stream continues with the uninterrupted token ids and text, every request answered 200")
	for _, how := range []struct {
		name  string
		sig   syscall.Signal
		cause string
	}{{"SIGKILL", syscall.SIGKILL, "crash"}, {"SIGSTOP", syscall.SIGSTOP, "hang"}} {
		t.Run(how.name, func(t *testing.T) {
			// Several ids a chunk (issue 40): every continuation starts
			// where the ids given end on a whole character.
			s := newScene(t, tiny("tiny-llama", 2048, "--enforce-eager", "--stream-interval", "2")...)
			s.proxy = testkit.FreePort(t)
			s.extra = "\n[liveness]\ninterval = \"1s\"\nstuck_timeout = \"5s\"\n"
			s.start()
			s.WaitEvent("ready", 1, startBound, isReady)
			base := fmt.Sprintf("http://127.0.0.1:%d", s.proxy)

			// The streams (streamSet: their reference is each request run
			// alone, uninterrupted), and long non-streaming requests that
			// are still generating when the engine dies.
			const whole = 4
			ss := newStreamSet(t, base)
			load := ss.launch()
			gotWhole := make([]clientView, whole)
			var wg sync.WaitGroup
			for i := range whole {
				wg.Go(func() {
					path, body := resumeRequest(100+i, false, false, 1500)
					gotWhole[i] = wholeIDs(base+path, body)
				})
			}
			load.waitTenIn(t, exitBound)
			core := s.byTitle("VLLM::EngineCore")
			if core == 0 {
				t.Fatal("no VLLM::EngineCore")
			}
			syscall.Kill(core, how.sig)
			atKill := load.received()
			ex := s.WaitEvent("exit", 1, exitBound, isExited)
			if c := causeOf(ex); c != how.cause {
				t.Fatalf("cause %q, want %s (%s)", c, how.cause, ex.Failure.Verdict.Summary)
			}

			// Requests that arrive while vLLM reloads.
			late := make([]clientView, 8)
			for i := range late {
				wg.Go(func() {
					path, body := resumeRequest(200+i, i%2 == 1, false, 8)
					late[i] = wholeIDs(base+path, body)
				})
			}
			wg.Wait()
			s.WaitEvent("ready again", 2, startBound, isReady)
			ss.check(t, load.wait())
			for i, v := range gotWhole {
				if v.err != nil || v.status != 200 || len(v.ids) != 1500 {
					t.Errorf("non-streaming request %d in flight at the death: status %d, %d ids, err %v %.300s", i, v.status, len(v.ids), v.err, v.raw)
				}
			}
			// Every stream short of its tokens when the engine died was
			// continued, and every long request replayed: the proxy says
			// so (a stream already whole when the kill landed was not).
			cut := ss.cutAt(atKill)
			proxyStats, _ := s.status()["proxy"].(map[string]any)
			resumed, _ := proxyStats["resumed"].(float64)
			t.Logf("at the kill the streams had %v of %d tokens; the proxy resumed %v requests", atKill, deathMaxTokens, resumed)
			figure("resume_"+how.name+"_streams_cut", cut)
			if int(resumed) < cut+whole {
				t.Errorf("the proxy resumed %v requests; %d streams were cut and %d requests in flight", resumed, cut, whole)
			}
			for i, v := range late {
				if v.err != nil || v.status != 200 {
					t.Errorf("request %d sent while vLLM reloaded: status %d, err %v %.300s", i, v.status, v.err, v.raw)
				}
			}

			// The death's incident record says what became of the requests
			// it touched, once they have all finished, and it agrees with
			// what the clients saw: every cut stream continued, every long
			// request replayed, every request sent during the reload
			// served after the hold; none refused, failed or left pending.
			rec := s.waitDeathRequests(exitBound)
			req := rec.Requests
			b, _ := json.Marshal(req)
			t.Logf("the %s death's record (%s): requests %s", how.name, rec.ID, b)
			figure("resume_"+how.name+"_account", req.Line())
			checkDeathAccount(t, req, cut, whole, len(late))
		})
	}
}

// checkDeathAccount checks a death's account of its requests against what
// the clients of TestNoClientSeesVLLMDie saw: cut streams, each with
// tokens before the death, continued; whole requests in flight replayed;
// late ones, sent after the exit and answered after the reload, served
// after the hold; nothing else.
func checkDeathAccount(t *testing.T, req *state.DeathRequests, cut, whole, late int) {
	t.Helper()
	want := func(what string, o *state.RequestOutcomes, touched int, how func(*state.RequestOutcomes) int) {
		t.Helper()
		if touched == 0 {
			if o != nil {
				t.Errorf("requests.%s = %+v; want absent (the death touched none)", what, *o)
			}
			return
		}
		if o == nil {
			t.Errorf("requests.%s absent; want %d touched", what, touched)
			return
		}
		if o.Touched != touched || how(o) != touched || o.Pending != 0 {
			t.Errorf("requests.%s = %+v; want %d touched, all of them resumed that one way, none pending", what, *o, touched)
		}
	}
	all := req.RequestOutcomes
	if all.Touched != cut+whole+late || all.Continued != cut || all.Replayed != whole || all.ServedAfterHold != late ||
		all.Refused != 0 || all.Suspect != 0 || len(all.NotResumed) != 0 || all.ClientGone != 0 || all.Failed != 0 ||
		all.Pending != 0 || req.UnfinishedAt != "" {
		t.Errorf("requests = %+v (unfinished at %q); want %d touched: %d continued, %d replayed, %d served after the hold, nothing else",
			all, req.UnfinishedAt, cut+whole+late, cut, whole, late)
	}
	want("streams", req.Streams, cut, func(o *state.RequestOutcomes) int { return o.Continued })
	want("streams_before_first_token", req.StreamsBeforeFirstToken, 0, nil)
	want("non_streaming", req.NonStreaming, whole, func(o *state.RequestOutcomes) int { return o.Replayed })
	want("arrived_while_down", req.ArrivedWhileDown, late, func(o *state.RequestOutcomes) int { return o.ServedAfterHold })
}
