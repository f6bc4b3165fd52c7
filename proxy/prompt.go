package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"time"
	"unicode/utf8"
)

// promptParseCap: bodies up to this size are read before admission and
// their prompt counted; a larger one is estimated from its length unread,
// so that a queued request holds at most this much of its body in memory.
const promptParseCap = 1 << 20

// readPrompt estimates the request's prompt tokens before admission. It
// reads a body of up to promptParseCap bytes (and puts it back for vLLM)
// and counts the text of "prompt", "messages" (each content, text parts)
// and "input" at 4 characters a token, token ids at one each (vLLM's
// tokenizers average about 4 characters of English a token). A body that is
// not such JSON, or larger than the cap, counts a quarter of its bytes. ok
// is false when it answered the request itself (body too large, read
// failed).
func (p *Proxy) readPrompt(w http.ResponseWriter, r *http.Request) (tokens float64, ok bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return 0, true
	}
	if r.ContentLength > promptParseCap {
		return float64(r.ContentLength) / 4, true
	}
	var body io.Reader = r.Body
	if p.cfg.MaxBodyBytes > 0 {
		body = http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	buf, err := io.ReadAll(io.LimitReader(body, promptParseCap+1))
	_ = rc.SetReadDeadline(time.Time{})
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		p.tooLarge(w, mbe.Limit+1)
		return 0, false
	case errors.Is(err, os.ErrDeadlineExceeded):
		writeError(w, http.StatusRequestTimeout, "invalid_request_error", "request body not received within "+bodyReadTimeout.String())
		return 0, false
	case err != nil:
		return 0, false // the client went away
	}
	if len(buf) > promptParseCap {
		// A chunked body over the cap: the rest follows unread.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		return float64(len(buf)) / 4, true
	}
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.ContentLength = int64(len(buf))
	return PromptTokens(buf), true
}

// PromptTokens estimates the prompt tokens of an OpenAI-style request body
// (the rule readPrompt documents).
func PromptTokens(body []byte) float64 {
	var req struct {
		Prompt   json.RawMessage `json:"prompt"`
		Input    json.RawMessage `json:"input"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return float64(len(body)) / 4
	}
	n := textTokens(req.Prompt) + textTokens(req.Input)
	for _, m := range req.Messages {
		n += textTokens(m.Content)
	}
	return n
}

// textTokens counts a string, a list of strings, token ids, a list of
// token-id lists, or a list of content parts ({"type": "text", "text": …};
// other parts count nothing).
func textTokens(raw json.RawMessage) float64 {
	if len(raw) == 0 {
		return 0
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return float64(utf8.RuneCountInString(s)) / 4
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return 0
	}
	n := 0.0
	for _, item := range list {
		var id json.Number
		var part struct {
			Text string `json:"text"`
		}
		switch {
		case json.Unmarshal(item, &id) == nil:
			n++
		case len(item) > 0 && (item[0] == '"' || item[0] == '['):
			n += textTokens(item)
		case json.Unmarshal(item, &part) == nil:
			n += float64(utf8.RuneCountInString(part.Text)) / 4
		}
	}
	return n
}
