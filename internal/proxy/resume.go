// What happens to my stream when vLLM dies: this file.
//
// A completion or chat stream the proxy can continue exactly (planStream,
// plan.go) is served by one value, the resumer, in named phases:
//
//	forwarding → streaming → done
//	               ↓ cut (vLLM went away, sent an engine error, or aborted it)
//	             held (an SSE comment every few seconds while vLLM is down)
//	               → continuing → streaming → … → done
//	             or refused (the clean error event: not continued, and why)
//
// The one forward loop every inference request lives in (lifecycle.go,
// which decides hold, send again, pass on or suspect) moves it between
// them — a death before vLLM's first byte, after it, a drain, an engine
// error are all cuts of this loop (the transport under it only waits out a
// refused connection) — and one send
// serves the first request, a replay (nothing generated had reached the
// client: the same request again) and a continuation (a /v1/completions request whose prompt
// is the prompt's token ids and the ids the client was given). What the
// client was given is one ledger (ledger.go): the exact ids behind every
// byte, with the text held back for stop strings (stoptext.go), so a
// continuation starts right after the last id given and nothing the client
// has is given again or changed (rewrite.go writes every chunk).
//
// Greedy decoding continues exactly. A sampled stream continues from the
// ids given with a fresh random state: the rest is a valid sample given
// that prefix, not the one an uninterrupted request would have drawn (a
// seed no longer reproduces the whole answer), and output-dependent
// penalties (presence, frequency) see the given ids as prompt.
//
// Bounded by construction: a cut is continued only once the guard saw
// vLLM go (an error event with vLLM still up ends the stream with it), at
// most once per death, and a stream in flight at [proxy] resume_limit
// deaths it could have caused (not planned restarts; the count starts
// again once a continuation made progress) is refused as a suspect.

package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"time"

	"go.uber.org/zap"
)

// resumeDialWait: a resumed stream's request waits this long at most for
// vLLM to take its connection (the queue deadline passed while it ran).
const resumeDialWait = 2 * time.Minute

// phase is where a stream is in its life.
type phase int

const (
	phaseForwarding phase = iota // sent to vLLM, no answer yet
	phaseStreaming               // vLLM's chunks going to the client
	phaseCut                     // vLLM went away under it
	phaseHeld                    // waiting for vLLM to be ready again
	phaseContinuing              // a replay or continuation sent
	phaseDone                    // [DONE] written, or the client left
	phaseRefused                 // ended with an error event instead
)

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
	client := st.body.b.client
	fwd := &bufferedBody{chunks: [][]byte{plan.forward}, size: int64(len(plan.forward)), budget: p.budget, client: client}
	if p.budget.take(client, fwd.size) != nil {
		return r.WithContext(context.WithValue(r.Context(), notResumedKey{}, nrNoReplay)), false
	}
	fwd.held.Store(fwd.size)
	defer fwd.release()
	st.streamOwned = true
	s := &resumer{p: p, w: w, r: r, st: st, plan: plan, client: client}
	defer s.giveBudget()
	if len(plan.stops) > 0 {
		s.text = &stopText{stops: plan.stops, keep: plan.keepStop}
		s.text.init()
	}
	s.run(plan.forward)
	if s.phase != phaseDone && s.phase != phaseRefused && (s.clientGone || r.Context().Err() != nil) {
		st.ended(OutcomeClientGone, "")
	}
	return r, true
}

// resumer is one resumable stream's life.
type resumer struct {
	p      *Proxy
	w      *recorder
	r      *http.Request
	st     *reqState
	plan   *streamPlan
	text   *stopText // nil: no stop strings, text passes as vLLM sends it
	client netip.Prefix
	phase  phase

	sends      int
	continuing bool // the current answer is a continuation (completions-shaped)
	headerSent bool
	id, model  json.RawMessage
	created    json.RawMessage
	roleSent   bool
	promptSent bool  // the client has the prompt's token ids it asked for
	prompt     []int // the prompt's token ids, from vLLM's first chunk
	led        ledger
	progress   bool // new ids reached the client since the last send
	finished   bool // a finish_reason was written
	usageSent  bool
	clientGone bool
	stopped    bool   // the proxy found the stop string (across a cut)
	planned    bool   // vLLM aborted it: a planned restart's drain, no death
	engine     bool   // vLLM answered, before the stream, that its engine is gone
	vllmErr    []byte // the engine error event vLLM sent at the cut
	notResumed string // why this stream cannot be resumed now ("": it can)
	partial    []byte // an event the cut interrupted (ended streams pass it on)
	suspect    error
	charged    int64 // budget bytes held for the prompt's ids
	bodyCharge int64 // budget bytes held for the continuation's body

	first []byte // the request as first sent (a replay sends it again)
	body  []byte // what the next send sends
	path  string // and where

	scan      chunkScan // reused from chunk to chunk
	out       []byte    // the chunk written, reused
	unflushed bool      // written to the client, not yet flushed (writeSoon)
	// lastComment: the last comment written while a continuation gave
	// again what the client has (catchingUp).
	lastComment time.Time
}

type outcome int

const (
	outDone outcome = iota // [DONE] written, the stream ended, or the client left
	outCut                 // vLLM went away under the stream
)

// run is the stream's life in the one forward loop (lifecycle.go): send,
// stream, and at a cut hold and send again, until it is done or refused.
func (s *resumer) run(first []byte) {
	s.first, s.body, s.path = first, first, s.r.URL.Path
	s.p.live(s.st, s)
	if s.phase != phaseRefused {
		s.phase = phaseDone
	}
}

// send is the course's send: the body to vLLM and its answer streamed to
// the client; at a cut, what the ledger makes of it.
func (s *resumer) send() (cut, bool) {
	out, why := s.forward(s.path, s.body)
	if out == outDone || s.clientGone || s.r.Context().Err() != nil {
		return cut{}, false
	}
	s.phase = phaseCut
	if !s.finished {
		s.st.output = len(s.led.ids) > 0 || s.led.regenerating()
		s.p.touched(s.st, s.st.kind())
	}
	switch {
	case s.finished:
		// Only the usage and [DONE] were missing: nothing to ask vLLM.
		s.finish()
		return cut{}, false
	case s.notResumed != "":
		s.refuseStream(s.notResumed)
		return cut{}, false
	case s.led.splitForSure(s.plan.greedy, s.plan.wantIDs):
		// Refused now, not after the hold: vLLM could not change it.
		s.refuseStream(nrSplitChar)
		return cut{}, false
	}
	c := cut{why: why, planned: s.planned, engine: s.engine, vllmErr: s.vllmErr != nil,
		delivered: len(s.led.ids) > 0 || s.led.chunks > 0 || s.led.regenerating() || s.continuing,
		progress:  s.progress && s.sends > 1}
	s.planned, s.engine = false, false
	return c, true
}

func (s *resumer) hold(c cut) error {
	if !s.holdStream(c.why) {
		return errEnded
	}
	return nil
}

func (s *resumer) again() bool {
	var ok bool
	if s.body, s.path, ok = s.next(s.first); ok {
		s.phase = phaseContinuing
	}
	return ok
}

func (s *resumer) endAlive(cut) { s.endStream() }

func (s *resumer) refuse(err error) {
	s.suspect = err
	s.refuseStream(nrLimit)
}

// named is the stream as vLLM would have seen it (the sanitized address),
// not by its own X-Forwarded-For.
func (s *resumer) named() *http.Request {
	if out, err := s.p.outgoing(s.r.Context(), s.r, s.r.URL.Path, http.NoBody, 0); err == nil {
		return out
	}
	return s.r
}

// forward sends body to vLLM's path and streams its answer to the client.
func (s *resumer) forward(path string, body []byte) (outcome, string) {
	ctx := s.r.Context()
	s.sends++
	s.progress = false
	s.phase = phaseForwarding
	s.st.body = newTrackBody(&bufferedBody{chunks: [][]byte{body}, size: int64(len(body))})
	resp, err := s.post(ctx, path, body)
	if !s.headerSent && ctx.Err() == nil {
		// vLLM died or drains before it answered: the same as a cut.
		if why := s.p.nothingProduced(s.r, s.st, resp, err); why != replayNone {
			if resp != nil {
				resp.Body.Close()
			}
			s.planned, s.engine = why == replayDrain, resp != nil
			return outCut, "vLLM answered nothing (" + why.String() + ")"
		}
	}
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return outDone, ""
		}
		if !s.headerSent && !isVLLMGone(err) {
			s.p.upstreamError(s.w, s.r, err)
			return outDone, ""
		}
		return outCut, "vLLM went away"
	case resp.StatusCode != http.StatusOK || !isEventStream(resp.Header.Get("Content-Type")):
		if !s.headerSent {
			s.passOn(resp)
			return outDone, ""
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, peekLimit))
		resp.Body.Close()
		if resp.StatusCode < 500 {
			// vLLM refused the continuation itself: nothing to wait for.
			s.p.log.Warn("vLLM refused a stream's continuation; ending the stream with an error event",
				zap.Int("status", resp.StatusCode), zap.ByteString("answer", b))
			s.refuseStream(nrContinuationKO)
			return outDone, ""
		}
		return outCut, fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	if !s.headerSent {
		s.writeHeader(resp.Header)
	}
	s.phase = phaseStreaming
	defer resp.Body.Close()
	return s.pump(resp)
}

// holdStream waits, with SSE comments, for vLLM to be ready again; false: the
// stream ended (the client left, or vLLM did not come back).
func (s *resumer) holdStream(why string) bool {
	s.phase = phaseHeld
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
		return false
	}
	ctx := s.r.Context()
	err := s.p.holdUntilReady(ctx, s.st, comment)
	if s.clientGone || ctx.Err() != nil {
		return false
	}
	if err != nil {
		s.p.log.Info("vLLM did not come back for a held stream; ending it with an error event", zap.Error(err))
		s.refuseStream(nrHoldFailed)
		return false
	}
	return true
}

// next is the body to send after a cut: the same request again when the
// client has nothing generated, else a continuation from the ledger.
func (s *resumer) next(first []byte) (body []byte, path string, ok bool) {
	if len(s.led.ids) == 0 && !s.led.regenerating() && s.led.chunks == 0 {
		s.p.streamResumed(s.st, ResumedReplayed)
		s.continuing = false
		return first, s.r.URL.Path, true
	}
	if len(s.prompt) == 0 {
		// vLLM sent the generated ids but not the prompt's: there is no
		// prefix to continue from.
		s.refuseStream(nrNoTokenIDs)
		return nil, "", false
	}
	s.wholeCheck()
	if reason := s.led.cut(s.plan.greedy, s.plan.wantIDs); reason != "" {
		s.refuseStream(reason)
		return nil, "", false
	}
	cont, reason := s.continuation()
	switch {
	case reason != "":
		s.refuseStream(reason)
		return nil, "", false
	case cont == nil:
		// max_tokens were all given; only the finish was cut.
		s.p.streamResumed(s.st, ResumedContinued)
		s.finishLength()
		return nil, "", false
	}
	s.p.streamResumed(s.st, ResumedContinued)
	s.continuing, s.lastComment = true, time.Now()
	if s.text != nil && len(s.led.ids) >= s.plan.minTokens {
		// (Under min_tokens vLLM ignores stop strings.)
		s.text.cut()
	}
	return cont, "/v1/completions", true
}

// wholeCheck asks vLLM (/detokenize) where the ids given after the last
// known whole character end on one (chunks of several ids do not say). When
// the text of ids[whole:j] is exactly the text received for ids[whole:],
// no byte of theirs is pending (vLLM writes no text that ends inside a
// character) and ids[j:] wrote none: the ledger is whole up to j. The last
// few ids are tried (a character takes at most 4 bytes); any doubt leaves
// the ledger as it is.
func (s *resumer) wholeCheck() {
	l := &s.led
	if l.regenerating() || l.whole == len(l.ids) || l.rawSince == "" {
		return
	}
	for j := len(l.ids); j > l.whole && j >= len(l.ids)-3; j-- {
		text, err := s.p.detokenize(s.r.Context(), s.plan.fields["model"], l.ids[l.whole:j], s.r.Header.Get("Authorization"))
		if err != nil {
			s.p.log.Debug("vLLM's /detokenize did not answer; continuing from the last id known to end a character", zap.Error(err))
			return
		}
		if text == l.rawSince {
			l.whole, l.rawSince, l.chunks = j, "", 0
			return
		}
	}
}

// post posts body to vLLM's path as every request the proxy sends goes
// (outgoing), through the retrying transport (a refused connection waits
// for vLLM).
func (s *resumer) post(ctx context.Context, path string, body []byte) (*http.Response, error) {
	req, err := s.p.outgoing(ctx, s.r, path, s.st.body, int64(len(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	// The transport reads the body itself; a compressed answer would not
	// be read as SSE.
	req.Header.Del("Accept-Encoding")
	// A refused connection is waited out until the hold's end, not the
	// queue deadline that passed while the stream ran.
	s.st.deadline = time.Now().Add(max(s.p.cfg.QueueTimeout.Duration, resumeDialWait))
	return (&retryTransport{p: s.p}).RoundTrip(req)
}

// outgoing is in as the proxy sends it to vLLM at path: the one header
// rewrite every request takes (the ReverseProxy's for the others): the
// hop-by-hop headers and those the client named in Connection removed,
// the client's forwarding headers dropped and set again by rewrite.
func (p *Proxy) outgoing(ctx context.Context, in *http.Request, path string, body io.ReadCloser, n int64) (*http.Request, error) {
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, path, body)
	if err != nil {
		return nil, err
	}
	out.Header = in.Header.Clone()
	for _, f := range in.Header.Values("Connection") {
		for _, k := range splitComma(f) {
			out.Header.Del(k)
		}
	}
	for _, k := range []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Expect",
		"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		out.Header.Del(k)
	}
	out.ContentLength = n
	p.rewrite(&httputil.ProxyRequest{In: in, Out: out})
	if out.URL.Host == "" {
		if _, err := p.targetURL(); err != nil {
			return nil, err
		}
	}
	return out, nil
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

// continuation is the /v1/completions body that goes on from the ledger;
// nil when max_tokens were all given, reason when it cannot be built.
func (s *resumer) continuation() (body []byte, reason string) {
	f := s.plan.fields
	c := make(map[string]any, len(continuationFields)+6)
	for _, k := range continuationFields {
		if v, ok := f[k]; ok {
			c[k] = v
		}
	}
	given := len(s.led.ids)
	prompt := make([]int, 0, len(s.prompt)+given)
	c["prompt"] = append(append(prompt, s.prompt...), s.led.ids...)
	c["stream"] = true
	c["return_token_ids"] = true
	if len(s.plan.stops) > 0 && !s.plan.keepStop {
		c["include_stop_str_in_output"] = true // see planStream
	}
	if s.plan.usage {
		c["stream_options"] = map[string]any{"include_usage": true}
	}
	limit := s.plan.maxTokens
	if limit < 0 {
		// Up to the model's length, as the original chat request (a
		// completion without max_tokens would stop at 16).
		n, err := s.p.maxModelLen(s.r.Context(), f["model"], s.r.Header.Get("Authorization"))
		if err != nil {
			s.p.log.Info("vLLM's max_model_len is unknown; a stream without max_tokens is not continued", zap.Error(err))
			return nil, nrModelLen
		}
		limit = n - len(s.prompt)
	}
	left := limit - given
	if left <= 0 {
		return nil, ""
	}
	c["max_tokens"] = left
	if s.plan.minTokens > 0 {
		c["min_tokens"] = max(0, s.plan.minTokens-given)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, nrBadBody
	}
	// The body counts against the proxy's buffers while it is sent.
	s.p.budget.give(s.client, s.bodyCharge)
	s.bodyCharge = 0
	if s.p.budget.take(s.client, int64(len(b))) != nil {
		return nil, nrNoReplay
	}
	s.bodyCharge = int64(len(b))
	return b, ""
}

// giveBudget gives back what the stream's ids and bodies held.
func (s *resumer) giveBudget() {
	s.p.budget.give(s.client, s.charged+s.bodyCharge)
	s.charged, s.bodyCharge = 0, 0
}

// refuseStream ends a stream that is not resumed: the error event (a suspect's
// own), counted by its reason.
func (s *resumer) refuseStream(reason string) {
	s.notResumed = reason
	s.phase = phaseRefused
	if s.suspect == nil {
		s.p.streamNotResumed(reason) // (suspect counted it)
	}
	s.st.ended(notResumed, reason) // (unless refused or suspect)
	s.p.log.Info("a stream vLLM cut is not resumed; ending it with an error event",
		zap.String("path", s.r.URL.Path), zap.String("reason", reason), zap.Int("sends", s.sends))
	if !s.headerSent {
		s.writeHeader(http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}})
	}
	var b []byte
	if reason == nrUnknownChunk && len(s.partial) > 0 {
		b = append(b, s.partial...)
		nl := 0
		for i := len(s.partial) - 1; i >= 0 && s.partial[i] == '\n' && nl < 2; i-- {
			nl++
		}
		for ; nl < 2; nl++ {
			b = append(b, '\n')
		}
	}
	ev := sseStreamCut
	if s.suspect != nil {
		ev = []byte("data: " + string(errorJSON(http.StatusUnprocessableEntity, "invalid_request_error", s.suspect.Error())) + "\n\n")
	}
	_ = s.write(append(b, ev...))
}

// endStream ends a stream vLLM cut while it stayed up (the guard saw no
// death): with vLLM's own error event when it sent one, else the proxy's.
// It was no death: the stream leaves the death's account.
func (s *resumer) endStream() {
	s.phase = phaseRefused
	s.st.ended(OutcomeFailed, "")
	s.p.log.Info("a stream was cut while vLLM stayed up; ending it with the error", zap.String("path", s.r.URL.Path))
	if s.vllmErr == nil {
		_ = s.write(sseStreamCut)
		return
	}
	_ = s.write(append(append(append([]byte("data: "), s.vllmErr...), "\n\n"...), "data: [DONE]\n\n"...))
}

// finish ends the stream as vLLM would have: the usage (when asked and
// not yet sent) and [DONE].
func (s *resumer) finish() {
	if s.plan.usage && !s.usageSent && s.finished && s.headerSent {
		s.writeEvent(s.usageChunk())
	}
	if s.write([]byte("data: [DONE]\n\n")) == nil {
		s.phase = phaseDone
	}
}

// finishLength ends a stream whose max_tokens were all given before the
// cut took their finish.
func (s *resumer) finishLength() {
	s.finished = true
	s.writeEvent(s.builtChunk(nil, s.led.takeCarry()+s.text.rest(), "length", nil))
	s.finish()
}
