// The one chunk rewrite: every chunk vLLM sends a resumable stream goes
// through onChunk, which records it in the ledger and writes the client's
// chunk. A chunk of the request as the client sent it (the first send, or a
// replay) is passed on byte for byte, with only what the client must not
// see replaced in place (token ids it did not ask for, text held back for a
// stop string, a replay's new id); a continuation's chunk (completions-
// shaped) is written in the original's shape, without what the client has
// already.

package proxy

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

var jsonNull = []byte("null")

// chunkEdit replaces a value of a chunk passed on.
type chunkEdit struct {
	at   jsonSpan
	with []byte
}

// onChunk handles one event's data that is not [DONE]: done when the stream
// ended, cut when vLLM gave it up (an engine error, an abort).
func (s *resumer) onChunk(ev, data []byte) (done bool, why string, cut bool) {
	kind := chunkOdd
	if bytes.IndexByte(data, '\n') < 0 && bytes.IndexByte(data, '\r') < 0 && json.Valid(data) {
		kind = s.scan.read(data, s.plan.chat && !s.continuing) // (a continuation's chunks are completions')
	}
	switch kind {
	case chunkChoice:
		return s.onChoice(data)
	case chunkUsage:
		s.onUsage(data)
		return false, "", false
	}
	return s.oddEvent(ev, data)
}

// onChoice handles a chunk of one choice.
func (s *resumer) onChoice(data []byte) (done bool, why string, cut bool) {
	sc := &s.scan
	s.remember(data)
	finish := ""
	if sc.finish.has() && !isNull(data, sc.finish) {
		finish = jsonString(data[sc.finish.start:sc.finish.end])
	}
	if finish == "abort" {
		// vLLM gave the request up (a planned restart's drain ran out of
		// time): for the client a cut like any other, for the poison rule
		// none.
		s.planned = true
		return false, "vLLM aborted it (a restart)", true
	}
	if s.plan.chat && sc.role {
		if s.roleSent && !sc.output && len(sc.ids) == 0 && finish == "" {
			return false, "", false // a replay's role chunk: the client has it
		}
		s.roleSent = true
	}
	raw := ""
	if sc.text.has() {
		raw = jsonString(data[sc.text.start:sc.text.end])
	}
	if !sc.tokenIDs.has() || isNull(data, sc.tokenIDs) {
		if raw != "" || sc.output {
			s.notResumed = nrNoTokenIDs
		}
	}
	if s.plan.chat && sc.reasoning {
		s.notResumed = nrReasoning
	}
	newIDs, newRaw := sc.ids, raw
	if s.led.regenerating() {
		var ok bool
		if newIDs, newRaw, ok = s.led.match(sc.ids, raw); !ok {
			s.p.log.Warn("a greedy continuation gave other ids than the client has; ending the stream with an error event")
			s.refuseStream(nrDiverged)
			return true, "", false
		}
	}
	if len(sc.ids) > 0 || raw != "" {
		s.led.add(sc.ids, raw, len(sc.ids) == 1)
	}
	before := s.progress
	s.progress = s.progress || len(newIDs) > 0
	if len(newIDs) == 0 && newRaw == "" && s.continuing && finish == "" {
		s.catchingUp()
	}
	done, why, cut = s.give(data, newIDs, newRaw, raw, finish)
	if !before && s.progress && s.sends > 1 {
		s.p.continuedAt(time.Now()) // the first new token after a cut is the client's
	}
	return done, why, cut
}

// give writes the client's part of a chunk: newIDs and newRaw are what the
// client does not have yet of vLLM's ids and raw text.
func (s *resumer) give(data []byte, newIDs []int, newRaw, raw, finish string) (done bool, why string, cut bool) {
	sc := &s.scan
	var stopReason json.RawMessage
	if sc.stopReason.has() {
		stopReason = data[sc.stopReason.start:sc.stopReason.end]
	}
	text := newRaw
	if s.text != nil {
		var stopped *string
		if text, stopped = s.text.feed(newRaw, finish != "", stopReason); stopped != nil {
			// A stop string across the cut: this is the end.
			finish, s.stopped = "stop", true
			stopReason, _ = json.Marshal(*stopped)
		}
	}
	if finish != "" {
		s.finished = true
	}
	if s.continuing || s.stopped {
		s.writeBuilt(newIDs, text, finish, stopReason)
	} else {
		s.writeEdited(data, text, raw)
	}
	if s.stopped {
		// vLLM's continuation goes on past the stop string: not read.
		s.finish()
		return true, "", false
	}
	return false, "", false
}

// catchingUp: a greedy continuation gives again what the client has, and
// the client hears nothing of it; a comment every few seconds keeps it
// (and a load balancer) from timing out meanwhile.
func (s *resumer) catchingUp() {
	if now := time.Now(); now.Sub(s.lastComment) >= s.p.tickEvery {
		s.lastComment = now
		s.writeSoon([]byte(": vllm-guard: vLLM restarting after a cut: it gives again the tokens the client has; resuming\n\n"))
	}
}

// remember keeps the stream's id, created and model, and the prompt's
// token ids (within the proxy's buffer budget).
func (s *resumer) remember(data []byte) {
	sc := &s.scan
	if s.id == nil {
		s.id, s.created, s.model = spanBytes(data, sc.id), spanBytes(data, sc.created), spanBytes(data, sc.model)
	}
	if len(s.prompt) > 0 || s.continuing {
		return
	}
	ids := sc.topPromptIDs
	if len(ids) == 0 {
		ids = sc.promptIDs
	}
	if len(ids) == 0 {
		return
	}
	n := int64(8 * len(ids))
	if s.p.budget.take(s.client, n) != nil {
		s.notResumed = nrNoReplay
		return
	}
	s.charged += n
	s.prompt = slices.Clone(ids)
}

// writeEdited passes a chunk of the request as the client sent it on with
// only its changed values replaced: text the stop-string holder changed,
// token ids the client did not ask for (null, as vLLM writes them then),
// the prompt's ids given once, a replay's id, created and model.
func (s *resumer) writeEdited(data []byte, text, raw string) {
	sc := &s.scan
	var edits [8]chunkEdit
	ne := 0
	edit := func(at jsonSpan, with []byte) {
		edits[ne] = chunkEdit{at, with}
		ne++
	}
	if text != raw {
		if !sc.text.has() {
			s.writeBuilt(sc.ids, text, "", nil) // (a chat delta without content: no place for it)
			return
		}
		b, _ := json.Marshal(text)
		edit(sc.text, b)
	}
	if sc.tokenIDs.has() && !isNull(data, sc.tokenIDs) && !s.plan.wantIDs {
		edit(sc.tokenIDs, jsonNull)
	}
	for _, at := range []jsonSpan{sc.prompt, sc.topPrompt} {
		if !at.has() || isNull(data, at) {
			continue
		}
		if s.plan.wantIDs && !s.promptSent {
			s.promptSent = true
		} else {
			edit(at, jsonNull)
		}
	}
	if s.sends > 1 {
		edit(sc.id, s.id)
		edit(sc.created, s.created)
		edit(sc.model, s.model)
	}
	s.writeSpliced(data, edits[:ne])
}

// writeSpliced writes data with edits, as an event.
func (s *resumer) writeSpliced(data []byte, edits []chunkEdit) {
	slices.SortFunc(edits, func(a, b chunkEdit) int { return a.at.start - b.at.start })
	out := append(s.out[:0], "data: "...)
	pos := 0
	for _, e := range edits {
		if !e.at.has() || e.at.start < pos {
			continue
		}
		out = append(append(out, data[pos:e.at.start]...), e.with...)
		pos = e.at.end
	}
	out = append(append(out, data[pos:]...), "\n\n"...)
	s.out = out
	s.writeSoon(out)
}

// writeBuilt writes a continuation's chunk in the original's shape: only
// the ids and text the client does not have; nothing when that is nothing
// (vLLM sends no empty chunk for ids that do not exist).
func (s *resumer) writeBuilt(ids []int, text, finish string, stopReason json.RawMessage) {
	if finish == "" && len(ids) == 0 && text == "" {
		return
	}
	if finish == "" && s.led.merge(text) {
		return
	}
	text = s.led.takeCarry() + text
	s.writeEvent(s.builtChunk(ids, text, finish, stopReason))
}

// builtChunk is a chunk of one choice in the shape vLLM 0.32.0 writes the
// original request's.
func (s *resumer) builtChunk(ids []int, text, finish string, stopReason json.RawMessage) []byte {
	var b bytes.Buffer
	obj := `"text_completion"`
	if s.plan.chat {
		obj = `"chat.completion.chunk"`
	}
	b.WriteString(`{"id":`)
	b.Write(orNull(s.id))
	b.WriteString(`,"object":` + obj + `,"created":`)
	b.Write(orNull(s.created))
	b.WriteString(`,"model":`)
	b.Write(orNull(s.model))
	t, _ := json.Marshal(text)
	if s.plan.chat {
		b.WriteString(`,"choices":[{"index":0,"delta":{"content":`)
		b.Write(t)
		b.WriteString(`},"logprobs":null,"finish_reason":`)
	} else {
		b.WriteString(`,"choices":[{"index":0,"text":`)
		b.Write(t)
		b.WriteString(`,"logprobs":null,"finish_reason":`)
	}
	if finish == "" {
		b.WriteString("null")
	} else {
		f, _ := json.Marshal(finish)
		b.Write(f)
	}
	if !s.plan.chat || finish != "" {
		b.WriteString(`,"stop_reason":`)
		b.Write(orNull(stopReason))
	}
	if !s.plan.chat {
		b.WriteString(`,"prompt_token_ids":null`)
	}
	b.WriteString(`,"token_ids":`)
	if s.plan.wantIDs {
		if ids == nil {
			ids = []int{}
		}
		v, _ := json.Marshal(ids)
		b.Write(v)
	} else {
		b.WriteString("null")
	}
	b.WriteString("}]}")
	return b.Bytes()
}

func orNull(v json.RawMessage) []byte {
	if len(v) == 0 {
		return jsonNull
	}
	return v
}

// onUsage passes vLLM's usage chunk on, or a continuation's as the one
// request's: the original prompt, every id the client was given.
func (s *resumer) onUsage(data []byte) {
	s.usageSent = true
	if !s.continuing {
		var edits [3]chunkEdit
		n := 0
		if s.sends > 1 {
			edits = [3]chunkEdit{{s.scan.id, s.id}, {s.scan.created, s.created}, {s.scan.model, s.model}}
			n = 3
		}
		s.writeSpliced(data, edits[:n])
		return
	}
	s.writeEvent(s.usageChunk())
}

// usageChunk is the usage of the stream as one request's.
func (s *resumer) usageChunk() []byte {
	p, c := len(s.prompt), len(s.led.ids)
	obj := `"text_completion"`
	if s.plan.chat {
		obj = `"chat.completion.chunk"`
	}
	var b bytes.Buffer
	b.WriteString(`{"id":`)
	b.Write(orNull(s.id))
	b.WriteString(`,"object":` + obj + `,"created":`)
	b.Write(orNull(s.created))
	b.WriteString(`,"model":`)
	b.Write(orNull(s.model))
	b.WriteString(`,"choices":[],"usage":{"prompt_tokens":` + strconv.Itoa(p) + `,"total_tokens":` + strconv.Itoa(p+c) +
		`,"completion_tokens":` + strconv.Itoa(c) + `}}`)
	return b.Bytes()
}

// oddEvent handles an event the scan did not read: vLLM's error event (a
// cut when the engine failed), or a chunk the proxy cannot account for
// (passed on as it is, the stream no longer continued).
func (s *resumer) oddEvent(ev, data []byte) (done bool, why string, cut bool) {
	var c map[string]json.RawMessage
	_ = json.Unmarshal(data, &c)
	if c != nil && rawNull(c["error"]) && string(c["object"]) == `"error"` {
		// The flat ErrorResponse ({"object": "error", "message": ...,
		// "code": 500}): vLLM wraps its stream errors in {"error": ...},
		// but a server in front of it may send it bare.
		c["error"] = data
	}
	if e := c["error"]; !rawNull(e) {
		var ae apiErrorBody
		_ = json.Unmarshal(e, &ae)
		if ae.Code >= 500 || ae.Code == 0 {
			// The engine failed under the request (vLLM writes the error,
			// then [DONE]): a death, to be resumed like a cut, once the
			// guard sees vLLM go.
			s.vllmErr = slices.Clone(data)
			return false, "an engine error (" + ae.Type + ")", true
		}
		s.writeEvent(data)
		return false, "", false
	}
	if s.continuing || s.led.regenerating() {
		// Nothing of it can be passed on as the original's.
		s.refuseStream(nrUnknownChunk)
		return true, "", false
	}
	s.notResumed = nrUnknownChunk
	if c != nil && !s.plan.wantIDs {
		hideIDs(c)
		if b, err := json.Marshal(c); err == nil {
			s.writeEvent(b)
			return false, "", false
		}
	}
	_ = s.write(append(slices.Clone(ev), '\n'))
	return false, "", false
}

// hideIDs nulls the token ids of a decoded chunk (the client did not ask).
func hideIDs(c map[string]json.RawMessage) {
	if _, ok := c["prompt_token_ids"]; ok {
		c["prompt_token_ids"] = jsonNull
	}
	var choices []map[string]json.RawMessage
	if json.Unmarshal(c["choices"], &choices) != nil {
		return
	}
	for _, ch := range choices {
		for _, k := range []string{"token_ids", "prompt_token_ids"} {
			if _, ok := ch[k]; ok && ch != nil {
				ch[k] = jsonNull
			}
		}
	}
	c["choices"], _ = json.Marshal(choices)
}

func spanBytes(data []byte, v jsonSpan) json.RawMessage {
	if !v.has() {
		return nil
	}
	return bytes.Clone(data[v.start:v.end])
}

// splitComma splits a header's comma-separated list.
func splitComma(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

var _ = zap.String
