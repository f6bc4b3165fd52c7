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
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// promptTokens estimates a prompt's tokens as vLLM's tokenizer roughly
// would: a quarter of the characters (at least 1); token-id arrays count
// their ids.
func promptTokens(raw json.RawMessage) (int, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || string(raw) == "null" {
		return 0, errors.New("prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return textTokens(s), nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return 0, errors.New("prompt must be a string, a list of strings or a list of token ids")
	}
	if len(list) == 0 {
		return 0, errors.New("prompt must not be empty")
	}
	total := 0
	for _, item := range list {
		var n json.Number
		var ids []int64
		switch {
		case json.Unmarshal(item, &s) == nil:
			total += textTokens(s)
		case json.Unmarshal(item, &n) == nil:
			total++
		case json.Unmarshal(item, &ids) == nil:
			total += len(ids)
		default:
			return 0, errors.New("prompt must be a string, a list of strings or a list of token ids")
		}
	}
	return max(total, 1), nil
}

// chatTokens counts the tokens of every message's content (a string or
// a list of {"type":"text","text":...} parts).
func chatTokens(msgs []chatMessage) (int, error) {
	if len(msgs) == 0 {
		return 0, errors.New("messages must not be empty")
	}
	chars := 0
	for i, m := range msgs {
		c := strings.TrimSpace(string(m.Content))
		if c == "" || c == "null" {
			continue
		}
		var s string
		if err := json.Unmarshal([]byte(c), &s); err == nil {
			chars += len(s)
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal([]byte(c), &parts); err != nil {
			return 0, fmt.Errorf("messages[%d].content must be a string or a list of content parts", i)
		}
		for _, p := range parts {
			chars += len(p.Text)
		}
	}
	return max(chars/4, 1), nil
}

func textTokens(s string) int { return max(len(s)/4, 1) }

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

func writeError(w http.ResponseWriter, code int, typ, message string, param string) {
	e := apiError{Object: "error", Message: message, Type: typ, Code: code}
	if param != "" {
		e.Param = &param
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
	return rs
}

func (a *apiServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", a.handleHealth)
	mux.HandleFunc("/v1/models", a.handleModels)
	mux.HandleFunc("/version", a.handleVersion)
	mux.HandleFunc("/metrics", a.handleMetrics)
	mux.HandleFunc("/tokenize", a.handleTokenize)
	mux.HandleFunc("/detokenize", a.handleDetokenize)
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

var words = []string{" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."}

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
		badJSON(w, err)
		return
	}
	if a.faults.has(fNeverReady) {
		writeError(w, http.StatusInternalServerError, "InternalServerError", "The model is not ready: no model is loaded.", "")
		return
	}
	if a.refuseUnknownModel(w, req.Model) {
		return
	}
	if a.dead.Load() {
		writeError(w, http.StatusInternalServerError, "InternalServerError", engineDeadMessage, "")
		return
	}
	var prompt int
	if chat {
		prompt, err = chatTokens(req.Messages)
	} else {
		prompt, err = promptTokens(req.Prompt)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error(), "")
		return
	}
	maxTokens := 16
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	} else if req.MaxCompletionTokens != nil {
		maxTokens = *req.MaxCompletionTokens
	}
	if maxTokens < 1 {
		writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("max_tokens must be at least 1, got %d.", maxTokens), "max_tokens")
		return
	}
	if mml := int(a.maxModelLen.Load()); prompt+maxTokens > mml {
		writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", mml, prompt+maxTokens, prompt, maxTokens), "")
		return
	}

	if err := a.admit(r, prompt); err != nil {
		if a.drainCut() {
			writeRaw500(w, drainCutBody)
		}
		return // the client went away while waiting
	}
	generated := 0
	defer func() {
		a.sched.finish(prompt, generated)
		if generated > 0 { // the first token comes after the prefill
			a.sched.requestFinished(prompt)
		}
	}()

	defer a.requestDone()
	g := &generation{a: a, chat: chat, id: a.reqID(), created: time.Now().Unix(), prompt: prompt, model: a.respModel(req.Model)}
	if chat {
		g.id = "chatcmpl-" + g.id
	} else {
		g.id = "cmpl-" + g.id
	}
	if req.Stream {
		g.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		generated = g.stream(w, r, maxTokens)
		return
	}
	var text strings.Builder
	for i := 0; i < maxTokens; i++ {
		if !a.nextToken(r) {
			a.cutIfAborted()
			if a.drainCut() {
				writeRaw500(w, drainCutBody)
			} else if a.dead.Load() {
				writeError(w, http.StatusInternalServerError, "InternalServerError", engineDeadMessage, "")
			}
			return
		}
		if i == 0 {
			a.sched.prefilled(prompt)
		}
		text.WriteString(words[i%len(words)])
		generated++
		a.sched.generated(1)
	}
	usage := map[string]int{"prompt_tokens": prompt, "total_tokens": prompt + generated, "completion_tokens": generated}
	var choice map[string]any
	object := "text_completion"
	if chat {
		object = "chat.completion"
		choice = map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text.String(), "tool_calls": []any{}}, "logprobs": nil, "finish_reason": "length", "stop_reason": nil}
	} else {
		choice = map[string]any{"index": 0, "text": text.String(), "logprobs": nil, "finish_reason": "length", "stop_reason": nil}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": g.id, "object": object, "created": g.created, "model": g.model,
		"choices": []any{choice}, "usage": usage,
	})
}

// nextToken waits one token interval. It reports false when the request
// must stop: the client left or the engine died. Under hang_after it never
// returns.
func (a *apiServer) nextToken(r *http.Request) bool {
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

type generation struct {
	a       *apiServer
	chat    bool
	id      string
	created int64
	prompt  int
	usage   bool
	model   string
}

func (g *generation) chunk(choice map[string]any, usage map[string]int) []byte {
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	m := map[string]any{"id": g.id, "object": object, "created": g.created, "model": g.model}
	if choice != nil {
		m["choices"] = []any{choice}
	} else {
		m["choices"] = []any{}
	}
	if usage != nil {
		m["usage"] = usage
	}
	b, _ := json.Marshal(m)
	return []byte("data: " + string(b) + "\n\n")
}

// stream writes one SSE event per token, then "data: [DONE]". It returns
// the tokens generated.
func (g *generation) stream(w http.ResponseWriter, r *http.Request, maxTokens int) int {
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
	if g.chat {
		if !send(g.chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}, nil)) {
			return 0
		}
	}
	n := 0
	for i := 0; i < maxTokens; i++ {
		if !g.a.nextToken(r) {
			g.a.cutIfAborted()
			if g.a.drainCut() {
				// vLLM 0.32.0's drain cut: its stream generator's error.
				send([]byte(drainCutEvent))
				send([]byte("data: [DONE]\n\n"))
			} else if g.a.dead.Load() {
				b, _ := json.Marshal(apiError{Object: "error", Message: engineDeadMessage, Type: "InternalServerError", Code: 500})
				send([]byte("data: " + string(b) + "\n\n"))
				send([]byte("data: [DONE]\n\n"))
			}
			return n
		}
		var finish any
		if i == maxTokens-1 {
			finish = "length"
		}
		var choice map[string]any
		if g.chat {
			choice = map[string]any{"index": 0, "delta": map[string]any{"content": words[i%len(words)]}, "logprobs": nil, "finish_reason": finish}
		} else {
			choice = map[string]any{"index": 0, "text": words[i%len(words)], "logprobs": nil, "finish_reason": finish, "stop_reason": nil}
		}
		if i == 0 {
			g.a.sched.prefilled(g.prompt)
		}
		n++
		g.a.sched.generated(1)
		if !send(g.chunk(choice, nil)) {
			return n
		}
	}
	if g.usage {
		send(g.chunk(nil, map[string]int{"prompt_tokens": g.prompt, "total_tokens": g.prompt + n, "completion_tokens": n}))
	}
	send([]byte("data: [DONE]\n\n"))
	return n
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
		writeError(w, http.StatusInternalServerError, "InternalServerError", engineDeadMessage, "")
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
			writeError(w, http.StatusInternalServerError, "InternalServerError", engineDeadMessage, "")
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
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []chatMessage   `json:"messages"`
}

// tokenIDs stands in for the tokenizer: one id per four characters of
// text (as promptTokens counts), in a 32000-token vocabulary; token-id
// prompts are their own ids.
func tokenIDs(text string) []int {
	n := textTokens(text)
	ids := make([]int, n)
	for i := range ids {
		chunk := text[min(len(text), i*4):min(len(text), i*4+4)]
		h := 0
		for _, c := range []byte(chunk) {
			h = (h*131 + int(c)) % 31000
		}
		ids[i] = 1000 + h // clear of the special tokens
	}
	return ids
}

// badJSON answers a body that is not the JSON the route takes, as vLLM does.
func badJSON(w http.ResponseWriter, err error) {
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
	switch {
	case len(req.Messages) > 0:
		var text strings.Builder
		for _, m := range req.Messages {
			var s string
			if json.Unmarshal(m.Content, &s) == nil {
				text.WriteString(s)
			}
		}
		ids = tokenIDs(text.String())
	default:
		var s string
		var given []int
		switch {
		case json.Unmarshal(req.Prompt, &s) == nil:
			ids = tokenIDs(s)
		case json.Unmarshal(req.Prompt, &given) == nil && len(given) > 0:
			ids = given
		default:
			writeError(w, http.StatusBadRequest, "BadRequestError", "prompt must be a string or a list of token ids (or give messages)", "prompt")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": a.maxModelLen.Load(), "tokens": ids, "token_strs": nil})
}

// handleDetokenize is vLLM's POST /detokenize: {"tokens": [...]} →
// {"prompt": "..."} (the simulator's words, one per id).
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
	var text strings.Builder
	for _, id := range req.Tokens {
		if id < 0 {
			writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("token id %d is out of vocabulary", id), "tokens")
			return
		}
		text.WriteString(words[id%len(words)])
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": text.String()})
}
