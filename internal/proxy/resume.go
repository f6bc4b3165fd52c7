// A stream that vLLM cut is resumed, not ended (issue 30, item 3). The
// proxy asks vLLM for the token ids it generates (return_token_ids), reads
// the stream itself and remembers the prompt's token ids and the ids it has
// delivered. When vLLM dies under the stream while its client is still
// there, the proxy holds the stream (an SSE comment every few seconds, so
// that neither client nor load balancer times it out) until vLLM is ready
// again, and then:
//   - nothing delivered yet: sends the request again (the chat role delta
//     the client already has is not repeated; the id and created stay);
//   - tokens delivered: sends a continuation, a /v1/completions request
//     whose prompt is the prompt's token ids followed by those delivered,
//     with the same sampling parameters and max_tokens less what was
//     delivered, and rewrites its chunks into the original's shape.
//
// Greedy decoding continues exactly: the model sees the same tokens. A
// sampled stream continues from the same prefix with a fresh random state
// (a seed no longer reproduces the whole sample), and output-dependent
// penalties (presence, frequency, repetition) see the delivered tokens as
// prompt.

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
)

// resumeDialWait: a resumed stream's request waits this long at most for
// vLLM to take its connection (the queue deadline passed while it ran).
const resumeDialWait = 2 * time.Minute

// Why a stream is not resumed (the streams_not_resumed_total reasons).
const (
	nrN              = "n"                 // several choices: one prefix cannot continue them all
	nrBeamSearch     = "beam_search"       // beams are not a prefix of one sequence
	nrStructured     = "structured_output" // the grammar's state at the cut is not rebuilt from a token prefix
	nrTools          = "tools"             // the tool-call parser's state is lost with the stream
	nrEcho           = "echo"              // the prompt is part of the answer
	nrLogprobs       = "logprobs"          // offsets and top-logprob sets would need rewriting
	nrSuffix         = "suffix"            // fill-in-the-middle: the suffix is not a prefix
	nrPrompts        = "several_prompts"   // one choice per prompt
	nrMultimodal     = "multimodal"        // images, audio: not in a token-id prompt
	nrEmbeds         = "prompt_embeds"     // no token ids to continue from
	nrNoReplay       = "no_replay_copy"    // the body is not held to be sent again
	nrBadBody        = "unparsed_body"     // not a JSON object the proxy can read
	nrNoTokenIDs     = "no_token_ids"      // vLLM did not say which tokens it sent
	nrReasoning      = "reasoning"         // reasoning or tool-call deltas: their parser's state is lost
	nrUnknownChunk   = "unknown_chunk"     // an event the proxy does not understand
	nrLimit          = "resume_limit"      // in flight at [proxy] resume_limit deaths in a row
	nrHoldFailed     = "hold_failed"       // vLLM did not come back in time
	nrContinuationKO = "continuation_refused"
)

// streamPlan is what the proxy knows of an eligible stream's request.
type streamPlan struct {
	chat      bool
	fields    map[string]json.RawMessage // the request as the client sent it
	forward   []byte                     // what is sent to vLLM: return_token_ids added
	wantIDs   bool                       // the client asked for token ids itself
	usage     bool                       // stream_options.include_usage
	maxTokens int                        // -1: no limit given
	minTokens int
	stops     []string // stop strings
	keepStop  bool     // include_stop_str_in_output as the client asked
}

// planStream says whether r (an inference request whose body is b) is a
// stream the proxy can resume. plan is nil and reason "" for a request
// that is not a completion or chat stream at all.
func planStream(path string, body []byte) (plan *streamPlan, reason string) {
	chat := path == "/v1/chat/completions"
	if !chat && path != "/v1/completions" {
		return nil, ""
	}
	var f map[string]json.RawMessage
	if json.Unmarshal(body, &f) != nil {
		if bytes.Contains(body, []byte(`"stream"`)) {
			return nil, nrBadBody
		}
		return nil, ""
	}
	if !rawTrue(f["stream"]) {
		return nil, ""
	}
	pl := &streamPlan{chat: chat, fields: f, maxTokens: -1}
	if n, ok := rawInt(f["n"]); ok && n != 1 {
		return nil, nrN
	}
	// best_of is no field of vLLM 0.32.0 (ignored: one ordinary sample),
	// nor are the guided_* fields (ignored with a warning, output
	// unconstrained): such a stream continues like any other.
	if rawTrue(f["use_beam_search"]) {
		return nil, nrBeamSearch
	}
	if rf := f["response_format"]; !rawNull(rf) {
		var t struct{ Type string }
		if json.Unmarshal(rf, &t) != nil || (t.Type != "" && t.Type != "text") {
			return nil, nrStructured
		}
	}
	if !rawNull(f["structured_outputs"]) {
		return nil, nrStructured
	}
	if rawTrue(f["echo"]) {
		return nil, nrEcho
	}
	if lp := f["logprobs"]; !rawNull(lp) && string(lp) != "false" {
		return nil, nrLogprobs
	}
	if !rawNull(f["prompt_logprobs"]) {
		return nil, nrLogprobs
	}
	if chat {
		if tc := f["tool_choice"]; !rawNull(tc) && string(tc) != `"none"` && string(tc) != `"auto"` {
			return nil, nrStructured // required or a named function: a grammar forces the call
		}
		// Tools the model may call: vLLM's tool parser holds text back
		// while it decides whether a call begins, and that state is lost.
		var tools []json.RawMessage
		if json.Unmarshal(f["tools"], &tools) == nil && len(tools) > 0 && string(f["tool_choice"]) != `"none"` {
			return nil, nrTools
		}
		if multimodal(f["messages"]) {
			return nil, nrMultimodal
		}
		if v, ok := rawInt(f["max_completion_tokens"]); ok {
			pl.maxTokens = v
		} else if v, ok := rawInt(f["max_tokens"]); ok {
			pl.maxTokens = v
		}
	} else {
		if !rawNull(f["suffix"]) {
			return nil, nrSuffix
		}
		if !rawNull(f["prompt_embeds"]) {
			return nil, nrEmbeds
		}
		if severalPrompts(f["prompt"]) {
			return nil, nrPrompts
		}
		pl.maxTokens = 16 // vLLM's default for completions
		if v, ok := f["max_tokens"]; ok {
			pl.maxTokens = -1
			if n, ok := rawInt(v); ok {
				pl.maxTokens = n
			}
		}
	}
	pl.minTokens, _ = rawInt(f["min_tokens"])
	pl.wantIDs = rawTrue(f["return_token_ids"])
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	if json.Unmarshal(f["stream_options"], &so) == nil {
		pl.usage = so.IncludeUsage
	}
	if s := f["stop"]; !rawNull(s) {
		var one string
		if json.Unmarshal(s, &one) == nil {
			pl.stops = []string{one}
		} else if json.Unmarshal(s, &pl.stops) != nil {
			return nil, nrBadBody
		}
		pl.stops = nonEmpty(pl.stops)
	}
	pl.keepStop = rawTrue(f["include_stop_str_in_output"])

	fwd := cloneFields(f)
	fwd["return_token_ids"] = json.RawMessage("true")
	if len(pl.stops) > 0 {
		// vLLM holds back the text that may begin a stop string; at a cut
		// that text would be lost with it, while its tokens were already
		// delivered. So vLLM is asked to hold nothing back and the proxy
		// holds back exactly what vLLM would have (stopText).
		fwd["include_stop_str_in_output"] = json.RawMessage("true")
	}
	var err error
	if pl.forward, err = json.Marshal(fwd); err != nil {
		return nil, nrBadBody
	}
	// Keep only what a continuation carries (not the messages or prompt:
	// they would be one more copy of the body).
	keep := make(map[string]json.RawMessage, len(continuationFields)+1)
	for _, k := range append(continuationFields, "stream_options") {
		if v, ok := f[k]; ok {
			keep[k] = v
		}
	}
	pl.fields = keep
	return pl, ""
}

// mentions: word occurs in the body held in chunks (also across two).
func mentions(chunks [][]byte, word []byte) bool {
	var prev []byte
	for _, c := range chunks {
		if bytes.Contains(c, word) {
			return true
		}
		if len(prev) > 0 {
			seam := append(append([]byte(nil), prev[max(0, len(prev)-len(word)+1):]...), c[:min(len(c), len(word)-1)]...)
			if bytes.Contains(seam, word) {
				return true
			}
		}
		prev = c
	}
	return false
}

func rawNull(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "" || s == "null"
}

func rawTrue(v json.RawMessage) bool { return strings.TrimSpace(string(v)) == "true" }

func rawInt(v json.RawMessage) (int, bool) {
	if rawNull(v) {
		return 0, false
	}
	var f float64
	if json.Unmarshal(v, &f) != nil {
		return 0, false
	}
	return int(f), true
}

func nonEmpty(ss []string) []string {
	out := ss[:0]
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func cloneFields(f map[string]json.RawMessage) map[string]json.RawMessage {
	c := make(map[string]json.RawMessage, len(f)+2)
	for k, v := range f {
		c[k] = v
	}
	return c
}

// severalPrompts: a completions prompt that is a list of prompts (strings
// or token-id lists) of more than one.
func severalPrompts(v json.RawMessage) bool {
	var list []json.RawMessage
	if json.Unmarshal(v, &list) != nil || len(list) <= 1 {
		return false
	}
	t := bytes.TrimSpace(list[0])
	return len(t) > 0 && (t[0] == '"' || t[0] == '[')
}

// multimodal: a chat message holds a content part that is not text.
func multimodal(v json.RawMessage) bool {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(v, &msgs) != nil {
		return false
	}
	for _, m := range msgs {
		var parts []struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(m.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			if p.Type != "text" && p.Type != "input_text" {
				return true
			}
		}
	}
	return false
}

// cutWhy says a cut in the hold comment's words ("vLLM restarting after
// ...").
func cutWhy(why string) string { return "the stream was cut (" + why + ")" }

// continuationFields are the request fields a continuation carries over:
// the sampling parameters and what routes or isolates the request. The
// prompt, the choice count and everything chat-specific are not.
var continuationFields = []string{
	"model", "temperature", "top_p", "top_k", "min_p", "seed",
	"stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
	"presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty",
	"logit_bias", "allowed_token_ids", "bad_words",
	"skip_special_tokens", "spaces_between_special_tokens",
	"priority", "cache_salt", "user", "vllm_xargs", "repetition_detection",
}

// resumeStream serves r itself when it is a stream the proxy can resume
// and reports whether it did; when not, r is returned marked with why if it
// is a stream all the same. st.body holds the request's one copy.
func (p *Proxy) resumeStream(w *recorder, r *http.Request, st *reqState) (*http.Request, bool) {
	if st.body == nil || r.Method != http.MethodPost || (r.URL.Path != "/v1/completions" && r.URL.Path != "/v1/chat/completions") {
		return r, false
	}
	if !p.cfg.Resume {
		return r.WithContext(context.WithValue(r.Context(), notResumedKey{}, FailedResumeOff)), false
	}
	if !mentions(st.body.b.chunks, []byte(`"stream"`)) {
		return r, false
	}
	raw := st.body.b.chunks[0]
	if len(st.body.b.chunks) > 1 {
		// A body in several pieces, joined for the parser: a transient
		// copy, for completion and chat streams only.
		raw, _ = io.ReadAll(st.body.b.reader())
	}
	plan, reason := planStream(r.URL.Path, raw)
	st.stream = plan != nil || reason != ""
	if plan == nil {
		if reason != "" {
			r = r.WithContext(context.WithValue(r.Context(), notResumedKey{}, reason))
		}
		return r, false
	}
	// The body sent is the one copy changed: it replaces the client's in
	// st, within the same budget.
	fwd := &bufferedBody{chunks: [][]byte{plan.forward}, size: int64(len(plan.forward)), budget: p.budget, client: st.body.b.client}
	if p.budget.take(fwd.client, fwd.size) != nil {
		return r.WithContext(context.WithValue(r.Context(), notResumedKey{}, nrNoReplay)), false
	}
	fwd.held.Store(fwd.size)
	defer fwd.release()
	s := &resumer{p: p, w: w, r: r, st: st, plan: plan, sends: 0}
	if len(plan.stops) > 0 {
		s.text = &stopText{stops: plan.stops, keep: plan.keepStop}
		s.text.init()
	}
	s.run(fwd)
	if !s.done && (s.clientGone || r.Context().Err() != nil) {
		st.ended(OutcomeClientGone, "")
	}
	return r, true
}

// resumer is one resumable stream in progress.
type resumer struct {
	p    *Proxy
	w    *recorder
	r    *http.Request
	st   *reqState
	plan *streamPlan
	text *stopText // nil: no stop strings, text passes as vLLM sends it

	sends      int
	headerSent bool
	id, model  json.RawMessage
	created    json.RawMessage
	roleSent   bool
	prompt     []int // the prompt's token ids, from vLLM's first chunk
	delivered  []int // generated token ids written to the client
	base       int   // len(delivered) when the current continuation began
	continuing bool  // the current answer is a continuation
	finished   bool  // a finish_reason was written
	usageSent  bool
	notResumed string // why this stream cannot be resumed now ("": it can)
	partial    []byte // an event the cut interrupted (ended streams pass it on)
	clientGone bool
	stopped    bool   // the proxy found the stop string (across a cut)
	promptSent bool   // the client has the prompt's token ids it asked for
	safeIDs    int    // delivered ids up to a point where their text is whole
	textSince  string // the text the client has (or the proxy holds) beyond safeIDs
	skipText   string // text a continuation generates again that the client has
	seenIDs    int    // ids the client has had (more than delivered after a rewind)
	aborted    bool   // vLLM finished the request with "abort": a restart's drain
	suspect    error
	done       bool      // [DONE] written
	scan       chunkScan // the fast path's (fastChunk), reused from chunk to chunk
	out        []byte    // the fast path's chunk written, reused
	unflushed  bool      // written to the client, not yet flushed (writeSoon)
}

type outcome int

const (
	outDone outcome = iota // [DONE] written, or the client left
	outCut                 // vLLM went away under the stream
)

func (s *resumer) run(fwd *bufferedBody) {
	ctx := s.r.Context()
	body := fwd.chunks[0]
	path := s.r.URL.Path
	why := "vLLM went away"
	for {
		s.sends++
		s.st.body = newTrackBody(&bufferedBody{chunks: [][]byte{body}, size: int64(len(body))})
		resp, err := s.send(ctx, path, body)
		var out outcome
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			if !s.headerSent && !isVLLMGone(err) {
				s.p.upstreamError(s.w, s.r, err)
				return
			}
			why = "vLLM went away"
			out = outCut
		case resp.StatusCode != http.StatusOK || !isEventStream(resp.Header.Get("Content-Type")):
			if !s.headerSent {
				s.passOn(resp)
				return
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, peekLimit))
			resp.Body.Close()
			if resp.StatusCode < 500 {
				// vLLM refused the continuation itself: nothing to wait for.
				s.p.log.Warn("vLLM refused a stream's continuation; ending the stream with an error event",
					zap.Int("status", resp.StatusCode), zap.ByteString("answer", b))
				s.notResumed = nrContinuationKO
				s.end()
				return
			}
			why = fmt.Sprintf("HTTP %d", resp.StatusCode)
			out = outCut
		default:
			if !s.headerSent {
				s.writeHeader(resp.Header)
			}
			out, why = s.pump(resp)
			resp.Body.Close()
		}
		if out == outDone || s.clientGone || ctx.Err() != nil {
			return
		}
		// vLLM cut the stream.
		if !s.finished {
			s.st.output = s.seenIDs > 0
			s.p.touched(s.st, s.st.kind())
		}
		switch {
		case s.finished:
			// Only the usage and [DONE] were missing: nothing to ask vLLM.
			s.finish()
			return
		case s.notResumed != "":
		case !s.p.noteDeath(s.st):
			// In flight at resume_limit deaths: it may be what kills vLLM.
			s.suspect = s.p.suspect(s.r, s.st)
			s.notResumed = nrLimit
		}
		if s.notResumed != "" {
			s.p.log.Info("a stream vLLM cut is not resumed; ending it with an error event",
				zap.String("path", path), zap.String("reason", s.notResumed), zap.Int("sends", s.sends), zap.String("cut", why))
			s.end()
			return
		}
		if !s.headerSent {
			s.writeHeader(http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}})
		}
		comment := func(why string) {
			if s.write([]byte(": vllm-guard: vLLM restarting after "+why+"; resuming\n\n")) != nil {
				s.clientGone = true
			}
		}
		// One at once (the client learns now why nothing comes), then the
		// hold's every few seconds.
		if comment(cutWhy(why)); s.clientGone {
			return
		}
		err = s.p.holdUntilReady(ctx, s.st, comment)
		if s.clientGone || ctx.Err() != nil {
			return
		}
		if err != nil {
			s.p.log.Info("vLLM did not come back for a held stream; ending it with an error event", zap.Error(err))
			s.notResumed = nrHoldFailed
			s.end()
			return
		}
		if s.seenIDs == 0 {
			// Nothing generated reached the client: the same request again.
			s.p.streamResumed(s.st, "replayed")
			body, path = fwd.chunks[0], s.r.URL.Path
			s.continuing = false
			continue
		}
		if len(s.prompt) == 0 {
			// vLLM sent the generated ids but not the prompt's: there is
			// no prefix to continue from.
			s.notResumed = nrNoTokenIDs
			s.end()
			return
		}
		// Rewind to a point where the delivered ids' text is whole: vLLM
		// 0.32.0 primes its detokenizer with the prompt, and a prompt that
		// ends inside a character makes it emit garbage
		// (docs/resume-facts.md). That point is the end of the last chunk
		// of one id that came with text (vLLM sends text only once a
		// character is whole; a chunk of several ids, merged when the
		// reader fell behind, may end inside one). The ids after it are
		// generated again: greedy gives the same ids and text, and neither
		// the ids nor the text the client has are repeated to it.
		s.delivered = s.delivered[:s.safeIDs]
		s.skipText = s.textSince
		cont, ok := s.continuation(ctx)
		if !ok {
			// max_tokens were all delivered; only the finish was cut.
			s.p.streamResumed(s.st, "continued")
			s.finishLength()
			return
		}
		s.p.streamResumed(s.st, "continued")
		body, path = cont, "/v1/completions"
		s.continuing, s.base = true, len(s.delivered)
		if s.text != nil && len(s.delivered) >= s.plan.minTokens {
			// (Under min_tokens vLLM ignores stop strings.)
			s.text.cut()
		}
	}
}

// send posts body to vLLM's path as the client's request would go, through
// the retrying transport (a refused connection waits for vLLM).
func (s *resumer) send(ctx context.Context, path string, body []byte) (*http.Response, error) {
	u, err := s.p.targetURL()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.Scheme+"://"+u.Host+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range s.r.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Te", "Trailer",
			"Transfer-Encoding", "Upgrade", "Content-Length", "Accept-Encoding", "Expect":
			continue
		}
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	if ip, _, err := net.SplitHostPort(s.r.RemoteAddr); err == nil {
		req.Header.Set("X-Forwarded-For", ip)
	}
	req.Host = s.r.Host
	req.Body = s.st.body
	req.ContentLength = int64(len(body))
	// A refused connection is waited out until the hold's end, not the
	// queue deadline that passed while the stream ran.
	s.st.deadline = time.Now().Add(max(s.p.cfg.QueueTimeout.Duration, resumeDialWait))
	return (&retryTransport{p: s.p}).RoundTrip(req)
}

// passOn gives the client vLLM's answer as it is (an error before the
// stream began).
func (s *resumer) passOn(resp *http.Response) {
	defer resp.Body.Close()
	h := s.w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	s.w.WriteHeader(resp.StatusCode)
	buf := bufferPool{}.Get()
	defer bufferPool{}.Put(buf)
	_, _ = io.CopyBuffer(s.w, resp.Body, buf)
}

func (s *resumer) writeHeader(from http.Header) {
	h := s.w.Header()
	for k, v := range from {
		switch k {
		case "Content-Length", "Connection", "Transfer-Encoding", "Keep-Alive":
			continue
		}
		h[k] = v
	}
	s.w.WriteHeader(http.StatusOK)
	s.headerSent = true
	_ = s.w.FlushError()
}

func (s *resumer) write(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		s.clientGone = true
		return err
	}
	s.unflushed = false
	if err := s.w.FlushError(); err != nil {
		s.clientGone = true
		return err
	}
	return nil
}

// writeSoon writes b to the client without flushing it: pump flushes
// before it waits for more from vLLM.
func (s *resumer) writeSoon(b []byte) {
	if _, err := s.w.Write(b); err != nil {
		s.clientGone = true
		return
	}
	s.unflushed = true
}

func (s *resumer) flush() {
	if !s.unflushed {
		return
	}
	s.unflushed = false
	if err := s.w.FlushError(); err != nil {
		s.clientGone = true
	}
}

// eventReady: br holds a whole event already (no wait for vLLM).
func eventReady(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, []byte("\n\n"))
}

func (s *resumer) writeEvent(data []byte) {
	b := make([]byte, 0, len(data)+8)
	b = append(append(append(b, "data: "...), data...), "\n\n"...)
	_ = s.write(b)
}

// pump reads vLLM's stream and writes it to the client until [DONE] or a
// cut; why says what cut it.
func (s *resumer) pump(resp *http.Response) (outcome, string) {
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	var ev []byte
	s.partial = nil
	defer s.flush()
	inLine := false // the last read ended inside a line longer than the buffer
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			ev, inLine = append(ev, line...), true
			continue
		}
		if err != nil {
			s.partial = append(ev, line...)
			return outCut, "vLLM went away"
		}
		if inLine || len(bytes.TrimRight(line, "\r\n")) > 0 {
			ev, inLine = append(ev, line...), false
			continue
		}
		if len(ev) == 0 {
			continue
		}
		out, why, cut := s.event(ev)
		ev = ev[:0]
		if s.unflushed && !eventReady(br) {
			// Flushed before the wait for vLLM's next event, not after
			// each one: a write to the client's connection each, when
			// several came at once.
			s.flush()
		}
		if s.clientGone {
			return outDone, ""
		}
		if cut {
			return outCut, why
		}
		if out {
			return outDone, ""
		}
	}
}

// event handles one SSE event: done when the stream ended, cut when vLLM
// said its engine failed.
func (s *resumer) event(ev []byte) (done bool, why string, cut bool) {
	data := eventData(ev)
	if data == nil {
		return false, "", false // a comment: nothing for the client
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		s.finish()
		return true, "", false
	}
	if s.fastChunk(data) {
		return false, "", false
	}
	return s.decodedEvent(ev, data)
}

// eventData is an event's data: its data lines joined by a newline; nil
// when it has none. One data line (vLLM's every event) is not copied.
func eventData(ev []byte) []byte {
	var data []byte
	copied := false
	for rest := ev; len(rest) > 0; {
		l := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			l, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		l = bytes.TrimRight(l, "\r")
		d, ok := bytes.CutPrefix(l, []byte("data:"))
		if !ok {
			continue
		}
		d = bytes.TrimPrefix(d, []byte(" "))
		switch {
		case data == nil:
			if len(d) > 0 { // (an empty data line before any other adds nothing)
				data = d[:len(d):len(d)]
			}
		case !copied:
			data = append(append(append([]byte(nil), data...), '\n'), d...)
			copied = true
		default:
			data = append(append(data, '\n'), d...)
		}
	}
	return data
}

// decodedEvent handles a chunk the fast path did not (fastChunk): decoded,
// rewritten and encoded again.
func (s *resumer) decodedEvent(ev, data []byte) (done bool, why string, cut bool) {
	var c map[string]json.RawMessage
	var choices []map[string]json.RawMessage
	if json.Unmarshal(data, &c) == nil && rawNull(c["error"]) && string(c["object"]) == `"error"` {
		// The flat ErrorResponse ({"object": "error", "message": ...,
		// "code": 500}) as a stream event: vLLM wraps its stream errors
		// in {"error": ...} (0.32.0 and the older servers alike), but a
		// server in front of it, or an older simulator, may send it bare;
		// the same error as the nested one, not a chunk to pass on.
		c["error"] = data
	}
	if c == nil || (c["choices"] == nil && c["usage"] == nil && c["error"] == nil) ||
		(!rawNull(c["choices"]) && json.Unmarshal(c["choices"], &choices) != nil) {
		s.notResumed = nrUnknownChunk
		_ = s.write(ev)
		_ = s.write([]byte("\n"))
		return false, "", false
	}
	if e := c["error"]; !rawNull(e) {
		var ae apiErrorBody
		_ = json.Unmarshal(e, &ae)
		if ae.Code >= 500 || ae.Code == 0 {
			// The engine failed under the request (vLLM writes the error,
			// then [DONE]): a death, to be resumed like a cut.
			return false, "an engine error (" + ae.Type + ")", true
		}
		s.writeEvent(data)
		return false, "", false
	}
	out, ok := s.chunk(c)
	if ok {
		s.writeEvent(out)
	}
	if s.aborted {
		// vLLM gave up the request (a planned restart's drain ran out of
		// time): for the client, a cut like any other.
		s.aborted = false
		return false, "vLLM aborted it (a restart)", true
	}
	if s.stopped {
		// vLLM's continuation goes on past the stop string: not read.
		s.finish()
		return true, "", false
	}
	return false, "", false
}

type choiceIn struct {
	Index          json.RawMessage `json:"index"`
	Text           *string         `json:"text"`
	Delta          map[string]json.RawMessage
	FinishReason   *string         `json:"finish_reason"`
	StopReason     json.RawMessage `json:"stop_reason"`
	TokenIDs       []int           `json:"token_ids"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
}

// chunk records what a chunk delivers and rewrites it for the client;
// ok is false when nothing of it is for the client.
func (s *resumer) chunk(c map[string]json.RawMessage) (out []byte, ok bool) {
	if s.id == nil {
		s.id, s.created, s.model = c["id"], c["created"], c["model"]
	}
	if !s.continuing && len(s.prompt) == 0 {
		var top []int
		if json.Unmarshal(c["prompt_token_ids"], &top) == nil && len(top) > 0 {
			s.prompt = top
		}
	}
	var choices []map[string]json.RawMessage
	_ = json.Unmarshal(c["choices"], &choices)
	kept := choices[:0]
	for _, ch := range choices {
		if ch == nil {
			continue // null: nothing in it
		}
		var in choiceIn
		if b, err := json.Marshal(ch); err == nil {
			_ = json.Unmarshal(b, &in)
		}
		_ = json.Unmarshal(ch["delta"], &in.Delta)
		if in.Delta == nil {
			in.Delta = map[string]json.RawMessage{}
		}
		if !s.continuing && len(s.prompt) == 0 && len(in.PromptTokenIDs) > 0 {
			s.prompt = in.PromptTokenIDs
		}
		if rawNull(ch["token_ids"]) && (in.Text != nil && *in.Text != "" || deltaHasOutput(in.Delta)) {
			s.notResumed = nrNoTokenIDs
		}
		if s.plan.chat && !s.continuing {
			for _, k := range []string{"reasoning", "reasoning_content", "tool_calls"} {
				if v, has := in.Delta[k]; has && !rawNull(v) && string(v) != `""` && string(v) != "[]" {
					s.notResumed = nrReasoning
				}
			}
			if _, role := in.Delta["role"]; role {
				if s.roleSent {
					// A replay's role delta: the client has it already.
					if !deltaHasOutput(in.Delta) && in.FinishReason == nil && len(in.TokenIDs) == 0 {
						continue
					}
					delete(in.Delta, "role")
				}
				s.roleSent = true
			}
		}
		text := ""
		if in.Text != nil {
			text = *in.Text
		} else if v, has := in.Delta["content"]; has {
			_ = json.Unmarshal(v, &text)
		}
		vllmText := text
		if s.skipText != "" {
			text = s.skipSeen(text)
		}
		if in.FinishReason != nil && *in.FinishReason == "abort" {
			in.FinishReason, in.StopReason = nil, nil
			ch["finish_reason"], ch["stop_reason"] = json.RawMessage("null"), json.RawMessage("null")
			s.aborted = true
		}
		if s.text != nil {
			var stopped *string
			text, stopped = s.text.feed(text, in.FinishReason != nil, in.StopReason)
			if stopped != nil {
				// A stop string across the cut: this is the end.
				stop := "stop"
				in.FinishReason = &stop
				in.StopReason, _ = json.Marshal(*stopped)
				s.stopped = true
			}
		}
		if s.aborted && text == "" && len(in.TokenIDs) == 0 {
			continue
		}
		start := len(s.delivered)
		s.delivered = append(s.delivered, in.TokenIDs...)
		if vllmText != "" && len(in.TokenIDs) == 1 {
			s.safeIDs, s.textSince = len(s.delivered), s.skipText
		} else {
			s.textSince += text
		}
		visible := in.TokenIDs
		if skip := s.seenIDs - start; skip > 0 {
			// Ids generated again after a rewind: the client has them.
			visible = visible[min(skip, len(visible)):]
		}
		s.seenIDs = max(s.seenIDs, len(s.delivered))
		promptIDs := ch["prompt_token_ids"] // (o may be ch, its prompt ids made null below)
		o := ch
		if s.continuing || s.plan.chat {
			o = map[string]json.RawMessage{}
			for k, v := range ch {
				o[k] = v
			}
		}
		if s.continuing {
			o["index"] = json.RawMessage("0")
		}
		if s.plan.chat {
			if s.continuing {
				delete(o, "text")
				in.Delta = map[string]json.RawMessage{}
				if in.FinishReason == nil {
					delete(o, "stop_reason") // vLLM's chat chunks carry it on the last only
				}
			}
			if text != "" || s.continuing || in.Delta["content"] != nil {
				in.Delta["content"], _ = json.Marshal(text)
			}
			o["delta"], _ = json.Marshal(in.Delta)
		} else {
			o["text"], _ = json.Marshal(text)
		}
		if in.FinishReason != nil {
			o["finish_reason"], _ = json.Marshal(*in.FinishReason)
			o["stop_reason"] = in.StopReason
			if in.StopReason == nil {
				o["stop_reason"] = json.RawMessage("null")
			}
			s.finished = true
		}
		// As vLLM shows them: null for a client that did not ask, the
		// prompt's ids once (completions: in the choice), never a
		// continuation's prompt (it is not the client's).
		if _, has := o["prompt_token_ids"]; has {
			o["prompt_token_ids"] = json.RawMessage("null")
			if s.plan.chat && s.continuing {
				delete(o, "prompt_token_ids")
			}
		}
		if _, has := o["token_ids"]; has && !s.plan.wantIDs {
			o["token_ids"] = json.RawMessage("null")
		} else if len(visible) != len(in.TokenIDs) {
			o["token_ids"], _ = json.Marshal(visible)
		}
		if s.plan.wantIDs && !s.continuing && in.PromptTokenIDs != nil && !s.promptSent {
			o["prompt_token_ids"] = promptIDs
			s.promptSent = true
		}
		kept = append(kept, o)
		if s.finished {
			break
		}
	}
	if _, has := c["prompt_token_ids"]; has {
		if !s.plan.wantIDs || s.promptSent || s.continuing {
			c["prompt_token_ids"] = json.RawMessage("null")
		} else {
			s.promptSent = true
		}
	}
	if u := c["usage"]; !rawNull(u) {
		c["usage"] = s.usage(u)
		if len(choices) == 0 {
			s.usageSent = true
		}
	}
	if len(kept) == 0 && rawNull(c["usage"]) {
		return nil, false
	}
	b, _ := json.Marshal(kept)
	c["choices"] = b
	if s.continuing || s.sends > 1 {
		c["id"], c["created"], c["model"] = s.id, s.created, s.model
		if s.plan.chat {
			c["object"] = json.RawMessage(`"chat.completion.chunk"`)
		}
	}
	out, err := json.Marshal(c)
	return out, err == nil
}

// skipSeen drops from a continuation's text what the client has already:
// the text of ids generated again after a rewind.
func (s *resumer) skipSeen(text string) string {
	switch {
	case strings.HasPrefix(text, s.skipText):
		text, s.skipText = text[len(s.skipText):], ""
	case strings.HasPrefix(s.skipText, text):
		s.skipText, text = s.skipText[len(text):], ""
	default:
		// A sampled continuation went another way than the ids the
		// client has: from here it gets the new text.
		s.p.log.Debug("a continuation's text differs from what its client has; passing it on from where it differs")
		n := 0
		for n < len(text) && n < len(s.skipText) && text[n] == s.skipText[n] {
			n++
		}
		text, s.skipText = text[n:], ""
	}
	return text
}

func deltaHasOutput(d map[string]json.RawMessage) bool {
	for k, v := range d {
		if k == "role" {
			continue
		}
		if !rawNull(v) && string(v) != `""` && string(v) != "[]" {
			return true
		}
	}
	return false
}

// usage is vLLM's usage as one request's: a continuation's prompt holds
// the delivered tokens, which are the original request's completion.
func (s *resumer) usage(u json.RawMessage) json.RawMessage {
	if !s.continuing {
		return u
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(u, &m) != nil {
		return u
	}
	completion, _ := rawInt(m["completion_tokens"])
	completion += s.base
	m["prompt_tokens"] = json.RawMessage(strconv.Itoa(len(s.prompt)))
	m["completion_tokens"] = json.RawMessage(strconv.Itoa(completion))
	m["total_tokens"] = json.RawMessage(strconv.Itoa(len(s.prompt) + completion))
	delete(m, "prompt_tokens_details")
	b, _ := json.Marshal(m)
	return b
}

// continuation is the /v1/completions body that goes on from what was
// delivered; ok is false when max_tokens were all delivered.
func (s *resumer) continuation(ctx context.Context) ([]byte, bool) {
	f := s.plan.fields
	c := make(map[string]any, len(continuationFields)+6)
	for _, k := range continuationFields {
		if v, ok := f[k]; ok {
			c[k] = v
		}
	}
	prompt := make([]int, 0, len(s.prompt)+len(s.delivered))
	c["prompt"] = append(append(prompt, s.prompt...), s.delivered...)
	c["stream"] = true
	c["return_token_ids"] = true
	if len(s.plan.stops) > 0 {
		c["include_stop_str_in_output"] = true // see planStream
	}
	if s.plan.usage {
		so := map[string]any{"include_usage": true}
		var o struct {
			Continuous *bool `json:"continuous_usage_stats"`
		}
		if json.Unmarshal(f["stream_options"], &o) == nil && o.Continuous != nil {
			so["continuous_usage_stats"] = *o.Continuous
		}
		c["stream_options"] = so
	}
	if s.plan.maxTokens >= 0 {
		left := s.plan.maxTokens - len(s.delivered)
		if left <= 0 {
			return nil, false
		}
		c["max_tokens"] = left
	} else {
		// Up to the model's length, as the original chat request (a
		// completion without max_tokens would stop at 16).
		n, err := s.p.maxModelLen(ctx, f["model"])
		if err != nil {
			s.p.log.Info("vLLM's max_model_len is unknown; a continuation without max_tokens is capped at what the prompt leaves of 4096 tokens", zap.Error(err))
			n = 4096
		}
		left := n - len(s.prompt) - len(s.delivered)
		if left <= 0 {
			return nil, false
		}
		c["max_tokens"] = left
	}
	if s.plan.minTokens > 0 {
		c["min_tokens"] = max(0, s.plan.minTokens-len(s.delivered))
	}
	b, err := json.Marshal(c)
	return b, err == nil
}

// finish ends the stream as vLLM would have: the usage (when asked and
// not yet sent) and [DONE].
func (s *resumer) finish() {
	if s.plan.usage && !s.usageSent && s.finished && s.headerSent {
		s.writeUsage()
	}
	s.done = s.write([]byte("data: [DONE]\n\n")) == nil
}

func (s *resumer) writeUsage() {
	n := len(s.delivered)
	u, _ := json.Marshal(map[string]int{"prompt_tokens": len(s.prompt), "completion_tokens": n, "total_tokens": len(s.prompt) + n})
	c := map[string]json.RawMessage{"id": s.id, "object": json.RawMessage(`"text_completion"`), "created": s.created, "model": s.model,
		"choices": json.RawMessage("[]"), "usage": u}
	if s.plan.chat {
		c["object"] = json.RawMessage(`"chat.completion.chunk"`)
	}
	b, _ := json.Marshal(c)
	s.writeEvent(b)
	s.usageSent = true
}

// finishLength ends a stream whose max_tokens were all delivered before
// the cut took their finish.
func (s *resumer) finishLength() {
	ch := map[string]any{"index": 0, "finish_reason": "length", "stop_reason": nil, "logprobs": nil}
	obj := "text_completion"
	if s.plan.chat {
		ch["delta"] = map[string]any{"content": s.text.rest()}
		obj = "chat.completion.chunk"
	} else {
		ch["text"] = s.text.rest()
	}
	b, _ := json.Marshal(map[string]any{"id": s.id, "object": obj, "created": s.created, "model": s.model, "choices": []any{ch}})
	s.writeEvent(b)
	s.finished = true
	s.finish()
}

// end ends a stream that is not resumed as before: the error event.
func (s *resumer) end() {
	if s.suspect == nil {
		s.p.streamNotResumed(s.notResumed) // (suspect counted it)
	}
	s.st.ended(notResumed, s.notResumed) // (unless refused or suspect)
	if !s.headerSent {
		s.writeHeader(http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}})
	}
	var b []byte
	if s.notResumed == nrUnknownChunk && len(s.partial) > 0 {
		b = append(b, s.partial...)
		nl := 0
		for i := len(s.partial) - 1; i >= 0 && s.partial[i] == '\n' && nl < 2; i-- {
			nl++
		}
		b = append(b, strings.Repeat("\n", 2-nl)...)
	}
	ev := sseStreamCut
	if s.suspect != nil {
		ev = []byte("data: " + string(errorJSON(http.StatusUnprocessableEntity, "invalid_request_error", s.suspect.Error())) + "\n\n")
	}
	_ = s.write(append(b, ev...))
}

// stopText holds back, as vLLM does, the text that may be the start of a
// stop string, and finds a stop string that spans a cut.
//
// vLLM (0.32.0, BaseIncrementalDetokenizer) holds back the last
// max(len(stop))−1 characters of the output while streaming, unless
// include_stop_str_in_output; the token ids of that text go out at once. At
// a cut that text would be lost: the delivered ids are in the
// continuation's prompt, so vLLM does not generate their text again. So the
// proxy asks vLLM for everything (include_stop_str_in_output: true, which
// also ends the output right after a stop string instead of before it) and
// holds back the same characters itself: the client sees the same text in
// the same chunks. At the finish by a stop string the client did not want
// in its output, the proxy drops it from the end. A continuation's vLLM
// looks for stop strings only in its own output, so one that begins before
// the cut and ends after it is found here, and the proxy ends the stream
// there with finish_reason "stop" (its last chunk's token ids are all
// counted as delivered: vLLM does not say which token ended the string).
type stopText struct {
	stops   []string
	keep    bool   // the client wants the stop string in its output
	hold    int    // characters held back (keep: remembered): max(len(stop)) − 1
	pending string // received, not yet given to the client (not keep)
	recent  string // the last hold characters received
	seam    string // recent at the last cut, while a stop string may span it
	after   string // text received since that cut, while seam is set
}

func (t *stopText) init() {
	for _, s := range t.stops {
		t.hold = max(t.hold, utf8.RuneCountInString(s)-1)
	}
}

// rest is what was held back, given out at an end the proxy writes.
func (t *stopText) rest() string {
	if t == nil {
		return ""
	}
	r := t.pending
	t.pending = ""
	return r
}

// cut marks a cut: what comes next continues from here.
func (t *stopText) cut() { t.seam, t.after = t.recent, "" }

func lastRunes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	i := len(s)
	for ; n > 0 && i > 0; n-- {
		_, w := utf8.DecodeLastRuneInString(s[:i])
		i -= w
	}
	return s[i:]
}

// feed takes a chunk's text and returns what the client gets of it, and
// the stop string when the proxy found one across a cut.
func (t *stopText) feed(text string, finished bool, stopReason json.RawMessage) (string, *string) {
	if t.seam != "" {
		prev := t.after
		t.after += text
		w := t.seam + t.after
		if at, s := firstStop(w, t.stops); at >= 0 && at < len(t.seam) && at+len(s) > len(t.seam)+len(prev) {
			end := at + len(s) - len(t.seam) - len(prev) // of text, up to the stop string's end
			var out string
			if t.keep {
				out = text[:end]
			} else {
				// Up to where the stop string begins, of what is held.
				out = t.pending[:len(t.pending)-len(t.seam)-len(prev)+at]
			}
			t.pending, t.seam, t.after = "", "", ""
			return out, &s
		}
		if utf8.RuneCountInString(t.after) >= t.hold {
			t.seam, t.after = "", "" // every string that began before the cut has ended
		}
	}
	t.recent = lastRunes(t.recent+text, t.hold)
	if t.keep {
		return text, nil
	}
	t.pending += text
	if finished {
		var s string
		if json.Unmarshal(stopReason, &s) == nil && s != "" {
			t.pending = strings.TrimSuffix(t.pending, s)
		}
		return t.rest(), nil
	}
	kept := lastRunes(t.pending, t.hold)
	out := t.pending[:len(t.pending)-len(kept)]
	t.pending = kept
	return out, nil
}

// firstStop is the stop string that ends first in s, and where it begins.
func firstStop(s string, stops []string) (int, string) {
	bestAt, bestEnd, best := -1, len(s)+1, ""
	for _, st := range stops {
		if i := strings.Index(s, st); i >= 0 && i+len(st) < bestEnd {
			bestAt, bestEnd, best = i, i+len(st), st
		}
	}
	return bestAt, best
}

// resumeReasons are the reasons a stream is not resumed, counted in
// proxy_resume_failed_total with the hold's own.
var resumeReasons = []string{nrN, nrBeamSearch, nrStructured, nrTools, nrEcho, nrLogprobs, nrSuffix, nrPrompts,
	nrMultimodal, nrEmbeds, nrNoReplay, nrBadBody, nrNoTokenIDs, nrReasoning, nrUnknownChunk, nrLimit, nrHoldFailed, nrContinuationKO}

// streamResumed and streamNotResumed count a stream as the hold counts
// every other request (the metrics and the status's resumed count).
func (p *Proxy) streamResumed(st *reqState, how string) {
	p.noteResumed(how)
	st.resumedHow(how)
}

func (p *Proxy) streamNotResumed(reason string) { p.noteResumeFailed(reason) }

// notResumedKey marks a stream the proxy passes through as before, with
// why it would not be resumed: counted if vLLM cuts it (sseBody).
type notResumedKey struct{}

// maxModelLen is vLLM's max_model_len for model (its /v1/models says it).
func (p *Proxy) maxModelLen(ctx context.Context, model json.RawMessage) (int, error) {
	u, err := p.targetURL()
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.Scheme+"://"+u.Host+"/v1/models", nil)
	if err != nil {
		return 0, err
	}
	resp, err := p.tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, peekLimit)).Decode(&list); err != nil {
		return 0, fmt.Errorf("vLLM's /v1/models: %w", err)
	}
	var name string
	_ = json.Unmarshal(model, &name)
	best := 0
	for _, m := range list.Data {
		if m.ID == name || (best == 0 && m.MaxModelLen > 0) {
			best = m.MaxModelLen
		}
	}
	if best <= 0 {
		return 0, errors.New("vLLM's /v1/models gave no max_model_len")
	}
	return best, nil
}
