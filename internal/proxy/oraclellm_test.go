package proxy

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// oracleLLM is a vLLM 0.32.0 for the differential oracle: a byte-level
// tokenizer whose characters é and € take 2 and 3 ids (vLLM writes their
// text only once whole: split UTF-8), special EOS, a greedy model and a
// seeded sampler, vLLM's detokenizer rules for stop strings (held back,
// earliest end, include_stop_str_in_output), stop_token_ids, min_tokens,
// ignore_eos and skip_special_tokens, and chunks of 1, 2 or 4 ids
// (--stream-interval). A prompt of token ids that ends inside a character
// makes it write "GARBAGE" first, as vLLM 0.32.0 writes the prompt's text
// then (docs/resume-facts.md): a proxy that continues there is caught.
type oracleLLM struct {
	mu       sync.Mutex
	perChunk int    // ids per chunk
	apiKey   string // --api-key: asked on every route
	modelLen int
	cuts     []int // per request: chunks before vLLM dies; -1 none
	down     func()
	log      []oracleReq
	// style of a death: "" the connection closes; "error" vLLM's
	// engine-error event; "error alive" the same with vLLM staying up (no
	// death); "abort" finish_reason abort (a planned restart's drain: no
	// death claimed).
	style  string
	downed func() // vLLM goes unready without a death claimed (abort)
}

type oracleReq struct {
	header http.Header
	path   string
	body   map[string]any
	prompt []int
	gen    []int // the ids it generated, as vLLM kept them
	text   string
}

// The vocabulary: ids 10..35 'a'..'z', 36 ' ', 37 38 'é', 39 40 41 '€',
// 42 "xy", 43 '!', 2 EOS; a prompt's byte b is 256+b.
const (
	tokEOS      = 2
	tokBang     = 43
	tokEAcute   = 37
	tokEuro     = 39
	oracleVocab = 44
)

func tokenBytes(id int, skipSpecial bool) []byte {
	switch {
	case id == tokEOS:
		if skipSpecial {
			return nil
		}
		return []byte("</s>")
	case id >= 256:
		return []byte{byte(id - 256)}
	case id >= 10 && id <= 35:
		return []byte{byte('a' + id - 10)}
	}
	return map[int][]byte{36: []byte(" "), 37: {0xc3}, 38: {0xa9}, 39: {0xe2}, 40: {0x82}, 41: {0xac},
		42: []byte("xy"), 43: []byte("!")}[id]
}

// forced is the id that must follow last (the rest of a character).
func forced(last int) int {
	return map[int]int{37: 38, 39: 40, 40: 41}[last]
}

type oracleParams struct {
	chat, ids, usage, keep, ignoreEOS, skipSpecial bool
	greedy                                         bool
	seed                                           int64
	seeded                                         bool
	maxTokens, minTokens                           int
	stops                                          []string
	stopIDs                                        []int
}

// num reads a number sent as a number or a string (pydantic is lax).
func num(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}

func boolOf(v any, def bool) bool {
	switch x := v.(type) {
	case bool:
		return x
	case string:
		return x == "true"
	}
	return def
}

func (o *oracleLLM) params(chat bool, b map[string]any, prompt []int) oracleParams {
	p := oracleParams{chat: chat, ids: boolOf(b["return_token_ids"], false), keep: boolOf(b["include_stop_str_in_output"], false),
		ignoreEOS: boolOf(b["ignore_eos"], false), skipSpecial: boolOf(b["skip_special_tokens"], true)}
	if so, ok := b["stream_options"].(map[string]any); ok {
		p.usage = boolOf(so["include_usage"], false)
	}
	t, ok := num(b["temperature"])
	p.greedy = ok && t == 0
	if s, ok := num(b["seed"]); ok {
		p.seed, p.seeded = int64(s), true
	}
	p.maxTokens = o.modelLen - len(prompt)
	if !chat {
		p.maxTokens = 16 // also for null
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if n, ok := num(b[k]); ok {
			p.maxTokens = int(n)
		}
	}
	if n, ok := num(b["min_tokens"]); ok {
		p.minTokens = int(n)
	}
	switch s := b["stop"].(type) {
	case string:
		p.stops = []string{s}
	case []any:
		for _, x := range s {
			p.stops = append(p.stops, x.(string))
		}
	}
	if l, ok := b["stop_token_ids"].([]any); ok {
		for _, x := range l {
			n, _ := num(x)
			p.stopIDs = append(p.stopIDs, int(n))
		}
	}
	return p
}

func oraclePrompt(chat bool, b map[string]any) []int {
	var prompt []int
	if chat {
		prompt = []int{1, 2}
		for _, m := range b["messages"].([]any) {
			for _, c := range []byte(m.(map[string]any)["content"].(string)) {
				prompt = append(prompt, 256+int(c))
			}
		}
		return append(prompt, 3)
	}
	switch x := b["prompt"].(type) {
	case string:
		prompt = []int{1}
		for _, c := range []byte(x) {
			prompt = append(prompt, 256+int(c))
		}
	case []any:
		for _, v := range x {
			n, _ := num(v)
			prompt = append(prompt, int(n))
		}
	}
	return prompt
}

// next picks the next id: forced within a character, else greedy (a hash of
// the sequence) or sampled (rng); EOS and stop ids not under min_tokens.
func next(seq []int, rng *rand.Rand, p oracleParams, n int) int {
	if f := forced(seq[len(seq)-1]); f != 0 {
		return f
	}
	var x uint64
	if rng != nil {
		x = rng.Uint64()
	} else {
		h := fnv.New64a()
		for _, id := range seq {
			fmt.Fprint(h, id, ",")
		}
		x = h.Sum64()
	}
	id := 10 + int(x%uint64(oracleVocab-10))
	if id == 38 || id == 40 || id == 41 {
		id = 36
	}
	if x%53 == 7 {
		id = tokEOS
	}
	if n < p.minTokens && (id == tokEOS || slices.Contains(p.stopIDs, id)) {
		id = 36
	}
	return id
}

// detok is vLLM's incremental detokenizer: text once the bytes are whole.
type detok struct {
	pending []byte
	garbage bool
}

func (d *detok) step(b []byte) string {
	d.pending = append(d.pending, b...)
	if !utf8.Valid(d.pending) {
		return ""
	}
	s := string(d.pending)
	d.pending = nil
	if d.garbage {
		d.garbage = false
		s = "GARBAGE" + s
	}
	return s
}

func (o *oracleLLM) handler(w http.ResponseWriter, r *http.Request) {
	if o.apiKey != "" && r.Header.Get("Authorization") != "Bearer "+o.apiKey {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":"Unauthorized"}`)
		return
	}
	if r.URL.Path == "/detokenize" {
		var d struct{ Tokens []int }
		_ = json.NewDecoder(r.Body).Decode(&d)
		b, _ := json.Marshal(map[string]string{"prompt": oracleText(d.Tokens, false)})
		w.Write(b)
		return
	}
	if r.URL.Path == "/v1/models" {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"m","object":"model","max_model_len":%d}]}`, o.modelLen)
		return
	}
	var b map[string]any
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	prompt := oraclePrompt(chat, b)
	p := o.params(chat, b, prompt)
	o.mu.Lock()
	cut := -1
	if len(o.cuts) > 0 {
		cut, o.cuts = o.cuts[0], o.cuts[1:]
	}
	o.log = append(o.log, oracleReq{header: r.Header.Clone(), path: r.URL.Path, body: b, prompt: prompt})
	idx := len(o.log) - 1
	per := o.perChunk
	o.mu.Unlock()
	g := &oracleGen{o: o, w: w, p: p, prompt: prompt, cut: cut, per: max(per, 1), idx: idx}
	g.run()
}

// oracleGen is one request's generation and stream.
type oracleGen struct {
	o      *oracleLLM
	w      http.ResponseWriter
	p      oracleParams
	prompt []int
	cut    int
	per    int
	idx    int

	chunks     int
	out        []rune // output text (vLLM's output_text)
	sent       int    // runes of out written
	gen        []int
	batchIDs   []int
	batchText  string
	promptSent bool
}

func (g *oracleGen) send(v string) {
	fmt.Fprintf(g.w, "data: %s\n\n", v)
	g.w.(http.Flusher).Flush()
}

func (g *oracleGen) run() {
	if g.cut == -2 {
		// vLLM dies before it answers.
		g.o.down()
		conn, _, err := http.NewResponseController(g.w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
		return
	}
	g.w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	g.w.WriteHeader(http.StatusOK) // (uvicorn sends the headers before the first chunk)
	g.w.(http.Flusher).Flush()
	if g.p.chat {
		pids := "null"
		if g.p.ids {
			b, _ := json.Marshal(g.prompt)
			pids, g.promptSent = string(b), true
		}
		g.send(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":` + pids + `,"prompt_text":null}`)
	}
	var rng *rand.Rand
	if !g.p.greedy {
		seed := g.p.seed
		if !g.p.seeded {
			h := fnv.New64a()
			fmt.Fprint(h, g.prompt)
			seed = int64(h.Sum64())
		}
		rng = rand.New(rand.NewSource(seed))
	}
	d := &detok{}
	if last := g.prompt[len(g.prompt)-1]; forced(last) != 0 {
		d.garbage = true
	}
	hold := 0
	if !g.p.keep {
		for _, s := range g.p.stops {
			hold = max(hold, utf8.RuneCountInString(s)-1)
		}
	}
	seq := slices.Clone(g.prompt)
	for n := 0; n < g.p.maxTokens; n++ {
		id := next(seq, rng, g.p, n)
		seq = append(seq, id)
		g.gen = append(g.gen, id)
		finish, stopReason := g.stepText(d, id, n+1)
		if finish == "" && n+1 == g.p.maxTokens {
			finish = "length"
		}
		end := len(g.out)
		if finish == "" {
			end = max(g.sent, len(g.out)-hold)
		}
		g.batchText += string(g.out[g.sent:end])
		g.sent = end
		g.batchIDs = append(g.batchIDs, id)
		if finish == "" && len(g.batchIDs) < g.per {
			continue
		}
		if g.cut >= 0 && g.chunks == g.cut {
			g.die()
			return
		}
		g.chunk(finish, stopReason)
		if finish != "" {
			break
		}
	}
	g.o.mu.Lock()
	g.o.log[g.idx].gen, g.o.log[g.idx].text = g.gen, string(g.out)
	g.o.mu.Unlock()
	if g.p.usage {
		c := len(g.gen)
		obj := `"text_completion","created":1,"model":"m"`
		id := `"cmpl-1"`
		if g.p.chat {
			obj, id = `"chat.completion.chunk","created":1,"model":"m"`, `"chatcmpl-1"`
		}
		g.send(fmt.Sprintf(`{"id":%s,"object":%s,"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`,
			id, obj, len(g.prompt), len(g.prompt)+c, c))
	}
	fmt.Fprint(g.w, "data: [DONE]\n\n")
}

// stepText applies id to the output text as vLLM's detokenizer does: the
// finish and stop_reason (JSON) when it stops there.
func (g *oracleGen) stepText(d *detok, id, n int) (finish, stopReason string) {
	stopTok := (id == tokEOS && !g.p.ignoreEOS) || slices.Contains(g.p.stopIDs, id)
	if stopTok && n > g.p.minTokens {
		if g.p.keep {
			g.out = append(g.out, []rune(d.step(tokenBytes(id, g.p.skipSpecial)))...)
		}
		if id == tokEOS {
			return "stop", "null"
		}
		return "stop", strconv.Itoa(id)
	}
	before := len(g.out)
	g.out = append(g.out, []rune(d.step(tokenBytes(id, g.p.skipSpecial)))...)
	if len(g.p.stops) == 0 || n <= g.p.minTokens || len(g.out) == before {
		return "", ""
	}
	bestAt, bestEnd, best := -1, 1<<30, ""
	for _, s := range g.p.stops {
		sr := []rune(s)
		from := max(0, before-len(sr)+1)
		if i := strings.Index(string(g.out[from:]), s); i >= 0 {
			at := from + utf8.RuneCountInString(string(g.out[from:])[:i])
			if at+len(sr) < bestEnd {
				bestAt, bestEnd, best = at, at+len(sr), s
			}
		}
	}
	if bestAt < 0 {
		return "", ""
	}
	if g.p.keep {
		g.out = g.out[:bestEnd]
	} else {
		g.out = g.out[:bestAt]
	}
	g.sent = min(g.sent, len(g.out))
	b, _ := json.Marshal(best)
	return "stop", string(b)
}

func (g *oracleGen) chunk(finish, stopReason string) {
	ids, pids := "null", "null"
	if g.p.ids {
		b, _ := json.Marshal(g.batchIDs)
		ids = string(b)
		if !g.promptSent && !g.p.chat {
			b, _ := json.Marshal(g.prompt)
			pids, g.promptSent = string(b), true
		}
	}
	text, _ := json.Marshal(g.batchText)
	fin := "null"
	if finish != "" {
		fin = `"` + finish + `"`
	}
	if stopReason == "" {
		stopReason = "null"
	}
	if g.p.chat {
		sr := ""
		if finish != "" {
			sr = `,"stop_reason":` + stopReason
		}
		g.send(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":` +
			string(text) + `},"logprobs":null,"finish_reason":` + fin + sr + `,"token_ids":` + ids + `}]}`)
	} else {
		g.send(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":` + string(text) +
			`,"logprobs":null,"finish_reason":` + fin + `,"stop_reason":` + stopReason + `,"prompt_token_ids":` + pids + `,"token_ids":` + ids + `}]}`)
	}
	g.chunks++
	g.batchIDs, g.batchText = nil, ""
}

// die is vLLM dying under the stream: the guard sees it go and records a
// death, and the connection closes.
func (g *oracleGen) die() {
	g.o.mu.Lock()
	g.o.log[g.idx].gen = g.gen[:len(g.gen)-len(g.batchIDs)]
	style := g.o.style
	g.o.mu.Unlock()
	switch style {
	case "error", "error alive":
		if style == "error" {
			g.o.down()
		}
		g.send(`{"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "param": null, "code": 500}}`)
		fmt.Fprint(g.w, "data: [DONE]\n\n")
		return
	case "abort":
		g.o.downed()
		g.batchIDs, g.batchText = []int{}, ""
		g.chunk("abort", "")
		fmt.Fprint(g.w, "data: [DONE]\n\n")
		return
	}
	g.o.down()
	conn, _, err := http.NewResponseController(g.w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

func (o *oracleLLM) requests() []oracleReq {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.log)
}

// oracleText is the text of ids as vLLM writes it for a request (no stop).
func oracleText(ids []int, skipSpecial bool) string {
	var b []byte
	for _, id := range ids {
		b = append(b, tokenBytes(id, skipSpecial)...)
	}
	return string(b)
}
