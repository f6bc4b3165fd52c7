package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"unicode/utf8"
)

// The simulator's tokenizer and model: prompts become token ids, each
// generated id is a pure function of every id before it (the prompt's and
// the generated ones), so that a greedy request continued from its prompt
// plus a prefix of its output yields exactly the rest of it, as vLLM's
// greedy decoding does (docs/resume-facts.md).

// The vocabulary: ids below firstWordID are special tokens (none is ever
// generated), ids up to vocabSize are words.
const (
	firstWordID = 1000
	vocabSize   = 32000
)

// tokenIDs stands in for the tokenizer: one id per four characters of
// text (at least one), in the vocabulary.
func tokenIDs(text string) []int {
	n := textTokens(text)
	ids := make([]int, n)
	for i := range ids {
		chunk := text[min(len(text), i*4):min(len(text), i*4+4)]
		h := 0
		for _, c := range []byte(chunk) {
			h = (h*131 + int(c)) % (vocabSize - firstWordID)
		}
		ids[i] = firstWordID + h
	}
	return ids
}

func textTokens(s string) int { return max(len(s)/4, 1) }

// Special ids: the chat template's (vLLM skips them in the text).
const (
	idEOS       = 1
	idUser      = 3
	idAssistant = 4
	idSystem    = 5
)

// tokenBytes is one id's bytes: the id's word. With split characters
// (FAKEVLLM_SPLIT_CHARS), as a byte-level tokenizer splits "é" (and emoji,
// CJK) over two ids, an id whose tens digit is 0 ends with the first byte
// of "é" and one whose tens digit is 1 starts with its second byte; a
// first byte not followed by a second is invalid UTF-8.
func tokenBytes(id int, split bool) string {
	if id < firstWordID {
		return ""
	}
	w := words[id%len(words)]
	if split {
		switch id / 10 % 10 {
		case 0:
			return w + "\xc3"
		case 1:
			return "\xa9" + w
		}
	}
	return w
}

// decode is the text of bytes as vLLM's tokenizer writes it: each invalid
// byte (an incomplete character at the end too) as U+FFFD.
func decode(b string) string {
	var out strings.Builder
	for len(b) > 0 {
		r, size := utf8.DecodeRuneInString(b)
		out.WriteRune(r) // RuneError, size 1, for an invalid byte
		b = b[size:]
	}
	return out.String()
}

// endsInsideChar says whether b ends with an incomplete character.
func endsInsideChar(b string) bool {
	for i := len(b) - 1; i >= max(0, len(b)-utf8.UTFMax+1); i-- {
		if utf8.RuneStart(b[i]) { // the last character's first byte
			return !utf8.FullRuneInString(b[i:])
		}
	}
	return false
}

// detokenize is the text of ids (/detokenize).
func detokenize(ids []int, split bool) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(tokenBytes(id, split))
	}
	return decode(b.String())
}

// textStream is vLLM's incremental detokenizer (tokenizers' DecodeStream,
// primed with the prompt's ids): an id whose bytes leave a character
// incomplete gives no text at all, and the next id that completes it
// gives the text of both. Primed with a prompt that itself ends inside a
// character, vLLM 0.32.0 starts from the prompt's beginning: its first
// text is the whole prompt's text, then the output's
// (docs/resume-facts.md). A character left incomplete at the end is never
// written.
type textStream struct {
	split   bool
	pending string
}

func newTextStream(prompt []int, split bool) *textStream {
	t := &textStream{split: split}
	if split {
		var b strings.Builder
		for _, id := range prompt {
			b.WriteString(tokenBytes(id, true))
		}
		if endsInsideChar(b.String()) {
			t.pending = b.String()
		}
	}
	return t
}

func (t *textStream) next(id int) string {
	t.pending += tokenBytes(id, t.split)
	if endsInsideChar(t.pending) {
		return ""
	}
	s := decode(t.pending)
	t.pending = ""
	return s
}

var words = []string{" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."}

var errNoPrompt = errors.New("You must pass at least one prompt")

// promptIDs is a completion prompt's token ids: a string is tokenized, a
// list of ids is used as given (vLLM adds no special token to it), a list
// of strings or of id lists is taken as one prompt (vLLM answers one
// choice per element; the simulator does not).
func promptIDs(raw json.RawMessage) ([]int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("Either prompt or prompt_embeds must be provided and non-empty.")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return tokenIDs(s), nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("prompt must be a string, a list of strings or a list of token ids")
	}
	if len(list) == 0 {
		return nil, errNoPrompt
	}
	var ids []int
	for _, item := range list {
		var id int
		var sub []int
		switch {
		case json.Unmarshal(item, &s) == nil:
			ids = append(ids, tokenIDs(s)...)
		case json.Unmarshal(item, &id) == nil:
			ids = append(ids, id)
		case json.Unmarshal(item, &sub) == nil:
			if len(sub) == 0 {
				return nil, errNoPrompt
			}
			ids = append(ids, sub...)
		default:
			return nil, errors.New("prompt must be a string, a list of strings or a list of token ids")
		}
	}
	for _, id := range ids {
		if id < 0 || id >= vocabSize {
			return nil, fmt.Errorf("Token id %d is out of vocabulary", id)
		}
	}
	return ids, nil
}

// promptTokens counts a prompt's tokens (pooling inputs take the same
// shapes as completion prompts).
func promptTokens(raw json.RawMessage) (int, error) {
	ids, err := promptIDs(raw)
	return len(ids), err
}

// contentText is a message's content: a string or a list of
// {"type":"text","text":...} parts.
func contentText(c json.RawMessage) (string, error) {
	c = bytes.TrimSpace(c)
	if len(c) == 0 || string(c) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(c, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return "", errors.New("content must be a string or a list of content parts")
	}
	var text strings.Builder
	for _, p := range parts {
		text.WriteString(p.Text)
	}
	return text.String(), nil
}

// chatPromptIDs is the chat prompt's ids as the simulator's chat template
// renders it, like the tiny model's: per message a role token, the
// content's ids and an end token, then the assistant's token (with
// add_generation_prompt, vLLM's default). /tokenize with the messages
// gives the same ids.
func chatPromptIDs(msgs []chatMessage, generationPrompt bool) ([]int, error) {
	if len(msgs) == 0 {
		return nil, errors.New("messages must not be empty")
	}
	var ids []int
	for i, m := range msgs {
		text, err := contentText(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d].%w", i, err)
		}
		switch m.Role {
		case "system":
			ids = append(ids, idSystem)
		case "assistant":
			ids = append(ids, idAssistant)
		default:
			ids = append(ids, idUser)
		}
		if text != "" {
			ids = append(ids, tokenIDs(text)...)
		}
		ids = append(ids, idEOS)
	}
	if generationPrompt {
		ids = append(ids, idAssistant)
	}
	return ids, nil
}

// sampler is the simulated model. Its state is a hash of every id it has
// seen; a greedy request's next id is a function of that state alone. A
// sampled request (temperature omitted or above vLLM's 1e-5) mixes in a
// per-request generator, seeded by the request's seed when it has one:
// like vLLM's, it restarts with each request, so a continuation does not
// reproduce the rest of a sample.
type sampler struct {
	state  uint64
	greedy bool
	gen    *rand.Rand
}

func newSampler(prompt []int, greedy bool, seed *int64) *sampler {
	s := &sampler{state: 14695981039346656037, greedy: greedy}
	if !greedy {
		src := rand.Uint64()
		if seed != nil {
			src = uint64(*seed)
		}
		s.gen = rand.New(rand.NewPCG(src, 0x9e3779b97f4a7c15))
	}
	for _, id := range prompt {
		s.absorb(id)
	}
	return s
}

func (s *sampler) absorb(id int) {
	s.state = (s.state ^ uint64(id)) * 1099511628211
}

func (s *sampler) next() int {
	x := s.state
	if !s.greedy {
		x ^= s.gen.Uint64()
	}
	// splitmix64's finalizer: every bit of the state moves the id.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	id := firstWordID + int(x%uint64(vocabSize-firstWordID))
	s.absorb(id)
	return id
}

// stopRule is a request's stop conditions as vLLM applies them.
type stopRule struct {
	text       *textStream
	strings    []string
	ids        map[int]bool
	include    bool // include_stop_str_in_output
	minTokens  int
	holdChars  int // text held back while a stop string may be forming
	outputText string
	sent       int // bytes of outputText already sent
	generated  int
}

func newStopRule(req *completionRequest, text *textStream) (*stopRule, error) {
	r := &stopRule{text: text, include: req.IncludeStopStrInOutput, minTokens: int(req.MinTokens)}
	if s := bytes.TrimSpace(req.Stop); len(s) > 0 && string(s) != "null" {
		var one string
		if err := json.Unmarshal(s, &one); err == nil {
			r.strings = []string{one}
		} else if err := json.Unmarshal(s, &r.strings); err != nil {
			return nil, errors.New("stop must be a string or a list of strings")
		}
	}
	r.strings = slicesDeleteEmpty(r.strings)
	if len(req.StopTokenIDs) > 0 {
		r.ids = map[int]bool{}
		for _, id := range req.StopTokenIDs {
			r.ids[int(id)] = true
		}
	}
	if len(r.strings) > 0 && !r.include {
		for _, s := range r.strings {
			r.holdChars = max(r.holdChars, utf8.RuneCountInString(s)-1)
		}
	}
	return r, nil
}

func slicesDeleteEmpty(ss []string) []string {
	out := ss[:0]
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// step takes one generated id and says what text goes out with it and
// whether it ended the request (reason: the stop string or the stop id).
// As vLLM's detokenizer: a stop id counts once min_tokens ids were
// generated and its text is dropped unless include_stop_str_in_output;
// stop strings are searched in the output text only (never the prompt)
// once more than min_tokens ids were generated, the text is cut before
// the stop string (or after it with include_stop_str_in_output), and the
// last holdChars characters are held back until the request ends. last
// says the request ends here anyway (max_tokens).
func (r *stopRule) step(id int, last bool) (delta string, reason any, stopped bool) {
	r.generated++
	stopID := r.ids[id] && r.generated >= r.minTokens
	before := len(r.outputText)
	if !stopID || r.include { // vLLM does not detokenize a stop id it drops
		r.outputText += r.text.next(id)
	}
	if stopID {
		reason, stopped = id, true
	}
	// A stop string completed by a stop id kept in the text wins, as in
	// vLLM's output processor.
	if len(r.strings) > 0 && r.generated > r.minTokens {
		best, bestAt, bestEnd := "", -1, len(r.outputText)+1
		for _, s := range r.strings {
			from := max(0, before-len(s)+1)
			if i := strings.Index(r.outputText[from:], s); i >= 0 && from+i+len(s) < bestEnd {
				best, bestAt, bestEnd = s, from+i, from+i+len(s)
			}
		}
		if bestAt >= 0 {
			reason, stopped = best, true
			if r.include {
				r.outputText = r.outputText[:bestEnd]
			} else {
				r.outputText = r.outputText[:bestAt]
			}
		}
	}
	until := len(r.outputText)
	if !stopped && !last {
		// Hold back holdChars characters (not bytes: "é" is two).
		for range r.holdChars {
			if until <= r.sent {
				break
			}
			_, size := utf8.DecodeLastRuneInString(r.outputText[:until])
			until -= size
		}
	}
	if until > r.sent {
		delta = r.outputText[r.sent:until]
		r.sent = until
	}
	return delta, reason, stopped
}

// obj is a JSON object that keeps its keys in the order vLLM writes them.
type obj []kv

type kv struct {
	k string
	v any
}

func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.k)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(f.v)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// systemFingerprint is vLLM 0.32.0's "vllm-<version>-<hash of the
// config>"; the simulator hashes the model's name.
func systemFingerprint(version, model string) string {
	h := fnv.New32a()
	h.Write([]byte(model))
	return fmt.Sprintf("vllm-%s-%08x", version, h.Sum32())
}
