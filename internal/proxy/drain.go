package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// A planned restart, as merged vLLM drains (--shutdown-timeout): on SIGTERM
// vLLM keeps accepting connections and finishes every new request at once
// with status 200, finish_reason "abort" and nothing generated; once its
// engine is gone a request gets 500 or a refused connection. While the
// guard does not call vLLM ready, the proxy must not hand a client such an
// empty aborted answer: a request that produced nothing is held and sent
// again once vLLM is back (or refused with 503 and Retry-After when its
// body cannot be sent again). A request that produced tokens is never sent
// again: its client gets what vLLM gave.

// peekLimit bounds what the proxy reads of an answer to judge it: an empty
// aborted answer is a few hundred bytes.
const peekLimit = 64 << 10

// errAbortedNoReplay: vLLM aborted a request that produced nothing while
// draining, and its body was not kept to be sent again.
var errAbortedNoReplay = errors.New("vLLM aborted the request while draining for a restart, and its body is too large to be sent again")

// producedNothing reads the start of an answer from a draining vLLM and
// says whether it produced nothing for its client: a 500 (the engine is
// gone), or a 200 whose every choice finished with "abort" and holds no
// text, content or tool call. resp's body is restored, to be passed on
// unchanged, when it did produce something or cannot be judged.
func producedNothing(resp *http.Response) bool {
	if resp.StatusCode == http.StatusInternalServerError {
		return true
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" {
		return false
	}
	ct := resp.Header.Get("Content-Type")
	var read bytes.Buffer
	br := bufio.NewReaderSize(resp.Body, 4096)
	nothing := false
	switch {
	case isEventStream(ct):
		nothing = streamProducedNothing(br, &read)
	case strings.HasPrefix(ct, "application/json"):
		b, _ := io.ReadAll(io.LimitReader(br, peekLimit+1))
		read.Write(b)
		if len(b) <= peekLimit {
			var a answer
			nothing = json.Unmarshal(b, &a) == nil && a.abortedEmpty()
		}
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(&read, br), resp.Body}
	return nothing
}

// streamProducedNothing reads SSE events until one decides: a token (or
// any other finish) means produced; "abort" with nothing before it, then
// [DONE] or the end, means nothing. What it read is kept in read.
func streamProducedNothing(br *bufio.Reader, read *bytes.Buffer) bool {
	aborted := false
	for read.Len() < peekLimit {
		line, err := br.ReadBytes('\n')
		read.Write(line)
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
		if ok {
			data = bytes.TrimSpace(data)
			if string(data) == "[DONE]" {
				return aborted
			}
			var a answer
			if json.Unmarshal(data, &a) != nil || a.produced() {
				return false
			}
			for _, c := range a.Choices {
				if c.FinishReason != nil {
					if *c.FinishReason != "abort" {
						return false
					}
					aborted = true
				}
			}
		}
		if err != nil {
			return aborted && errors.Is(err, io.EOF)
		}
	}
	return false
}

// answer is what the proxy reads of a completion, chat or stream chunk.
type answer struct {
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
		Text         string  `json:"text"`
		Message      *delta  `json:"message"`
		Delta        *delta  `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

type delta struct {
	Content          *string         `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	Reasoning        *string         `json:"reasoning"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
}

func (d *delta) produced() bool {
	if d == nil {
		return false
	}
	nonEmpty := func(s *string) bool { return s != nil && *s != "" }
	tc := bytes.TrimSpace(d.ToolCalls)
	return nonEmpty(d.Content) || nonEmpty(d.ReasoningContent) || nonEmpty(d.Reasoning) ||
		(len(tc) > 0 && string(tc) != "null" && string(tc) != "[]")
}

// produced: some choice holds generated text or a tool call, or the usage
// counts generated tokens.
func (a *answer) produced() bool {
	if a.Usage != nil && a.Usage.CompletionTokens > 0 {
		return true
	}
	for _, c := range a.Choices {
		if c.Text != "" || c.Message.produced() || c.Delta.produced() {
			return true
		}
	}
	return false
}

// abortedEmpty: a whole answer whose every choice was aborted with
// nothing generated.
func (a *answer) abortedEmpty() bool {
	if len(a.Choices) == 0 || a.produced() {
		return false
	}
	for _, c := range a.Choices {
		if c.FinishReason == nil || *c.FinishReason != "abort" {
			return false
		}
	}
	return true
}

// writeWaitLimit bounds how long a request to send again waits for the
// transport to finish writing its first copy (a vLLM that answered
// without reading the body may never take the rest).
const writeWaitLimit = 2 * time.Second

// closeSignal wraps a request body so that its closing is seen: the
// transport closes the body once it has written all of it (or failed), and
// may answer before that, in another goroutine. Only then is the body's
// copy for sending again complete, and safe to read.
func closeSignal(body io.ReadCloser) (io.ReadCloser, <-chan struct{}) {
	if body == nil || body == http.NoBody {
		return body, nil
	}
	c := &signalCloser{ReadCloser: body, closed: make(chan struct{})}
	return c, c.closed
}

type signalCloser struct {
	io.ReadCloser
	once   sync.Once
	closed chan struct{}
}

func (c *signalCloser) Close() error {
	err := c.ReadCloser.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// waitWritten waits until the transport is done with the request's body,
// the request ends, or writeWaitLimit passes (then the body is judged
// not kept).
func waitWritten(ctx context.Context, written <-chan struct{}) {
	if written == nil {
		return
	}
	t := time.NewTimer(writeWaitLimit)
	defer t.Stop()
	select {
	case <-written:
	case <-ctx.Done():
	case <-t.C:
	}
}

// What a 500 from vLLM says of its engine.
type engineState int

const (
	engineOther    engineState = iota // an error of the request, passed on
	engineDead                        // the engine died under the request (OOM, crash, kill)
	engineShutdown                    // vLLM is shutting down and took no new work
)

// The messages of vLLM's engine errors (VLLM-FACTS.md; the simulator's
// drain): a request that gets one produced nothing.
var (
	engineDeadMarks = []string{"EngineCore encountered an issue", "EngineDeadError", "Engine loop has died",
		"MQLLMEngine is already dead", "EngineCore encountered a fatal error", "engine is dead"}
	engineShutdownMarks = []string{"cannot schedule new futures after shutdown"}
)

// engineError reads a 500's body (at most peekLimit) and says whether it is
// vLLM's engine gone. The body is restored, to be passed on unchanged.
func engineError(resp *http.Response) engineState {
	if resp.Header.Get("Content-Encoding") != "" {
		return engineOther
	}
	br := bufio.NewReaderSize(resp.Body, 4096)
	b, _ := io.ReadAll(io.LimitReader(br, peekLimit))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), br), resp.Body}
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := string(b)
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	for _, m := range engineShutdownMarks {
		if strings.Contains(msg, m) {
			return engineShutdown
		}
	}
	for _, m := range engineDeadMarks {
		if strings.Contains(msg, m) {
			return engineDead
		}
	}
	return engineOther
}
