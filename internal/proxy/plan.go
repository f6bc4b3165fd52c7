// What the proxy reads of a stream's request before it forwards it: whether
// a cut can be continued exactly, and if not, why not (planStream). A shape
// whose continuation could differ from what vLLM would have sent is refused
// here, before anything is rewritten: its stream passes through as vLLM
// sends it and ends with the error event at a cut.

package proxy

import (
	"bytes"
	"encoding/json"
	"strings"
)

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
	// Refused up front, or at the cut, because exactness cannot be kept:
	nrStopTokenText = "stop_token_text"       // stop strings beside stop_token_ids (or special tokens kept): the stop token's text
	nrFieldType     = "field_type"            // a field the proxy reads is of another JSON type (a number as a string)
	nrUsageStats    = "continuous_usage"      // usage on every chunk: a continuation's would count from its own prompt
	nrSplitChar     = "split_character"       // sampled, cut inside a character whose ids or text the client has
	nrDiverged      = "diverged"              // a greedy continuation did not give again the ids the client has
	nrModelLen      = "max_model_len_unknown" // no max_tokens and vLLM's max_model_len could not be read
)

// streamPlan is what the proxy knows of an eligible stream's request.
type streamPlan struct {
	chat      bool
	fields    map[string]json.RawMessage // the request as the client sent it
	forward   []byte                     // what is sent to vLLM: return_token_ids added
	wantIDs   bool                       // the client asked for token ids itself
	usage     bool                       // stream_options.include_usage
	maxTokens int                        // -1: no limit given (chat: up to max_model_len)
	minTokens int
	stops     []string // stop strings
	keepStop  bool     // include_stop_str_in_output as the client asked
	greedy    bool     // temperature 0: a continuation gives the same ids again
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
	if v, ok := f["stream"]; ok && !rawNull(v) && !rawBool(v) {
		return nil, nrFieldType // pydantic reads "true" or 1 as true: a stream all the same
	}
	if !rawTrue(f["stream"]) {
		return nil, ""
	}
	if reason := refusedShape(f, chat); reason != "" {
		return nil, reason
	}
	pl := &streamPlan{chat: chat}
	if reason := pl.read(f); reason != "" {
		return nil, reason
	}
	if reason := pl.forwardBody(f); reason != "" {
		return nil, reason
	}
	return pl, ""
}

// refusedShape is why a stream of this request cannot be continued
// exactly, whatever it generates ("": it can).
func refusedShape(f map[string]json.RawMessage, chat bool) string {
	if fieldTypesOdd(f) {
		return nrFieldType
	}
	if n, ok := rawInt(f["n"]); ok && n != 1 {
		return nrN
	}
	// best_of is no field of vLLM 0.32.0 (ignored: one ordinary sample),
	// nor are the guided_* fields (ignored with a warning, output
	// unconstrained): such a stream continues like any other.
	if rawTrue(f["use_beam_search"]) {
		return nrBeamSearch
	}
	if rf := f["response_format"]; !rawNull(rf) {
		var t struct{ Type string }
		if json.Unmarshal(rf, &t) != nil || (t.Type != "" && t.Type != "text") {
			return nrStructured
		}
	}
	switch {
	case !rawNull(f["structured_outputs"]):
		return nrStructured
	case rawTrue(f["echo"]):
		return nrEcho
	case !rawNull(f["logprobs"]) && string(f["logprobs"]) != "false", !rawNull(f["prompt_logprobs"]):
		return nrLogprobs
	}
	if chat {
		return refusedChat(f)
	}
	switch {
	case !rawNull(f["suffix"]):
		return nrSuffix
	case !rawNull(f["prompt_embeds"]):
		return nrEmbeds
	case severalPrompts(f["prompt"]):
		return nrPrompts
	}
	return ""
}

func refusedChat(f map[string]json.RawMessage) string {
	if tc := f["tool_choice"]; !rawNull(tc) && string(tc) != `"none"` && string(tc) != `"auto"` {
		return nrStructured // required or a named function: a grammar forces the call
	}
	// Tools the model may call: vLLM's tool parser holds text back while
	// it decides whether a call begins, and that state is lost.
	var tools []json.RawMessage
	if json.Unmarshal(f["tools"], &tools) == nil && len(tools) > 0 && string(f["tool_choice"]) != `"none"` {
		return nrTools
	}
	if multimodal(f["messages"]) {
		return nrMultimodal
	}
	return ""
}

// read takes from the request what a continuation needs to know.
func (pl *streamPlan) read(f map[string]json.RawMessage) string {
	pl.maxTokens = -1
	if pl.chat {
		if v, ok := rawInt(f["max_completion_tokens"]); ok {
			pl.maxTokens = v
		} else if v, ok := rawInt(f["max_tokens"]); ok {
			pl.maxTokens = v
		}
	} else {
		// vLLM's default for completions, also for an explicit null
		// (0.32.0's CompletionRequest.normalize_null_max_tokens).
		pl.maxTokens = 16
		if n, ok := rawInt(f["max_tokens"]); ok {
			pl.maxTokens = n
		}
	}
	pl.minTokens, _ = rawInt(f["min_tokens"])
	pl.wantIDs = rawTrue(f["return_token_ids"])
	if t, ok := rawFloat(f["temperature"]); ok && t == 0 {
		pl.greedy = true
	}
	var so struct {
		IncludeUsage *bool `json:"include_usage"`
		Continuous   *bool `json:"continuous_usage_stats"`
	}
	if !rawNull(f["stream_options"]) {
		if json.Unmarshal(f["stream_options"], &so) != nil {
			return nrFieldType
		}
		if so.Continuous != nil && *so.Continuous {
			return nrUsageStats
		}
		pl.usage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	return pl.readStops(f)
}

func (pl *streamPlan) readStops(f map[string]json.RawMessage) string {
	if s := f["stop"]; !rawNull(s) {
		var one string
		if json.Unmarshal(s, &one) == nil {
			pl.stops = []string{one}
		} else if json.Unmarshal(s, &pl.stops) != nil {
			return nrBadBody
		}
		pl.stops = nonEmpty(pl.stops)
	}
	pl.keepStop = rawTrue(f["include_stop_str_in_output"])
	if len(pl.stops) > 0 && !pl.keepStop {
		// The proxy asks vLLM for the stop string's text (forwardBody),
		// which also keeps the text of a stop token (stop_token_ids, and
		// EOS when special tokens are not skipped): the proxy cannot tell
		// it from the chunk's other text, so such a request is not
		// rewritten.
		var ids []json.RawMessage
		if (json.Unmarshal(f["stop_token_ids"], &ids) == nil && len(ids) > 0) || strings.TrimSpace(string(f["skip_special_tokens"])) == "false" {
			return nrStopTokenText
		}
	}
	return ""
}

// forwardBody is the request as the proxy sends it (token ids asked for),
// and the fields a continuation carries.
func (pl *streamPlan) forwardBody(f map[string]json.RawMessage) string {
	fwd := cloneFields(f)
	fwd["return_token_ids"] = json.RawMessage("true")
	if len(pl.stops) > 0 && !pl.keepStop {
		// vLLM holds back the text that may begin a stop string; at a cut
		// that text would be lost with it, while its tokens were already
		// delivered. So vLLM is asked to hold nothing back and the proxy
		// holds back exactly what vLLM would have (stopText).
		fwd["include_stop_str_in_output"] = json.RawMessage("true")
	}
	var err error
	if pl.forward, err = json.Marshal(fwd); err != nil {
		return nrBadBody
	}
	// Keep only what a continuation carries (not the messages or prompt:
	// they would be one more copy of the body).
	pl.fields = make(map[string]json.RawMessage, len(continuationFields)+1)
	for _, k := range append(continuationFields, "stream_options") {
		if v, ok := f[k]; ok {
			pl.fields[k] = v
		}
	}
	return ""
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

func rawBool(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "true" || s == "false"
}

// rawFloat reads a JSON number (not a string that holds one).
func rawFloat(v json.RawMessage) (float64, bool) {
	s := strings.TrimSpace(string(v))
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, false
	}
	var f float64
	return f, json.Unmarshal(v, &f) == nil
}

// The fields the proxy reads to plan a continuation, by the JSON type it
// reads them as. vLLM (pydantic, lax) also takes "12" for 12 and "true"
// or 1 for true; the proxy would read those as absent and get the count
// or the shape wrong, so a request that sends one is not rewritten.
var (
	numberFields = []string{"n", "max_tokens", "max_completion_tokens", "min_tokens", "temperature"}
	boolFields   = []string{"echo", "return_token_ids", "include_stop_str_in_output", "ignore_eos",
		"skip_special_tokens", "use_beam_search"}
)

func fieldTypesOdd(f map[string]json.RawMessage) bool {
	for _, k := range numberFields {
		if v, ok := f[k]; ok && !rawNull(v) {
			if _, num := rawFloat(v); !num {
				return true
			}
		}
	}
	for _, k := range boolFields {
		if v, ok := f[k]; ok && !rawNull(v) && !rawBool(v) {
			return true
		}
	}
	return false
}

func rawInt(v json.RawMessage) (int, bool) {
	f, ok := rawFloat(v)
	return int(f), ok
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
