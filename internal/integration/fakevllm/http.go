package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// OpenAI-compatible HTTP API, the shapes vLLM answers with.

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type completionRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *laxInt         `json:"max_tokens"`
	MaxCompletionTokens *laxInt         `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// Sampling, as vLLM names it: greedy when temperature < 1e-5.
	Temperature            *laxFloat       `json:"temperature"`
	Seed                   *laxInt         `json:"seed"`
	Stop                   json.RawMessage `json:"stop"`
	StopTokenIDs           []laxInt        `json:"stop_token_ids"`
	IncludeStopStrInOutput bool            `json:"include_stop_str_in_output"`
	MinTokens              laxInt          `json:"min_tokens"`
	UseBeamSearch          bool            `json:"use_beam_search"`
	ReturnTokenIDs         bool            `json:"return_token_ids"`
	AddGenerationPrompt    *bool           `json:"add_generation_prompt"`
	// StreamInterval raises the server's --stream-interval for this
	// request (the larger of the two applies).
	StreamInterval *laxInt `json:"stream_interval"`
}

// seed is the request's seed, nil when unset.
func seed(n *laxInt) *int64 {
	if n == nil {
		return nil
	}
	v := int64(*n)
	return &v
}

// generationPrompt is add_generation_prompt, true unless set false.
func generationPrompt(p *bool) bool { return p == nil || *p }

type apiError struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(v)
	w.Write(b)
}

// nestedErrors: the process imitates vLLM 0.32.0, whose error bodies nest
// the error ({"error": {"message", "type", "param", "code"}}); the older
// servers answered the flat ErrorResponse. Set once, before serving.
var nestedErrors bool

func writeError(w http.ResponseWriter, code int, typ, message string, param string) {
	e := apiError{Object: "error", Message: message, Type: typ, Code: code}
	if param != "" {
		e.Param = &param
	}
	if nestedErrors {
		writeJSON(w, code, obj{{"error", obj{{"message", e.Message}, {"type", e.Type}, {"param", e.Param}, {"code", e.Code}}}})
		return
	}
	writeJSON(w, code, e)
}

const engineDeadMessage = "EngineCore encountered an issue. See stack trace (above) for the root cause."

// vLLM 0.32.0's error bodies nest the error (ErrorResponse{"error": ...});
// these are the exact bytes the real server sent during its drain.
const (
	drainNewRequestBody = `{"error":{"message":"cannot schedule new futures after shutdown","type":"InternalServerError","param":null,"code":500}}`
	drainCutEvent       = `data: {"error": {"message": "` + engineDeadMessage + `", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"
	drainCutBody        = `{"error":{"message":"` + engineDeadMessage + `","type":"InternalServerError","param":null,"code":500}}`
)

// deadStreamEvent is the event a stream ends with when the engine dies
// under it, vLLM's create_streaming_error_response (json.dumps: ", " and
// ": " between items). 0.32.0 dumps its ErrorResponse, which nests the
// error: the same bytes as its drain's cut (drainCutEvent). Earlier servers
// wrapped their flat ErrorResponse, object field and all, in {"error": ...}.
// No era sent the flat ErrorResponse itself as a stream event.
func (a *apiServer) deadStreamEvent() string {
	if a.env.Era == eraV1Plain {
		return drainCutEvent
	}
	return `data: {"error": {"object": "error", "message": "` + engineDeadMessage + `", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"
}

// writeEngineDead answers a plain request the dead engine cannot serve:
// 500 with EngineDeadError's message, nested in 0.32.0 (drainCutBody), flat
// before (the ErrorResponse of the older servers).
func (a *apiServer) writeEngineDead(w http.ResponseWriter) {
	if a.env.Era == eraV1Plain {
		writeRaw500(w, drainCutBody)
		return
	}
	writeError(w, http.StatusInternalServerError, "InternalServerError", engineDeadMessage, "")
}

func writeRaw500(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusInternalServerError)
	io.WriteString(w, body)
}

type route struct{ path, methods string }

// routes are the routes the app registers for the model's task, in the
// order vLLM prints them ("Route: /health, Methods: GET"). vLLM registers
// a pooling route only for a task the model serves: a generating model
// has none of them (404), a pooling model no completions (404).
func (a *apiServer) routes() []route {
	rs := []route{
		{"/openapi.json", "GET, HEAD"}, {"/docs", "GET, HEAD"}, {"/health", "GET"},
		{"/tokenize", "POST"}, {"/detokenize", "POST"},
		{"/metrics", "GET"}, {"/version", "GET"}, {"/v1/models", "GET"},
	}
	switch a.task {
	case "generate":
		rs = append(rs, route{"/v1/chat/completions", "POST"}, route{"/v1/completions", "POST"})
	case "embed":
		rs = append(rs, route{"/v1/embeddings", "POST"}, route{"/pooling", "POST"}, route{"/score", "POST"}, route{"/v1/score", "POST"})
	case "classify":
		rs = append(rs, route{"/classify", "POST"}, route{"/pooling", "POST"}, route{"/score", "POST"}, route{"/v1/score", "POST"}, route{"/rerank", "POST"}, route{"/v1/rerank", "POST"}, route{"/v2/rerank", "POST"})
	default:
		rs = append(rs, route{"/pooling", "POST"})
	}
	return append(rs, a.sleepRoutes()...)
}

func (a *apiServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", a.handleHealth)
	mux.HandleFunc("/v1/models", a.handleModels)
	mux.HandleFunc("/version", a.handleVersion)
	mux.HandleFunc("/metrics", a.handleMetrics)
	mux.HandleFunc("/tokenize", a.handleTokenize)
	mux.HandleFunc("/detokenize", a.handleDetokenize)
	a.registerSleepRoutes(mux)
	engineRoute := map[string]bool{"/tokenize": true, "/detokenize": true}
	for _, r := range a.routes() {
		if r.methods == "POST" {
			engineRoute[r.path] = true
		}
		switch r.path {
		case "/v1/completions":
			mux.HandleFunc(r.path, func(w http.ResponseWriter, r *http.Request) { a.handleCompletion(w, r, false) })
		case "/v1/chat/completions":
			mux.HandleFunc(r.path, func(w http.ResponseWriter, r *http.Request) { a.handleCompletion(w, r, true) })
		case "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank":
			kind := r.path[strings.LastIndex(r.path, "/")+1:]
			mux.HandleFunc(r.path, func(w http.ResponseWriter, r *http.Request) { a.handlePooling(w, r, kind) })
		}
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.blockIfHung(r)
		var rw http.ResponseWriter = w
		if a.accessLogOn() {
			rw = &accessLog{ResponseWriter: w, a: a, r: r}
		}
		if a.env.Era != eraV1Plain && a.draining.Load() && r.Method == http.MethodPost && (r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/chat/completions") {
			// Merged vLLM's drain: uvicorn keeps serving and a new request
			// is finished at once by the engine with finish_reason "abort",
			// nothing generated (status 200, no 503).
			a.abortAtOnce(rw, r)
			return
		}
		// vLLM's AuthenticationMiddleware: every path under /v1 needs
		// "Authorization: Bearer K" (any of the keys); OPTIONS passes.
		if len(a.apiKeys) > 0 && r.Method != http.MethodOptions && strings.HasPrefix(r.URL.Path, "/v1") && !a.authorized(r) {
			writeJSON(rw, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
			return
		}
		if a.env.Era == eraV1Plain && a.draining.Load() && r.Method == http.MethodPost && engineRoute[r.URL.Path] {
			// vLLM 0.32.0's drain as observed: uvicorn still serves, and
			// a new request fails at once on the stopped executor.
			writeRaw500(rw, drainNewRequestBody)
			return
		}
		a.inflight.Add(1)
		defer a.inflight.Add(-1)
		mux.ServeHTTP(rw, r)
	})
}

// authorized compares the bearer token with every key in constant time,
// as vLLM does (sha256 of each, compare_digest).
func (a *apiServer) authorized(r *http.Request) bool {
	scheme, param, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "bearer") {
		return false
	}
	got := sha256.Sum256([]byte(param))
	ok := 0
	for _, k := range a.apiKeys {
		want := sha256.Sum256([]byte(k))
		ok |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	return ok == 1
}

// servesModel: the request names one of the served names (or none).
func (a *apiServer) servesModel(name string) bool {
	if name == "" {
		return true
	}
	for _, n := range a.args.ServedNames {
		if n == name {
			return true
		}
	}
	return false
}

// respModel is the name a response carries: the one requested, else the first.
func (a *apiServer) respModel(name string) string {
	if name != "" {
		return name
	}
	return a.args.ServedName
}

// stopped ends a request whose generation was interrupted: the client
// left (nothing to do), the engine died on its own (an error, then
// [DONE] for streams), or the request was aborted or the engine killed
// (the connection is cut: no [DONE], as a killed vLLM does).
func (a *apiServer) cutIfAborted() {
	select {
	case <-a.abortCh:
		panic(http.ErrAbortHandler)
	default:
	}
	if a.cut.Load() {
		panic(http.ErrAbortHandler)
	}
}

// accessLog prints uvicorn's access line on stdout when the response
// starts, as uvicorn does (a stream is logged when its headers go out):
//
//	INFO:     127.0.0.1:53432 - "POST /v1/completions HTTP/1.1" 200 OK
type accessLog struct {
	http.ResponseWriter
	a      *apiServer
	r      *http.Request
	logged bool
}

func (l *accessLog) WriteHeader(code int) {
	if !l.logged {
		l.logged = true
		l.a.log.out.write([]byte(l.a.log.prefix +
			vllmlog.FormatAccess(uvicornClient(l.r), l.r.Method, l.r.URL.RequestURI(), l.r.Proto, code, http.StatusText(code)) + "\n"))
	}
	l.ResponseWriter.WriteHeader(code)
}

func (l *accessLog) Write(b []byte) (int, error) {
	if !l.logged {
		l.WriteHeader(http.StatusOK)
	}
	return l.ResponseWriter.Write(b)
}

func (l *accessLog) Flush() {
	if f, ok := l.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// blockIfHung makes every request hang while the hang_after fault is on:
// the process is alive, the port accepts, nothing answers.
func (a *apiServer) blockIfHung(r *http.Request) {
	if a.hung.Load() {
		<-r.Context().Done()
		select {} // the client left; never answer anyway
	}
}

func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
	return false
}

func (a *apiServer) handleHealth(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	if a.dead.Load() || a.health503.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (a *apiServer) handleVersion(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"version": versionOf(a.env.Era)})
}

func (a *apiServer) handleModels(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	data := []any{}
	for _, name := range a.args.ServedNames {
		if a.faults.has(fNeverReady) {
			break
		}
		data = append(data, map[string]any{
			"id": name, "object": "model", "created": a.startedAt.Unix(), "owned_by": "vllm",
			"root": a.args.Model, "parent": nil, "max_model_len": a.maxModelLen.Load(),
			"permission": []any{map[string]any{
				"id": "modelperm-" + a.reqID(), "object": "model_permission", "created": a.startedAt.Unix(),
				"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
				"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
				"organization": "*", "group": nil, "is_blocking": false,
			}},
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

var reqCounter atomic.Int64

func (a *apiServer) reqID() string {
	return fmt.Sprintf("%016x%016x", a.startedAt.UnixNano(), reqCounter.Add(1))
}

func (a *apiServer) handleCompletion(w http.ResponseWriter, r *http.Request, chat bool) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "could not read the request body: "+err.Error(), "")
		return
	}
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		var lax *laxError
		if errors.As(err, &lax) {
			lax.locate(body)
		}
		badJSON(w, err)
		return
	}
	if si := intPtr(req.StreamInterval); si != nil && *si < 1 && a.env.Era != eraV0 {
		// pydantic's refusal of the field (ge=1), as vLLM 0.32.0 words it.
		writeError(w, http.StatusBadRequest, "Bad Request", fmt.Sprintf("1 validation error:\n  {'type': 'greater_than_equal', 'loc': 'body.stream_interval', 'msg': 'Input should be greater than or equal to 1', 'input': '%d', 'ctx': {'ge': 1}}", *si), "body.stream_interval")
		return
	}
	if req.StreamOptions != nil && !req.Stream {
		writeError(w, http.StatusBadRequest, "BadRequestError", "Stream options can only be defined when `stream=True`.", "stream_options")
		return
	}
	if a.faults.has(fNeverReady) {
		writeError(w, http.StatusInternalServerError, "InternalServerError", "The model is not ready: no model is loaded.", "")
		return
	}
	if chat && !a.servesModel(req.Model) {
		a.logUnknownModel(req.Model)
	}
	if a.refuseUnknownModel(w, req.Model) {
		return
	}
	if a.dead.Load() {
		a.writeEngineDead(w)
		return
	}
	if req.Stream && req.UseBeamSearch {
		writeError(w, http.StatusBadRequest, "BadRequestError", "Streaming is not currently supported with beam search", "")
		return
	}
	var ids []int
	if chat {
		ids, err = chatPromptIDs(req.Messages, generationPrompt(req.AddGenerationPrompt))
	} else {
		ids, err = promptIDs(req.Prompt)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error(), "")
		return
	}
	prompt := len(ids)
	stop, err := newStopRule(&req, newTextStream(ids, a.env.SplitChars))
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error(), "stop")
		return
	}
	maxTokens, param, msg := a.maxTokens(&req, chat, prompt)
	if msg != "" {
		writeError(w, http.StatusBadRequest, "BadRequestError", msg, param)
		return
	}

	if err := a.admit(r, prompt); err != nil {
		if a.drainCut() {
			writeRaw500(w, drainCutBody)
		}
		return // the client went away while waiting
	}
	g := &generation{a: a, chat: chat, id: a.reqID(), created: time.Now().Unix(), promptIDs: ids, model: a.respModel(req.Model),
		shape032: a.env.Era == eraV1Plain,
		tokenIDs: req.ReturnTokenIDs && a.env.Era != eraV0, // vLLM ≥ 0.10.2
		sampler:  newSampler(ids, req.Temperature != nil && *req.Temperature < 1e-5, seed(req.Seed)),
		stop:     stop,
		interval: a.args.StreamInterval,
	}
	if si := intPtr(req.StreamInterval); si != nil {
		g.interval = max(g.interval, *si)
	}
	defer func() {
		a.sched.finish(prompt, g.n)
		if g.n > 0 { // the first token comes after the prefill
			a.sched.requestFinished(prompt)
		}
	}()
	defer a.requestDone()
	if chat {
		g.id = "chatcmpl-" + g.id
		a.logAddedRequest(r, "chatcmpl-", g.id)
	} else {
		g.id = "cmpl-" + g.id
		a.logAddedRequest(r, "cmpl-", g.id)
	}
	if req.Stream {
		g.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		g.stream(w, r, maxTokens)
		return
	}
	var text strings.Builder
	var out []int
	var last token
	if !g.generate(r, maxTokens, func(t token) bool {
		text.WriteString(t.text)
		out = append(out, t.id)
		last = t
		return true
	}) {
		a.cutIfAborted()
		if a.drainCut() {
			writeRaw500(w, drainCutBody)
		} else if a.dead.Load() {
			a.writeEngineDead(w)
		}
		return
	}
	writeJSON(w, http.StatusOK, g.answer(text.String(), out, last))
}

// maxTokens is how many ids a request may generate, as vLLM 0.32.0
// decides it (get_max_tokens in serve/utils/api_utils.py): completions'
// max_tokens, null or absent meaning 16 (its field's default, restored
// for null by normalize_null_max_tokens); chat's max_completion_tokens,
// else max_tokens, null or absent meaning no limit of its own; either
// capped by what max_model_len leaves after the prompt (a request that
// asks more is cut short with finish "length", not refused). Refused
// (param and message): a prompt longer than max_model_len, a limit above
// max_model_len, and a limit (or what is left) below 1. The older eras
// refuse a prompt plus max_tokens over max_model_len instead of capping.
func (a *apiServer) maxTokens(req *completionRequest, chat bool, prompt int) (n int, param, msg string) {
	mml := int(a.maxModelLen.Load())
	asked, param := intPtr(req.MaxTokens), "max_tokens"
	if chat && req.MaxCompletionTokens != nil {
		asked, param = intPtr(req.MaxCompletionTokens), "max_completion_tokens"
	}
	n = mml - prompt
	if asked != nil {
		n = *asked
	} else if !chat {
		n = 16
	}
	if a.env.Era != eraV1Plain {
		if n < 1 {
			return 0, "max_tokens", fmt.Sprintf("max_tokens must be at least 1, got %d.", n)
		}
		if prompt+n > mml {
			return 0, "", fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", mml, prompt+n, prompt, n)
		}
		return n, "", ""
	}
	switch {
	case n > mml:
		return 0, param, fmt.Sprintf("%s=%d cannot be greater than max_model_len=%d. Please request fewer output tokens. (parameter=%s, value=%d)", param, n, mml, param, n)
	case prompt > mml:
		return 0, "input_tokens", fmt.Sprintf("This model's maximum context length is %d tokens. However, your prompt contains %d input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=%d)", mml, prompt, prompt)
	}
	n = min(n, mml-prompt)
	if n < 1 {
		return 0, "max_tokens", fmt.Sprintf("max_tokens must be at least 1, got %d. (parameter=max_tokens, value=%d)", n, n)
	}
	return n, "", ""
}

// nextToken waits one token interval. It reports false when the request
// must stop: the client left or the engine died. Under hang_after it never
// returns.
func (a *apiServer) nextToken(r *http.Request) bool {
	if !a.holdWhileAsleep(r) {
		return false
	}
	if a.hung.Load() {
		a.blockIfHung(r)
	}
	if a.wedged.Load() {
		// A wedged engine (stuck collective, hung kernel): no token ever
		// comes; the request ends only when the client leaves or the
		// process is stopped.
		select {
		case <-r.Context().Done():
		case <-a.deadCh:
		case <-a.abortCh:
		case <-a.drainCutCh:
		}
		return false
	}
	if a.env.TokenInterval > 0 {
		t := time.NewTimer(a.env.TokenInterval)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return false
		case <-a.deadCh:
			return false
		case <-a.abortCh:
			return false
		case <-a.drainCutCh:
			return false
		}
	}
	select {
	case <-r.Context().Done():
		return false
	case <-a.deadCh:
		return false
	case <-a.abortCh:
		return false
	case <-a.drainCutCh:
		return false
	default:
	}
	if a.wedged.Load() {
		return a.nextToken(r)
	}
	if a.hung.Load() {
		a.blockIfHung(r)
	}
	return true
}

// generation is one completion or chat request being generated.
type generation struct {
	a         *apiServer
	chat      bool
	id        string
	created   int64
	promptIDs []int
	usage     bool // stream_options.include_usage
	model     string
	shape032  bool // vLLM 0.32.0's answer shapes (the v1 era)
	tokenIDs  bool // return_token_ids
	sampler   *sampler
	stop      *stopRule
	interval  int // ids per streamed chunk after the first (--stream-interval)
	n         int // ids generated
}

// token is one generated id, the text that goes out with it (text held
// back for stop strings comes later), and how the request ended when it
// did: finish "stop" (reason: the stop string or id) or "length".
type token struct {
	id     int
	text   string
	finish any
	reason any
}

// generate runs the request one id per token interval, handing each to
// emit (false: stop, the client is gone), up to maxTokens or a stop. It
// reports false when the request was stopped from outside: the client
// left, the engine died, the drain cut it.
func (g *generation) generate(r *http.Request, maxTokens int, emit func(token) bool) bool {
	for i := 0; i < maxTokens; i++ {
		if !g.a.nextToken(r) {
			return false
		}
		if i == 0 {
			g.a.sched.prefilled(len(g.promptIDs))
		}
		id := g.sampler.next()
		last := i == maxTokens-1
		text, reason, stopped := g.stop.step(id, last)
		t := token{id: id, text: text, reason: reason}
		switch {
		case stopped:
			t.finish = "stop"
		case last:
			t.finish = "length"
		}
		g.n++
		g.a.sched.generated(1)
		if !emit(t) || stopped {
			return true
		}
	}
	return true
}

// ids is a token-id field's value: the ids when the client asked for
// them, else null.
func (g *generation) ids(ids []int) any {
	if g.tokenIDs {
		return ids
	}
	return nil
}

func (g *generation) usageObj(n int, details bool) obj {
	p := len(g.promptIDs)
	u := obj{{"prompt_tokens", p}, {"total_tokens", p + n}, {"completion_tokens", n}}
	if details {
		u = append(u, kv{"prompt_tokens_details", nil}, kv{"completion_tokens_details", nil})
	}
	return u
}

func (g *generation) fingerprint() string {
	return systemFingerprint(versionOf(g.a.env.Era), g.model)
}

// answer is a non-streaming request's answer. vLLM 0.32.0 (the v1 era)
// writes every field of its response models, null when unset: token ids
// in the choice, and the chat's prompt ids at the top level (completions:
// in the choice). The older eras write the OpenAI fields and the token
// ids only when asked for.
func (g *generation) answer(text string, out []int, last token) obj {
	head := obj{{"id", g.id}, {"object", "text_completion"}, {"created", g.created}, {"model", g.model}}
	var choice obj
	if g.chat {
		head[1].v = "chat.completion"
		msg := obj{{"role", "assistant"}, {"content", text}, {"tool_calls", []any{}}}
		if g.shape032 {
			msg = obj{{"role", "assistant"}, {"content", text}, {"refusal", nil}, {"annotations", nil}, {"audio", nil}, {"function_call", nil}, {"reasoning", nil}}
		}
		choice = obj{{"index", 0}, {"message", msg}, {"logprobs", nil}, {"finish_reason", last.finish}, {"stop_reason", last.reason}}
		if g.shape032 || g.tokenIDs {
			choice = append(choice, kv{"token_ids", g.ids(out)})
		}
		if g.shape032 {
			choice = append(choice, kv{"routed_experts", nil})
		}
	} else {
		choice = obj{{"index", 0}, {"text", text}, {"logprobs", nil}, {"finish_reason", last.finish}, {"stop_reason", last.reason}}
		if g.shape032 {
			choice = append(choice, kv{"token_ids", g.ids(out)}, kv{"prompt_logprobs", nil}, kv{"prompt_token_ids", g.ids(g.promptIDs)}, kv{"routed_experts", nil})
		} else if g.tokenIDs {
			choice = append(choice, kv{"token_ids", out}, kv{"prompt_token_ids", g.promptIDs})
		}
	}
	m := append(head, kv{"choices", []any{choice}})
	if !g.shape032 {
		m = append(m, kv{"usage", g.usageObj(len(out), false)})
		if g.chat && g.tokenIDs {
			m = append(m, kv{"prompt_token_ids", g.promptIDs})
		}
		return m
	}
	m = append(m, kv{"service_tier", nil}, kv{"system_fingerprint", g.fingerprint()}, kv{"usage", g.usageObj(len(out), true)})
	if g.chat {
		m = append(m, kv{"prompt_logprobs", nil}, kv{"prompt_token_ids", g.ids(g.promptIDs)}, kv{"prompt_text", nil})
	}
	return append(m, kv{"kv_transfer_params", nil}, kv{"ec_transfer_params", nil}, kv{"metrics", nil})
}

// chunk is one streamed event: the choice (nil: the usage chunk) and
// what vLLM adds at the top level.
func (g *generation) chunk(choice obj, extra ...kv) []byte {
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	m := obj{{"id", g.id}, {"object", object}, {"created", g.created}, {"model", g.model}}
	if choice != nil {
		m = append(m, kv{"choices", []any{choice}})
	} else {
		m = append(m, kv{"choices", []any{}})
	}
	m = append(m, extra...)
	b, _ := json.Marshal(m)
	return []byte("data: " + string(b) + "\n\n")
}

// stream writes the request's SSE events as vLLM does, then "data:
// [DONE]". The first id goes out in a chunk of its own, then a chunk every
// interval ids (--stream-interval, or the request's stream_interval when
// larger), and the last chunk, with the finish_reason, carries whatever is
// left: at --stream-interval 2, ten ids come as 1, 2, 2, 2, 2, 1 (vLLM's
// output processor, RequestState.make_request_output). A chunk's text is
// the text its ids completed ("" when a character is still incomplete or
// held back for a stop string), its token_ids those ids. A completions
// chunk's choice carries the prompt's ids on the first chunk and the
// chunk's ids on each (with return_token_ids). A chat stream starts with
// the role chunk, sent with the first chunk (vLLM sends it when the first
// output arrives), which carries the prompt's ids at the top level; each
// later chunk carries its ids in the choice. In the v1 era the token-id
// keys are always there, null unless asked for, and system_fingerprint is
// on the last chunk (the usage chunk when there is one).
func (g *generation) stream(w http.ResponseWriter, r *http.Request, maxTokens int) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	send := func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	first := true
	var pending outChunk
	ok := g.generate(r, maxTokens, func(t token) bool {
		pending.add(t)
		if !first && t.finish == nil && len(pending.ids) < g.interval {
			return true
		}
		if first && g.chat && !send(g.roleChunk()) {
			return false
		}
		b := g.outChunk(pending, first)
		first, pending = false, outChunk{}
		return send(b)
	})
	if !ok {
		g.a.cutIfAborted()
		if g.a.drainCut() {
			// vLLM 0.32.0's drain cut: its stream generator's error.
			send([]byte(drainCutEvent))
			send([]byte("data: [DONE]\n\n"))
		} else if g.a.dead.Load() {
			send([]byte(g.a.deadStreamEvent()))
			send([]byte("data: [DONE]\n\n"))
		}
		return
	}
	if g.usage {
		var fp []kv
		if g.shape032 {
			fp = []kv{{"system_fingerprint", g.fingerprint()}}
		}
		send(g.chunk(nil, append([]kv{{"usage", g.usageObj(g.n, false)}}, fp...)...))
	}
	send([]byte("data: [DONE]\n\n"))
}

// outChunk is what one streamed chunk carries: the ids since the last
// chunk, their text, and how the request ended when it did.
type outChunk struct {
	ids    []int
	text   string
	finish any
	reason any
}

func (c *outChunk) add(t token) {
	c.ids = append(c.ids, t.id)
	c.text += t.text
	c.finish, c.reason = t.finish, t.reason
}

// roleChunk is a chat stream's first chunk: the assistant's role, no
// text, the prompt's ids at the top level.
func (g *generation) roleChunk() []byte {
	role := obj{{"index", 0}, {"delta", obj{{"role", "assistant"}, {"content", ""}}}, {"logprobs", nil}, {"finish_reason", nil}}
	var head []kv
	if g.shape032 {
		head = []kv{{"prompt_token_ids", g.ids(g.promptIDs)}, {"prompt_text", nil}}
	} else if g.tokenIDs {
		head = []kv{{"prompt_token_ids", g.promptIDs}}
	}
	return g.chunk(role, head...)
}

// outChunk renders one chunk of generated ids (first: the stream's first).
func (g *generation) outChunk(c outChunk, first bool) []byte {
	var choice obj
	if g.chat {
		choice = obj{{"index", 0}, {"delta", obj{{"content", c.text}}}, {"logprobs", nil}, {"finish_reason", c.finish}}
		if c.finish != nil {
			choice = append(choice, kv{"stop_reason", c.reason})
		}
		if g.shape032 || g.tokenIDs {
			choice = append(choice, kv{"token_ids", g.ids(c.ids)})
		}
	} else {
		choice = obj{{"index", 0}, {"text", c.text}, {"logprobs", nil}, {"finish_reason", c.finish}, {"stop_reason", c.reason}}
		if g.shape032 || g.tokenIDs {
			var prompt any
			if first {
				prompt = g.ids(g.promptIDs)
			}
			choice = append(choice, kv{"prompt_token_ids", prompt}, kv{"token_ids", g.ids(c.ids)})
		}
	}
	var top []kv
	if c.finish != nil && g.shape032 && !g.usage {
		top = append(top, kv{"system_fingerprint", g.fingerprint()})
	}
	return g.chunk(choice, top...)
}

// handleMetrics renders vLLM's Prometheus metrics plus the simulator's
// ground truth (fakevllm_*), which tests compare the guard's estimates with.
func (a *apiServer) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	s := a.sched.snapshot()
	bg := a.background()
	running := min(a.args.MaxNumSeqs, s.Running+bg)
	waiting := s.Waiting + max(0, s.Running+bg-a.args.MaxNumSeqs)
	kvUse := 0.0
	if kv := a.kvTokens.Load(); kv > 0 {
		kvUse = min(1, float64(s.KVInUse)/float64(kv))
	}
	labels := fmt.Sprintf(`{engine="0",model_name=%q}`, a.args.ServedName)
	kvName := "vllm:kv_cache_usage_perc"
	if a.env.Era == eraV0 {
		labels = fmt.Sprintf(`{model_name=%q}`, a.args.ServedName)
		kvName = "vllm:gpu_cache_usage_perc"
	}
	var b strings.Builder
	metric := func(name, typ, help string, v float64) {
		if a.args.DisableLogStats {
			return // --disable-log-stats: no vllm: series at all
		}
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s%s %s\n", name, help, name, typ, name, labels, pyFloat(v))
	}
	metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", float64(running))
	metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float64(waiting))
	metric(kvName, "gauge", "KV-cache usage. 1 means 100 percent usage.", kvUse)
	metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", 0)
	metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(s.PromptTotal))
	metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", float64(s.GenTotal))
	if !a.args.DisableLogStats {
		bounds := bucketsOneTwoFive(int(a.maxModelLen.Load()))
		cum, count, sum := a.sched.promptHistogram(bounds)
		name := "vllm:request_prompt_tokens"
		inner := strings.TrimSuffix(labels, "}")
		fmt.Fprintf(&b, "# HELP %s Number of prefill tokens processed.\n# TYPE %s histogram\n", name, name)
		for i, bound := range bounds {
			fmt.Fprintf(&b, "%s_bucket%s,le=%q} %s\n", name, inner, pyFloat(float64(bound)), pyFloat(float64(cum[i])))
		}
		fmt.Fprintf(&b, "%s_bucket%s,le=\"+Inf\"} %s\n", name, inner, pyFloat(float64(count)))
		fmt.Fprintf(&b, "%s_count%s %s\n%s_sum%s %s\n", name, labels, pyFloat(float64(count)), name, labels, pyFloat(float64(sum)))
	}
	a.sleepMetrics(&b, labels)
	fmt.Fprintf(&b, "# HELP fakevllm_gpu_used_bytes Simulator truth: memory used on the device (reserved + every live process), as NVML reports it.\n# TYPE fakevllm_gpu_used_bytes gauge\nfakevllm_gpu_used_bytes %d\n", a.deviceUsed.Load())
	fmt.Fprintf(&b, "# HELP fakevllm_true_seq_cost_bytes Simulator truth: activation memory of one running sequence.\n# TYPE fakevllm_true_seq_cost_bytes gauge\nfakevllm_true_seq_cost_bytes %d\n", a.env.SeqCost)
	fmt.Fprintf(&b, "# HELP fakevllm_true_safe_max_num_seqs Simulator truth: the largest max_num_seqs whose full-batch peak fits the device now.\n# TYPE fakevllm_true_safe_max_num_seqs gauge\nfakevllm_true_safe_max_num_seqs %d\n", a.safeSeqs.Load())
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(w, b.String())
}

// requestDone counts finished generation requests, for the
// wedge_after_requests fault.
func (a *apiServer) requestDone() {
	n, ok := a.faults.count(fWedgeAfterReq)
	if ok && a.completed.Add(1) == int64(n) {
		a.wedge()
	}
}

func (a *apiServer) wedge() {
	if a.wedged.CompareAndSwap(false, true) {
		a.env.fired()
	}
}

// poolingRequest is the union of the pooling endpoints' inputs.
type poolingRequest struct {
	Model     string          `json:"model"`
	Input     json.RawMessage `json:"input"`
	Text1     json.RawMessage `json:"text_1"`
	Text2     json.RawMessage `json:"text_2"`
	Query     json.RawMessage `json:"query"`
	Documents json.RawMessage `json:"documents"`
}

// handlePooling serves a pooling model's endpoints (embeddings, pooling,
// classify, score, rerank): one engine step per request, through the
// same scheduler as generation, so the running count and the prompt
// token counter move; no generation tokens.
func (a *apiServer) handlePooling(w http.ResponseWriter, r *http.Request, kind string) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "could not read the request body: "+err.Error(), "")
		return
	}
	var req poolingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badJSON(w, err)
		return
	}
	if a.refuseUnknownModel(w, req.Model) {
		return
	}
	if a.dead.Load() {
		a.writeEngineDead(w)
		return
	}
	inputs := 0
	prompt := 0
	for _, raw := range []json.RawMessage{req.Input, req.Text1, req.Text2, req.Query, req.Documents} {
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		n, err := promptTokens(raw)
		if err != nil {
			writeError(w, http.StatusBadRequest, "BadRequestError", err.Error(), "input")
			return
		}
		prompt += n
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) == nil {
			inputs = max(inputs, len(list))
		} else {
			inputs = max(inputs, 1)
		}
	}
	if inputs == 0 {
		writeError(w, http.StatusBadRequest, "BadRequestError", "input is required", "input")
		return
	}
	if err := a.admit(r, prompt); err != nil {
		if a.drainCut() {
			writeRaw500(w, drainCutBody)
		}
		return
	}
	defer a.sched.finish(prompt, 0)
	defer a.requestDone()
	if !a.nextToken(r) {
		a.cutIfAborted()
		if a.drainCut() {
			writeRaw500(w, drainCutBody)
		} else if a.dead.Load() {
			a.writeEngineDead(w)
		}
		return
	}
	a.sched.prefilled(prompt)
	a.sched.requestFinished(prompt)
	vec := func(i int) []float64 {
		v := make([]float64, 8)
		for j := range v {
			v[j] = float64((i+1)*(j+3)%17)/17 - 0.5
		}
		return v
	}
	var data []any
	object := "list"
	for i := 0; i < inputs; i++ {
		switch kind {
		case "embeddings":
			data = append(data, map[string]any{"index": i, "object": "embedding", "embedding": vec(i)})
		case "pooling":
			data = append(data, map[string]any{"index": i, "object": "pooling", "data": vec(i)})
		case "classify":
			data = append(data, map[string]any{"index": i, "label": "LABEL_0", "probs": []float64{0.75, 0.25}, "num_classes": 2})
		case "score":
			data = append(data, map[string]any{"index": i, "object": "score", "score": 0.5})
		case "rerank":
			data = append(data, map[string]any{"index": i, "relevance_score": 0.5})
		}
	}
	id := kind + "-" + a.reqID()
	out := map[string]any{
		"id": id, "object": object, "created": time.Now().Unix(), "model": a.respModel(req.Model),
		"data": data, "usage": map[string]int{"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0},
	}
	if kind == "rerank" {
		out["results"] = data
		delete(out, "data")
	}
	writeJSON(w, http.StatusOK, out)
}

// abortAtOnce answers a request that arrived during the drain as merged
// vLLM does: accepted, then finished at once with finish_reason "abort"
// and nothing generated, in the shape of its endpoint (a stream: one empty
// chunk with the abort, then [DONE]).
func (a *apiServer) abortAtOnce(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool   `json:"stream"`
		Model  string `json:"model"`
	}
	json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req)
	chat := r.URL.Path == "/v1/chat/completions"
	now := time.Now().Unix()
	choice := map[string]any{"index": 0, "finish_reason": "abort", "logprobs": nil}
	obj, id := "text_completion", "cmpl-drain"
	if chat {
		obj, id = "chat.completion", "chatcmpl-drain"
	}
	if !req.Stream {
		if chat {
			choice["message"] = map[string]any{"role": "assistant", "content": ""}
		} else {
			choice["text"] = ""
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": obj, "created": now, "model": a.respModel(req.Model),
			"choices": []any{choice}, "usage": map[string]int{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
		return
	}
	if chat {
		choice["delta"] = map[string]any{}
		obj = "chat.completion.chunk"
	} else {
		choice["text"] = ""
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	b, _ := json.Marshal(map[string]any{"id": id, "object": obj, "created": now, "model": a.respModel(req.Model), "choices": []any{choice}})
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
}

// admit waits for a running slot until the client leaves or the v1
// era's drain cuts the requests in flight (waiting ones included).
func (a *apiServer) admit(r *http.Request, prompt int) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-a.drainCutCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	return a.sched.admit(ctx, prompt)
}

// tokenizeRequest is /tokenize's input: a prompt, or chat messages.
type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

// badJSON answers a body that is not the JSON the route takes, as vLLM does.
func badJSON(w http.ResponseWriter, err error) {
	var lax *laxError
	if errors.As(err, &lax) {
		writeError(w, http.StatusBadRequest, "Bad Request", lax.Error(), lax.loc)
		return
	}
	writeError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error(), "")
}

// refuseUnknownModel answers 404 as vLLM does when model is not one it
// serves, and says whether it did.
func (a *apiServer) refuseUnknownModel(w http.ResponseWriter, model string) bool {
	if a.servesModel(model) {
		return false
	}
	writeError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model), "model")
	return true
}

// handleTokenize is vLLM's POST /tokenize (open without the API key):
// {"count", "max_model_len", "tokens", "token_strs": null}.
func (a *apiServer) handleTokenize(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	var req tokenizeRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		badJSON(w, err)
		return
	}
	if a.refuseUnknownModel(w, req.Model) {
		return
	}
	var ids []int
	var s string
	var err error
	switch {
	case len(req.Messages) > 0:
		ids, err = chatPromptIDs(req.Messages, generationPrompt(req.AddGenerationPrompt))
	case json.Unmarshal(req.Prompt, &s) == nil:
		ids = tokenIDs(s)
	default:
		// vLLM 0.32.0's /tokenize takes text or messages, not token ids.
		err = errors.New("prompt must be a string (or give messages)")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error(), "prompt")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": a.maxModelLen.Load(), "tokens": ids, "token_strs": nil})
}

// handleDetokenize is vLLM's POST /detokenize: {"tokens": [...]} →
// {"prompt": "..."} (the ids' words, vLLM's skip_special_tokens).
func (a *apiServer) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	var req struct {
		Model  string `json:"model"`
		Tokens []int  `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		badJSON(w, err)
		return
	}
	if a.refuseUnknownModel(w, req.Model) {
		return
	}
	for _, id := range req.Tokens {
		if id < 0 || id >= vocabSize {
			writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("token id %d is out of vocabulary", id), "tokens")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": detokenize(req.Tokens, a.env.SplitChars)})
}
