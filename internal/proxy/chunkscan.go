// A stream's chunks read without decoding them: checked (json.Valid),
// walked once for the few members the proxy needs, and passed on as vLLM
// sent them with only the values the proxy changes replaced (rewrite.go).
// Decoding every chunk into maps and encoding it again cost about 50 µs and
// 150 allocations a chunk, and changed the bytes a client gets (the keys'
// order). Anything unusual (escaped or case-folded keys, duplicate members,
// ids that are not plain integers, several choices) is not read: such a
// stream is not continued.

package proxy

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// jsonSpan is a value's place in a chunk: data[start:end]; end 0: absent.
type jsonSpan struct{ start, end int }

func (p jsonSpan) has() bool { return p.end > 0 }

// chunkScan is what the proxy reads of one chunk with one choice.
type chunkScan struct {
	b                  []byte
	id, created, model jsonSpan
	topPrompt          jsonSpan // prompt_token_ids at the top level (chat's first chunk)
	text               jsonSpan // the choice's text (completions) or delta.content (chat): a JSON string
	tokenIDs, prompt   jsonSpan // the choice's token_ids and prompt_token_ids
	finish, stopReason jsonSpan // the choice's finish_reason and stop_reason
	usage              jsonSpan // a usage chunk's usage
	role               bool     // the delta holds a role
	output             bool     // the delta holds output (deltaHasOutput)
	reasoning          bool     // the delta holds reasoning or tool-call output
	// The ids read (none for an absent or null member); their arrays are
	// reused from chunk to chunk.
	choices                      jsonSpan
	ids, promptIDs, topPromptIDs []int
	idsBuf, promptBuf, topBuf    []int
	keys                         [8]jsonSpan // a delta's keys seen (duplicates)
}

// choiceFields are the choice members the decoding path reads through a
// struct, whose names encoding/json matches case-insensitively: a key that
// differs from one only in case is left to that path.
var choiceFields = []string{"index", "text", "delta", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}

// What a chunk is, as read.
type chunkKind int

const (
	chunkOdd    chunkKind = iota // not read: an error, or an unusual chunk
	chunkChoice                  // one choice
	chunkUsage                   // no choice, the usage
)

// read scans data (one chunk, already known to be valid JSON).
func (c *chunkScan) read(data []byte, chat bool) chunkKind {
	if !c.readTop(data) {
		return chunkOdd
	}
	return c.kind(chat)
}

func (c *chunkScan) readTop(data []byte) bool {
	*c = chunkScan{b: data, idsBuf: c.idsBuf, promptBuf: c.promptBuf, topBuf: c.topBuf}
	i := skipWS(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	var choices, object, usage, errv jsonSpan
	ok := true
	end := objectMembers(data, i, func(key jsonSpan, esc bool, v jsonSpan) bool {
		if esc {
			return false // a key with an escape may spell any name
		}
		var slot *jsonSpan
		switch string(data[key.start:key.end]) {
		case "id":
			slot = &c.id
		case "created":
			slot = &c.created
		case "model":
			slot = &c.model
		case "object":
			slot = &object
		case "choices":
			slot = &choices
		case "usage":
			slot = &usage
		case "error":
			slot = &errv
		case "prompt_token_ids":
			slot = &c.topPrompt
		default:
			return true
		}
		if slot.has() {
			return false // a duplicate: the last one counts there
		}
		*slot = v
		return true
	})
	if end < 0 || !choices.has() || data[choices.start] != '[' {
		return false
	}
	// vLLM's flat error event, an error: not a chunk.
	if string(data[object.start:object.end]) == `"error"` || (errv.has() && !isNull(data, errv)) {
		return false
	}
	if usage.has() && !isNull(data, usage) {
		c.usage = usage
	}
	c.choices = choices
	if c.topPrompt.has() && !isNull(data, c.topPrompt) {
		if c.topBuf, ok = readInts(data, c.topPrompt, c.topBuf); !ok {
			return false
		}
		c.topPromptIDs = c.topBuf
	}
	return true
}

// kind reads the chunk's choices: one, an object (its usage, if any, is
// continuous usage: not read), or none with a usage.
func (c *chunkScan) kind(chat bool) chunkKind {
	data := c.b
	n := 0
	var choice jsonSpan
	if arrayElems(data, c.choices.start, func(v jsonSpan) bool {
		n++
		choice = v
		return n == 1
	}) < 0 {
		return chunkOdd
	}
	switch {
	case n == 0 && c.usage.has():
		return chunkUsage
	case n != 1 || c.usage.has() || data[choice.start] != '{':
		return chunkOdd
	case c.readChoice(choice, chat):
		return chunkChoice
	}
	return chunkOdd
}

func (c *chunkScan) readChoice(choice jsonSpan, chat bool) bool {
	data := c.b
	var text, delta jsonSpan
	var seen [7]bool
	if objectMembers(data, choice.start, func(key jsonSpan, esc bool, v jsonSpan) bool {
		k := data[key.start:key.end]
		if esc || !ascii(k) {
			return false // an escape, or a letter that folds to an ASCII one (K, ſ)
		}
		for fi, f := range choiceFields {
			if string(k) == f {
				if seen[fi] {
					return false
				}
				seen[fi] = true
				switch fi {
				case 1:
					text = v
				case 2:
					delta = v
				case 3:
					c.finish = v
				case 4:
					c.stopReason = v
				case 5:
					c.tokenIDs = v
				case 6:
					c.prompt = v
				}
				return true
			}
			if bytes.EqualFold(k, []byte(f)) {
				return false
			}
		}
		return true
	}) < 0 {
		return false
	}
	if c.finish.has() && !isNull(data, c.finish) && data[c.finish.start] != '"' {
		return false
	}
	var ok bool
	if c.tokenIDs.has() && !isNull(data, c.tokenIDs) {
		if c.idsBuf, ok = readInts(data, c.tokenIDs, c.idsBuf); !ok {
			return false
		}
		c.ids = c.idsBuf
	}
	if c.prompt.has() && !isNull(data, c.prompt) {
		if c.promptBuf, ok = readInts(data, c.prompt, c.promptBuf); !ok {
			return false
		}
		c.promptIDs = c.promptBuf
	}
	if !chat {
		if delta.has() || !text.has() || data[text.start] != '"' {
			return false
		}
		c.text = text
		return true
	}
	if text.has() || !delta.has() || data[delta.start] != '{' {
		return false
	}
	return c.readDelta(delta)
}

// readDelta reads a chat choice's delta: its role, content and output.
func (c *chunkScan) readDelta(delta jsonSpan) bool {
	data := c.b
	nkeys := 0
	return objectMembers(data, delta.start, func(key jsonSpan, esc bool, v jsonSpan) bool {
		k := data[key.start:key.end]
		if esc || nkeys == len(c.keys) {
			return false
		}
		for _, s := range c.keys[:nkeys] {
			if bytes.Equal(data[s.start:s.end], k) {
				return false // a duplicate: the last one counts there
			}
		}
		c.keys[nkeys] = key
		nkeys++
		switch string(k) {
		case "role":
			c.role = true
			return true
		case "content":
			if data[v.start] != '"' {
				return false // null or not a string: the decoding path writes ""
			}
			c.text = v
		}
		raw := data[v.start:v.end]
		out := !isNull(data, v) && string(raw) != `""` && string(raw) != "[]"
		c.output = c.output || out
		switch string(k) {
		case "reasoning", "reasoning_content", "tool_calls":
			c.reasoning = c.reasoning || out
		}
		return true
	}) >= 0
}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func isNull(data []byte, v jsonSpan) bool { return string(data[v.start:v.end]) == "null" }

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd: i at a string's opening quote; the index after its closing
// one, and whether it holds an escape.
func stringEnd(b []byte, i int) (int, bool) {
	esc := false
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			esc = true
			i++
		case '"':
			return i + 1, esc
		}
	}
	return len(b), esc
}

// valueEnd: i at a value's first byte (of valid JSON); the index after it.
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		e, _ := stringEnd(b, i)
		return e
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i, _ = stringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for i < len(b) {
		switch b[i] {
		case ',', ']', '}', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// objectMembers calls f with each member of the object at i (valid JSON):
// its key's bytes between the quotes, whether the key holds an escape, and
// its value. It returns the index after the object, or -1 when f said
// false.
func objectMembers(b []byte, i int, f func(key jsonSpan, esc bool, v jsonSpan) bool) int {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	for i < len(b) {
		ke, esc := stringEnd(b, i)
		key := jsonSpan{i + 1, ke - 1}
		i = skipWS(b, ke)
		i = skipWS(b, i+1) // ':'
		ve := valueEnd(b, i)
		if !f(key, esc, jsonSpan{i, ve}) {
			return -1
		}
		i = skipWS(b, ve)
		if i < len(b) && b[i] == '}' {
			return i + 1
		}
		i = skipWS(b, i+1) // ','
	}
	return -1
}

// arrayElems calls f with each element of the array at i (valid JSON); it
// returns the index after the array, or -1 when f said false.
func arrayElems(b []byte, i int, f func(v jsonSpan) bool) int {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	for i < len(b) {
		ve := valueEnd(b, i)
		if !f(jsonSpan{i, ve}) {
			return -1
		}
		i = skipWS(b, ve)
		if i < len(b) && b[i] == ']' {
			return i + 1
		}
		i = skipWS(b, i+1)
	}
	return -1
}

// readInts reads v, an array of integers, into buf (emptied first): false
// when v is not an array or an element is not an integer that an int
// holds (at most 18 digits here; token ids have 6).
func readInts(b []byte, v jsonSpan, buf []int) ([]int, bool) {
	buf = buf[:0]
	if b[v.start] != '[' {
		return buf, false
	}
	ok := true
	arrayElems(b, v.start, func(e jsonSpan) bool {
		d := b[e.start:e.end]
		neg := len(d) > 0 && d[0] == '-'
		if neg {
			d = d[1:]
		}
		if len(d) == 0 || len(d) > 18 {
			ok = false
			return false
		}
		n := 0
		for _, c := range d {
			if c < '0' || c > '9' {
				ok = false
				return false
			}
			n = n*10 + int(c-'0')
		}
		if neg {
			n = -n
		}
		buf = append(buf, n)
		return true
	})
	return buf, ok
}

// jsonString decodes a JSON string's bytes (quotes included).
func jsonString(raw []byte) string {
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in)
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}
