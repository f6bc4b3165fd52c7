package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The cases of issue 40, each through the proxy as a client sees it.

// 1: stop strings beside stop_token_ids: no death, and the answer is
// vLLM's (the proxy once asked for include_stop_str_in_output and passed on
// the stop token's text).
func TestStopStringsBesideStopTokenIDsLeaveTheAnswerAlone(t *testing.T) {
	x := newOracle(t, 1, "")
	for i := 0; ; i++ {
		if i > 300 {
			t.Fatal("fixture: no prompt ends on the stop token")
		}
		body := fmt.Sprintf(`{"model":"m","stream":true,"prompt":"p%d","temperature":0,"max_tokens":30,"stop":["zzzz"],"stop_token_ids":[43]}`, i)
		want := x.direct("/v1/completions", body, "")
		if fmt.Sprint(want.stopReasons) != "[43]" {
			continue
		}
		got := x.through("/v1/completions", body, "")
		if got.text != want.text || got.raw != want.raw {
			t.Fatalf("through the proxy %q, vLLM's %q", got.text, want.text)
		}
		return
	}
}

// 2 and 14: stop strings and chunks of several ids: the text held back for
// the stop string is the ledger's; a cut anywhere repeats nothing, and no
// empty chunk follows the seam.
func TestStopStringHeldTextAtTheSeam(t *testing.T) {
	for _, per := range []int{1, 2, 4} {
		x := newOracle(t, per, "")
		s := x.stopFor(oracleShape{fields: `"temperature":0,"max_tokens":30,"stop":["STOP","xyz"]`})
		want := x.direct(s.path(), s.body(""), "")
		for cut := 0; cut < want.chunks; cut++ {
			x.o.cuts = []int{cut}
			got := x.through(s.path(), s.body(""), "")
			if got.text != want.text || got.done != 1 || (per == 1 && got.empty > want.empty) {
				t.Fatalf("%d ids a chunk, cut after %d: %q (%d empty chunks), want %q (%d)", per, cut, got.text, got.empty, want.text, want.empty)
			}
		}
	}
}

// 3 and 4: a sampled stream cut anywhere (after chunks of several ids,
// after a chunk without text) is one sample: its text is its ids' text,
// usage counts them, no more than max_tokens; or it ends with the error
// event (cut inside a character whose ids the client has).
func TestSampledCutIsOneSample(t *testing.T) {
	for _, per := range []int{1, 2} {
		x := newOracle(t, per, "")
		body := `{"model":"m","stream":true,"prompt":"a","temperature":1,"ignore_eos":true,"max_tokens":20,"return_token_ids":true,"stream_options":{"include_usage":true}}`
		want := x.direct("/v1/completions", body, "")
		continued := 0
		for cut := 1; cut < want.chunks; cut++ {
			x.o.cuts = []int{cut}
			got := x.through("/v1/completions", body, "")
			x.back()
			if got.errors == 1 && got.done == 0 {
				continue
			}
			continued++
			if got.text != wholeText(got.ids) || len(got.ids) > 20 || len(got.usage) != 1 || got.usage[0]["completion_tokens"] != len(got.ids) {
				t.Fatalf("%d ids a chunk, cut after %d: %q from ids %v (%q), usage %v", per, cut, got.text, got.ids, wholeText(got.ids), got.usage)
			}
			if (len(got.ids) == 20) != (fmt.Sprint(got.finishes) == "[length]") {
				t.Fatalf("%d ids a chunk, cut after %d: %d ids, finish %v", per, cut, len(got.ids), got.finishes)
			}
		}
		if continued == 0 {
			t.Fatalf("%d ids a chunk: no cut was continued", per)
		}
	}
}

// 5: with --api-key, a chat stream without max_tokens continues to the
// model's length: /v1/models is asked with the client's key.
func TestAPIKeyChatWithoutMaxTokens(t *testing.T) {
	x := newOracle(t, 1, "sekret")
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"temperature":0,"ignore_eos":true}`
	want := x.direct("/v1/chat/completions", body, "sekret")
	x.o.cuts = []int{5}
	got := x.through("/v1/chat/completions", body, "sekret")
	if got.text != want.text || fmt.Sprint(got.finishes) != fmt.Sprint(want.finishes) || got.errors != 0 {
		t.Fatalf("got %q %v (%d errors), want %q %v", got.text, got.finishes, got.errors, want.text, want.finishes)
	}
}

// 10: completions' max_tokens null is vLLM 0.32.0's 16.
func TestCompletionsMaxTokensNull(t *testing.T) {
	x := newOracle(t, 1, "")
	body := `{"model":"m","stream":true,"prompt":"hello","temperature":0,"ignore_eos":true,"max_tokens":null,"return_token_ids":true}`
	want := x.direct("/v1/completions", body, "")
	x.o.cuts = []int{4}
	got := x.through("/v1/completions", body, "")
	if len(want.ids) != 16 || !slices.Equal(got.ids, want.ids) || got.text != want.text {
		t.Fatalf("got %v, want %v (16 ids)", got.ids, want.ids)
	}
}

// 6: an engine error with vLLM still up (the guard sees no death) ends
// the stream with that error; the request is not sent again.
func TestEngineErrorWithVLLMUpEndsTheStream(t *testing.T) {
	x := newOracle(t, 1, "")
	x.o.style = "error alive"
	x.o.cuts = []int{3}
	body := `{"model":"m","stream":true,"prompt":"hello","temperature":0,"max_tokens":20}`
	got := x.post(x.r.front.URL, "/v1/completions", body, "", func() {})
	if got.errors != 1 || got.done != 1 || !strings.Contains(got.raw, "EngineCore encountered an issue") {
		t.Fatalf("want vLLM's error and [DONE]:\n%s", got.raw)
	}
	if n := len(x.o.requests()); n != 1 {
		t.Fatalf("vLLM was asked %d times", n)
	}
}

// 7: the poison rule counts only deaths the stream could have caused: not
// a planned restart's abort, and not deaths before a continuation made
// progress.
func TestPoisonRuleCountsOnlyItsDeaths(t *testing.T) {
	for _, style := range []string{"abort", ""} {
		x := newOracleCfg(t, 1, "", proxyConfig()) // resume_limit 2
		x.o.style = style
		body := `{"model":"m","stream":true,"prompt":"hello","temperature":0,"max_tokens":24,"ignore_eos":true}`
		want := x.direct("/v1/completions", body, "")
		x.o.cuts = []int{3, 3, 3}
		got := x.through("/v1/completions", body, "")
		if got.text != want.text || got.errors != 0 || got.done != 1 {
			t.Fatalf("style %q: got %q (%d errors), want %q", style, got.text, got.errors, want.text)
		}
	}
}

// 7: a suspect stream is named by its peer's address, not by its own
// X-Forwarded-For.
func TestSuspectStreamNamedBySanitizedAddress(t *testing.T) {
	cfg := proxyConfig()
	cfg.ResumeLimit = 1
	x := newOracleCfg(t, 1, "", cfg)
	var mu sync.Mutex
	var named []string
	x.r.p.SetOnSuspect(func(s Suspect) { mu.Lock(); named = append(named, s.Client); mu.Unlock() })
	x.o.cuts = []int{3}
	req, _ := http.NewRequest(http.MethodPost, x.r.front.URL+"/v1/completions",
		strings.NewReader(`{"model":"m","stream":true,"prompt":"hello","temperature":0,"max_tokens":20}`))
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	// The guard has seen the death: the suspect is refused at once, not
	// held until vLLM is back (lifecycle.go).
	defer x.back()
	resp, err := x.r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var a oracleAnswer
	buf := new(strings.Builder)
	_, _ = fmt.Fprint(buf, readAll(t, resp))
	for _, l := range strings.Split(buf.String(), "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			a.event(t, d)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if a.errors != 1 || fmt.Sprint(named) != "[127.0.0.1]" {
		t.Fatalf("%d errors, suspects named %v: want one, 127.0.0.1", a.errors, named)
	}
}

// 9: a stream's every send (the first, the continuation) carries the
// headers every request does: the client's forwarding headers and those it
// named in Connection are not passed.
func TestStreamSendsAreSanitized(t *testing.T) {
	x := newOracle(t, 1, "")
	x.o.cuts = []int{3}
	req, _ := http.NewRequest(http.MethodPost, x.r.front.URL+"/v1/completions",
		strings.NewReader(`{"model":"m","stream":true,"prompt":"hello","temperature":0,"max_tokens":12}`))
	for k, v := range map[string]string{"Forwarded": "for=6.6.6.6", "X-Forwarded-Host": "evil", "X-Forwarded-Proto": "gopher",
		"X-Forwarded-For": "6.6.6.6", "Connection": "X-Secret", "X-Secret": "1"} {
		req.Header.Set(k, v)
	}
	go func() {
		testkit.WaitFor(t, "the stream held", 30*time.Second, func() bool { return x.r.p.Stats().Paused > 0 })
		x.back()
	}()
	resp, err := x.r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	reqs := x.o.requests()
	if len(reqs) < 2 {
		t.Fatalf("%d requests: want the first and a continuation", len(reqs))
	}
	for i, r := range reqs {
		h := r.header
		if h.Get("Forwarded") != "" || h.Get("X-Forwarded-Host") == "evil" || h.Get("X-Forwarded-Proto") == "gopher" ||
			h.Get("X-Secret") != "" || h.Get("X-Forwarded-For") != "127.0.0.1" {
			t.Fatalf("send %d (%s) carried %v", i, r.path, h)
		}
	}
}

// 11: a held stream's prompt ids and continuation count against the
// proxy's buffers.
func TestHeldStreamCountsAgainstTheBuffers(t *testing.T) {
	x := newOracle(t, 1, "")
	body := `{"model":"m","stream":true,"prompt":"hello there, a longer prompt","temperature":0,"max_tokens":12}`
	plan, _ := planStream("/v1/completions", []byte(body))
	x.o.cuts = []int{3}
	var held int64
	got := x.post(x.r.front.URL, "/v1/completions", body, "", func() {
		testkit.WaitFor(t, "the stream held", 30*time.Second, func() bool { return x.r.p.Stats().Paused > 0 })
		held = x.r.p.budget.inUse()
		x.back()
	})
	prompt := 1 + len("hello there, a longer prompt")
	if got.done != 1 || held < int64(len(plan.forward)+8*prompt) {
		t.Fatalf("held %d bytes for a stream of %d body bytes and %d prompt ids", held, len(plan.forward), prompt)
	}
	if n := x.r.p.budget.inUse(); n != 0 {
		t.Fatalf("%d bytes still held after the stream", n)
	}
}

// 12: a stream not continued (logprobs) that vLLM ends with its engine
// error is counted as cut, by its reason.
func TestPassThroughStreamEngineErrorCounted(t *testing.T) {
	x := newOracle(t, 1, "")
	x.o.style = "error"
	x.o.cuts = []int{3}
	got := x.post(x.r.front.URL, "/v1/completions", `{"model":"m","stream":true,"prompt":"hello","temperature":0,"max_tokens":12,"logprobs":1}`, "", func() {})
	if got.errors != 1 {
		t.Fatalf("want vLLM's error event:\n%s", got.raw)
	}
	if v := x.r.counter(t, nrLogprobs); v != 1 {
		t.Fatalf("proxy_resume_failed_total{reason=%q} %v, want 1", nrLogprobs, v)
	}
}

// 13: a stream is counted once per death that resumed it: a continuation
// that vLLM's next death cuts before it answered is continued again, not
// also counted as a request replayed.
func TestContinuationResentIsNotAlsoReplayed(t *testing.T) {
	x := newOracle(t, 1, "")
	body := `{"model":"m","stream":true,"prompt":"hello","temperature":0,"max_tokens":12}`
	want := x.direct("/v1/completions", body, "")
	x.o.cuts = []int{3, -2}
	got := x.through("/v1/completions", body, "")
	if got.text != want.text || got.comments < 2 {
		t.Fatalf("got %q (%d comments), want %q after two holds", got.text, got.comments, want.text)
	}
	c := metricValue(t, x.r.reg, "vllm_guard_proxy_resumed_total", "how", ResumedContinued)
	r := metricValue(t, x.r.reg, "vllm_guard_proxy_resumed_total", "how", ResumedReplayed)
	if c != 2 || r != 0 {
		t.Fatalf("continued %v, replayed %v: want 2 (one a death) and 0", c, r)
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b := new(strings.Builder)
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// wholeText is the text of ids as a stream writes it: a character left
// incomplete at the end is never written.
func wholeText(ids []int) string {
	s := oracleText(ids, true)
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// Issue 40 item 3: a sampled stream cut where its client has ids after the
// last whole character and none of their text cannot be continued (no
// continuation keeps those ids and is one sample with text vLLM would
// write): the error event comes at the cut, not after the client was held
// through vLLM's restart. Every cut position, one id a chunk (where every
// such cut is known at once).
func TestSplitCharacterRefusedAtTheCut(t *testing.T) {
	x := newOracle(t, 1, "")
	splits := 0
	for seed := 1; seed <= 8; seed++ {
		s := oracleShape{name: "sampled ids", fields: fmt.Sprintf(`"temperature":0.8,"seed":%d,"max_tokens":24,"return_token_ids":true`, seed)}
		want := x.direct(s.path(), s.body(""), "")
		for cut := 0; cut < want.chunks; cut++ {
			x.o.cuts = []int{cut}
			got := x.post(x.r.front.URL, s.path(), s.body(""), "", func() {
				testkit.WaitFor(t, "the stream held", 30*time.Second, func() bool { return x.r.p.Stats().Paused > 0 })
				x.back()
			})
			x.back() // (a stream not continued leaves vLLM down)
			if got.errors == 0 {
				continue
			}
			splits++
			if got.comments != 0 || x.r.counter(t, nrSplitChar) != float64(splits) {
				t.Fatalf("seed %d, vLLM died after chunk %d: %d hold comments before the refusal (%v counted split_character, want %d)\n%s",
					seed, cut, got.comments, x.r.counter(t, nrSplitChar), splits, got.raw)
			}
		}
	}
	if splits == 0 {
		t.Fatal("no cut fell inside a character: the test tests nothing")
	}
	t.Logf("%d cuts inside a character, each refused at the cut", splits)
}
