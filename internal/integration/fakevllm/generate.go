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

// tokenText is the text of one id, as /detokenize and the answers write it.
func tokenText(id int) string { return words[id%len(words)] }

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

// chatText is every message's content (a string or a list of
// {"type":"text","text":...} parts), in order.
func chatText(msgs []chatMessage) (string, error) {
	if len(msgs) == 0 {
		return "", errors.New("messages must not be empty")
	}
	var text strings.Builder
	for i, m := range msgs {
		c := bytes.TrimSpace(m.Content)
		if len(c) == 0 || string(c) == "null" {
			continue
		}
		var s string
		if err := json.Unmarshal(c, &s); err == nil {
			text.WriteString(s)
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(c, &parts); err != nil {
			return "", fmt.Errorf("messages[%d].content must be a string or a list of content parts", i)
		}
		for _, p := range parts {
			text.WriteString(p.Text)
		}
	}
	return text.String(), nil
}

// chatPromptIDs is the chat prompt's ids as the simulator's "chat
// template" renders it: the messages' text, tokenized (/tokenize with
// messages answers the same ids).
func chatPromptIDs(msgs []chatMessage) ([]int, error) {
	text, err := chatText(msgs)
	if err != nil {
		return nil, err
	}
	return tokenIDs(text), nil
}

// chatTokens counts a chat prompt's tokens.
func chatTokens(msgs []chatMessage) (int, error) {
	ids, err := chatPromptIDs(msgs)
	return len(ids), err
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
	strings    []string
	ids        map[int]bool
	include    bool // include_stop_str_in_output
	minTokens  int
	holdChars  int // text held back while a stop string may be forming
	outputText string
	sent       int // bytes of outputText already sent
	generated  int
}

func newStopRule(req *completionRequest) (*stopRule, error) {
	r := &stopRule{include: req.IncludeStopStrInOutput, minTokens: req.MinTokens}
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
			r.ids[id] = true
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
	if !stopID || r.include {
		r.outputText += tokenText(id)
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
		until = len(r.outputText) - r.holdChars
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
