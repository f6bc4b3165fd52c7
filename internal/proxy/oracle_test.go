package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// The differential oracle (issue 40, Deliver 8): for a matrix of request
// shapes, the stream through the proxy without a death is byte for byte
// what vLLM sent; with vLLM dying after every chunk position, a greedy
// oracleAnswer is the uninterrupted one (text, ids, finish, stop_reason, usage),
// a sampled one is one consistent sample (its text the text of its ids,
// as many ids as usage says, at most max_tokens), and a shape the proxy
// cannot continue exactly ends with the error event.

type oracleRig struct {
	splits int // sampled cuts not continued (split_character)
	t      *testing.T
	o      *oracleLLM
	r      *rig
}

func newOracle(t *testing.T, per int, apiKey string) *oracleRig {
	cfg := proxyConfig()
	cfg.ResumeLimit = 3
	return newOracleCfg(t, per, apiKey, cfg)
}

func newOracleCfg(t *testing.T, per int, apiKey string, cfg config.Proxy) *oracleRig {
	o := &oracleLLM{perChunk: per, modelLen: 60, apiKey: apiKey}
	x := &oracleRig{t: t, o: o}
	x.r = newRig(t, cfg, 8, o.handler)
	o.downed = func() {
		x.r.up.set(func(u *fakeUp) { u.ready = false })
		x.r.p.Notify()
	}
	o.down = func() {
		o.downed()
		x.r.p.Died()
	}
	return x
}

// oracleAnswer is what a client made of a stream.
type oracleAnswer struct {
	raw         string
	text        string
	ids         []int
	finishes    []string
	stopReasons []string
	usage       []map[string]int
	chunks      int // chunks with a choice
	empty       int // of them with no text, no ids, no finish
	done        int
	errors      int
	comments    int
}

func (x *oracleRig) post(url, path, body string, auth string, onCut func()) oracleAnswer {
	x.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	resp, err := x.r.client.Do(req)
	if err != nil {
		x.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		x.t.Fatalf("HTTP %d: %s", resp.StatusCode, b)
	}
	var a oracleAnswer
	var raw strings.Builder
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		raw.WriteString(line)
		if err != nil {
			break
		}
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, ":") {
			a.comments++
			if strings.Contains(line, "the stream was cut") {
				onCut()
			}
			continue
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			a.event(x.t, d)
		}
	}
	a.raw = raw.String()
	return a
}

func (a *oracleAnswer) event(t *testing.T, d string) {
	if d == "[DONE]" {
		a.done++
		return
	}
	var c struct {
		Error   *json.RawMessage `json:"error"`
		Choices []struct {
			Text         *string
			Delta        *struct{ Content *string }
			FinishReason *string         `json:"finish_reason"`
			StopReason   json.RawMessage `json:"stop_reason"`
			TokenIDs     []int           `json:"token_ids"`
		}
		Usage map[string]int
	}
	if err := json.Unmarshal([]byte(d), &c); err != nil {
		t.Fatalf("event %q: %v", d, err)
	}
	if c.Error != nil {
		a.errors++
		return
	}
	if c.Usage != nil {
		a.usage = append(a.usage, c.Usage)
	}
	for _, ch := range c.Choices {
		a.chunks++
		text := ""
		if ch.Text != nil {
			text = *ch.Text
		} else if ch.Delta != nil && ch.Delta.Content != nil {
			text = *ch.Delta.Content
		}
		a.text += text
		a.ids = append(a.ids, ch.TokenIDs...)
		if ch.FinishReason != nil {
			a.finishes = append(a.finishes, *ch.FinishReason)
			a.stopReasons = append(a.stopReasons, string(ch.StopReason))
		} else if text == "" && len(ch.TokenIDs) == 0 {
			a.empty++
		}
	}
}

// direct is vLLM's own oracleAnswer (no proxy).
func (x *oracleRig) direct(path, body, auth string) oracleAnswer {
	return x.post(x.r.upstream.URL, path, body, auth, func() { x.t.Fatal("a comment from vLLM") })
}

// through is the oracleAnswer through the proxy; vLLM comes back at each hold.
func (x *oracleRig) through(path, body, auth string) oracleAnswer {
	return x.post(x.r.front.URL, path, body, auth, func() {
		testkit.WaitFor(x.t, "the stream held", 30*time.Second, func() bool { return x.r.p.Stats().Paused > 0 })
		x.r.up.set(func(u *fakeUp) { u.ready = true })
		x.r.p.Notify()
	})
}

func (x *oracleRig) back() {
	x.r.up.set(func(u *fakeUp) { u.ready = true })
	x.r.p.Notify()
}

type oracleShape struct {
	name    string
	chat    bool
	fields  string // JSON members added to the request
	refused string // the reason the proxy does not continue it ("": it does)
}

func (s oracleShape) path() string {
	if s.chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

func (s oracleShape) body(extra string) string {
	b := `{"model":"m","stream":true`
	if s.chat {
		b += `,"messages":[{"role":"user","content":"hi"}]`
	} else {
		b += `,"prompt":"hello"`
	}
	for _, f := range []string{s.fields, extra} {
		if f != "" {
			b += "," + f
		}
	}
	return b + "}"
}

func (s oracleShape) greedy() bool { return strings.Contains(s.fields, `"temperature":0,`) }

func oracleShapes() []oracleShape {
	var out []oracleShape
	for _, chat := range []bool{false, true} {
		kind := map[bool]string{false: "completions", true: "chat"}[chat]
		for _, samp := range []struct{ name, f string }{
			{"greedy", `"temperature":0`}, {"sampled", ""}, {"seeded", `"temperature":0.8,"seed":7`},
		} {
			for _, opt := range []struct{ name, f, refused string }{
				{"plain", `"max_tokens":24`, ""},
				{"ids+usage", `"max_tokens":24,"return_token_ids":true,"stream_options":{"include_usage":true}`, ""},
				{"stop", `"max_tokens":30,"stop":["STOP","xyz"]`, ""},
				{"stop kept", `"max_tokens":30,"stop":["STOP"],"include_stop_str_in_output":true,"return_token_ids":true`, ""},
				{"stop ids", `"max_tokens":30,"stop_token_ids":[43],"stream_options":{"include_usage":true}`, ""},
				{"stop and stop ids", `"max_tokens":30,"stop":["STOP"],"stop_token_ids":[43]`, nrStopTokenText},
				{"min_tokens", `"max_tokens":30,"min_tokens":12,"stop_token_ids":[43],"return_token_ids":true`, ""},
				{"ignore_eos", `"max_tokens":30,"ignore_eos":true,"stream_options":{"include_usage":true}`, ""},
				{"special kept", `"max_tokens":30,"skip_special_tokens":false`, ""},
				{"max_tokens null", `"max_tokens":null,"stream_options":{"include_usage":true}`, ""},
				{"max_tokens absent", `"return_token_ids":true`, ""},
				{"number as string", `"max_tokens":"20"`, nrFieldType},
			} {
				out = append(out, oracleShape{name: kind + "/" + samp.name + "/" + opt.name, chat: chat,
					fields: strings.Trim(samp.f+","+opt.f, ","), refused: opt.refused})
			}
		}
	}
	return out
}

// stopFor puts a stop string that occurs in the uninterrupted oracleAnswer in
// place of the shape's STOP: three characters from its middle, across ids.
func (x *oracleRig) stopFor(s oracleShape) oracleShape {
	if !strings.Contains(s.fields, "STOP") {
		return s
	}
	plain := strings.NewReplacer(`"stop":["STOP","xyz"]`, `"ignore_eos":true`, `"stop":["STOP"],`, `"ignore_eos":true,`).Replace(s.fields)
	a := x.direct(s.path(), oracleShape{chat: s.chat, fields: plain}.body(""), "")
	r := []rune(a.text)
	if len(r) < 12 {
		return s
	}
	at := len(r) * 2 / 3
	stop, _ := json.Marshal(string(r[at : at+3]))
	s.fields = strings.Replace(s.fields, `"STOP"`, string(stop), 1)
	return s
}

// No death: the stream through the proxy (resume on) is byte for byte
// what vLLM sends, for every shape, in chunks of 1, 2 and 4 ids.
func TestOracleNoDeathIsVLLMsStream(t *testing.T) {
	for _, per := range []int{1, 2, 4} {
		x := newOracle(t, per, "")
		for _, s := range oracleShapes() {
			s = x.stopFor(s)
			want := x.direct(s.path(), s.body(""), "")
			got := x.through(s.path(), s.body(""), "")
			if got.raw != want.raw {
				t.Fatalf("%d ids a chunk, %s (%s): through the proxy\n%s\nvLLM's\n%s", per, s.name, s.body(""), got.raw, want.raw)
			}
		}
	}
}

// A cut after every chunk position, for every shape.
func TestOracleCutAnywhere(t *testing.T) {
	for _, per := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(per, "_ids_a_chunk"), func(t *testing.T) {
			x := newOracle(t, per, "")
			cuts := 0
			for _, s := range oracleShapes() {
				s = x.stopFor(s)
				want := x.direct(s.path(), s.body(""), "")
				chunks := want.chunks
				if s.chat {
					chunks-- // the role chunk
				}
				for cut := 0; cut < chunks; cut++ {
					x.o.cuts = []int{cut}
					before := len(x.o.requests())
					got := x.through(s.path(), s.body(""), "")
					x.back() // (a stream not continued leaves vLLM down)
					x.check(s, per, cut, want, got, x.o.requests()[before:])
					cuts++
				}
			}
			if v := x.r.counter(t, nrSplitChar); int(v) != x.splits || x.splits*4 > cuts {
				t.Fatalf("%d sampled cuts not continued, %v counted as %s, of %d cuts", x.splits, v, nrSplitChar, cuts)
			}
			t.Logf("%d cuts, %d sampled ones not continued (split_character)", cuts, x.splits)
		})
	}
}

func (x *oracleRig) check(s oracleShape, per, cut int, want, got oracleAnswer, reqs []oracleReq) {
	t := x.t
	t.Helper()
	where := fmt.Sprintf("%d ids a chunk, %s, vLLM died after chunk %d", per, s.name, cut)
	if strings.Contains(got.text, "GARBAGE") {
		t.Fatalf("%s: continued inside a character: %q", where, got.text)
	}
	if s.refused != "" {
		if got.errors != 1 || got.done != 0 || got.comments != 0 {
			t.Fatalf("%s: a shape not continued (%s): %d errors %d [DONE] %d comments, want the error event", where, s.refused, got.errors, got.done, got.comments)
		}
		return
	}
	if got.errors == 1 && got.done == 0 && !s.greedy() {
		// split_character: a sampled stream cut inside a character whose
		// ids or text the client has (counted by the caller).
		x.splits++
		return
	}
	if got.errors != 0 || got.done != 1 || len(got.finishes) != 1 {
		t.Fatalf("%s: %d errors, %d [DONE], finishes %v\n%s", where, got.errors, got.done, got.finishes, got.raw)
	}
	if got.empty > want.empty && per == 1 && s.greedy() {
		t.Fatalf("%s: %d empty chunks, vLLM's own answer %d\n%s", where, got.empty, want.empty, got.raw)
	}
	if s.greedy() {
		if got.text != want.text || !slices.Equal(got.ids, want.ids) || fmt.Sprint(got.finishes, got.stopReasons) != fmt.Sprint(want.finishes, want.stopReasons) ||
			fmt.Sprint(got.usage) != fmt.Sprint(want.usage) {
			t.Fatalf("%s: got %q ids %v %v %v usage %v\nwant %q ids %v %v %v usage %v\n%s", where, got.text, got.ids, got.finishes, got.stopReasons, got.usage,
				want.text, want.ids, want.finishes, want.stopReasons, want.usage, got.raw)
		}
		return
	}
	x.checkSample(s, where, got, reqs)
}

// checkSample: a sampled oracleAnswer is one sample: the ids of the request that
// finished it, after the ids it continued from.
func (x *oracleRig) checkSample(s oracleShape, where string, got oracleAnswer, reqs []oracleReq) {
	t := x.t
	last := reqs[len(reqs)-1]
	full := last.gen
	prefix := []int(nil)
	if len(reqs) > 1 && last.path == "/v1/completions" && last.body["prompt"] != nil {
		if _, ids := last.body["prompt"].([]any); ids {
			prefix = last.prompt[len(reqs[0].prompt):]
			full = append(slices.Clone(prefix), last.gen...)
		}
	}
	if strings.Contains(s.fields, "return_token_ids") && !slices.Equal(got.ids, full) {
		t.Fatalf("%s: ids %v, the sample %v", where, got.ids, full)
	}
	limit := 24
	if !strings.Contains(s.fields, `"max_tokens":24`) {
		limit = 30
	}
	if len(full) > limit && strings.Contains(s.fields, `"max_tokens":`) && !strings.Contains(s.fields, "null") {
		t.Fatalf("%s: %d ids, more than max_tokens", where, len(full))
	}
	for _, u := range got.usage {
		if u["completion_tokens"] != len(full) || u["prompt_tokens"] != len(reqs[0].prompt) {
			t.Fatalf("%s: usage %v, the sample has %d ids after a prompt of %d", where, u, len(full), len(reqs[0].prompt))
		}
	}
	if strings.Contains(s.fields, `"stop"`) {
		return // (the text is checked against the ids without stop strings)
	}
	wantText := oracleText(prefix, !strings.Contains(s.fields, "skip_special_tokens")) + last.text
	if got.text != wantText {
		t.Fatalf("%s: text %q, the sample's %q\n%s", where, got.text, wantText, got.raw)
	}
}

func (r *rig) counter(t *testing.T, reason string) float64 {
	return metricValue(t, r.reg, "vllm_guard_proxy_resume_failed_total", "reason", reason)
}
