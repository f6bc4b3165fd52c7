package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// request is one of the bench's requests: a greedy completion or chat,
// half of them with stop strings, streamed or not, always the same body
// for the same index.
type request struct {
	idx  int
	chat bool
}

// requestFor is the i-th request of the pool: completions and chat in
// turn, each with its own prompt.
func requestFor(i int) request { return request{idx: i % promptPool, chat: i%2 == 1} }

func (q request) path() string {
	if q.chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

func (q request) body(stream bool) []byte {
	prompt := fmt.Sprintf("request %d: tell me something about the number %d, then go on", q.idx, q.idx*7919)
	m := map[string]any{"model": model, "max_tokens": maxTokens, "temperature": 0, "stream": stream}
	if q.chat {
		m["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		m["prompt"] = prompt
	}
	if sampled {
		// Sampled (issue 40): vLLM's default temperature, a seed for a
		// third of them; the ids and the usage asked, so that what the
		// client got can be checked for consistency (no reference answer
		// exists for a sample).
		m["temperature"] = 0.8
		if q.idx%3 == 0 {
			m["seed"] = q.idx
		}
		if stream {
			m["return_token_ids"] = true
			m["stream_options"] = map[string]bool{"include_usage": true}
		}
	}
	if st := q.stops(); st != nil {
		// Stop strings (issue 40): the proxy holds their text back itself,
		// and a cut must neither repeat nor lose it.
		m["stop"] = st
	}
	b, _ := json.Marshal(m)
	return b
}

// stops are the request's stop strings (half of the pool has them).
func (q request) stops() []string {
	if q.idx%4 >= 2 {
		return []string{"wn. f", "zzzz"}
	}
	return nil
}

// record is one request as its client saw it.
type record struct {
	req        request
	start, end time.Time
	status     int    // 0: no answer
	err        string // transport error
	done       bool   // data: [DONE] came
	errEvent   bool   // an SSE error event came
	text       string
	ids        []int  // the completion's ids, as the chunks gave them (sampled runs ask for them)
	usage      int    // usage.completion_tokens; -1: none came
	finish     string // the last finish_reason
}

// chunk is the part of a completion or chat chunk the clients read.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		TokenIDs     []int   `json:"token_ids"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error  json.RawMessage `json:"error"`
	Object string          `json:"object"` // vLLM's ErrorResponse: "error"
}

// do sends q streamed and reads it to its end.
func do(ctx context.Context, c *http.Client, base string, q request) record {
	r := record{req: q, start: time.Now(), usage: -1}
	defer func() { r.end = time.Now() }()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+q.path(), bytes.NewReader(q.body(true)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		r.err = err.Error()
		r.end = time.Now()
		return r
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		r.end = time.Now()
		return r
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // blank lines, SSE comments (the guard's keep-alives)
		}
		if line == "[DONE]" {
			r.done = true
			continue
		}
		var ch chunk
		if json.Unmarshal([]byte(line), &ch) != nil || (len(ch.Error) > 0 && string(ch.Error) != "null") || ch.Object == "error" {
			r.errEvent = true
			continue
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
			text.WriteString(c.Delta.Content)
			r.ids = append(r.ids, c.TokenIDs...)
			if c.FinishReason != nil {
				r.finish = *c.FinishReason
			}
		}
		if ch.Usage != nil {
			r.usage = ch.Usage.CompletionTokens
		}
	}
	if err := sc.Err(); err != nil {
		r.err = err.Error()
	}
	r.text = text.String()
	r.end = time.Now()
	return r
}

// load is the steady load: clients, each sending request after request
// until stopped.
type load struct {
	base    string
	client  *http.Client
	stopNew chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	recs    []record
	next    int
}

func startLoad(base string, clients int) *load {
	l := &load{base: base, stopNew: make(chan struct{}),
		client: &http.Client{Timeout: requestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true}}}
	for range clients {
		l.wg.Add(1)
		go l.run()
	}
	return l
}

func (l *load) run() {
	defer l.wg.Done()
	for {
		select {
		case <-l.stopNew:
			return
		default:
		}
		l.mu.Lock()
		q := requestFor(l.next)
		l.next++
		l.mu.Unlock()
		r := do(context.Background(), l.client, l.base, q)
		l.mu.Lock()
		l.recs = append(l.recs, r)
		l.mu.Unlock()
		if r.status != http.StatusOK || !r.done || r.errEvent {
			// A failed client waits a little before its next request, as
			// a client with a retry would.
			select {
			case <-l.stopNew:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// stop lets the requests in flight end (each within requestTimeout) and
// returns every record.
func (l *load) stop() []record {
	close(l.stopNew)
	l.wg.Wait()
	l.client.CloseIdleConnections()
	return l.recs
}

// reference is every pool request's uninterrupted greedy answer: sent
// once, not streamed, to a simulator that does not fail.
func reference(ctx context.Context, base string) (map[request]string, error) {
	c := &http.Client{Timeout: time.Minute}
	out := map[request]string{}
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range promptPool {
		q := requestFor(i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			text, err := answer(ctx, c, base, q)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			out[q] = text
		}()
	}
	wg.Wait()
	return out, first
}

func answer(ctx context.Context, c *http.Client, base string, q request) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+q.path(), bytes.NewReader(q.body(false)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("the reference answer to %s: %d %s", q.path(), resp.StatusCode, body)
	}
	var a struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &a); err != nil || len(a.Choices) != 1 {
		return "", fmt.Errorf("the reference answer to %s: %s", q.path(), body)
	}
	return a.Choices[0].Text + a.Choices[0].Message.Content, nil
}
