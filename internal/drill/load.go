package drill

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
	"strings"
	"sync"
	"time"
)

// Outcome is how one request ended.
type Outcome string

const (
	OutcomeOK        Outcome = "ok"
	Outcome429       Outcome = "429"              // the proxy's admission control (or a rate limiter)
	Outcome503       Outcome = "503"              // not ready: restarting, or an engine death
	Outcome5xx       Outcome = "5xx"              // any other 5xx
	Outcome4xx       Outcome = "4xx"              // a request vLLM refused (wrong model, too long)
	OutcomeConnError Outcome = "connection_error" // refused, reset, or closed mid-answer
	OutcomeTimeout   Outcome = "timeout"          // --timeout passed
	OutcomeStreamCut Outcome = "stream_cut"       // a stream ended by an error event or without [DONE]
)

// Outcomes lists every outcome in report order.
var Outcomes = []Outcome{OutcomeOK, Outcome429, Outcome503, Outcome5xx, Outcome4xx, OutcomeConnError, OutcomeTimeout, OutcomeStreamCut}

// QueueWaitHeader is set by the guard's proxy on answers to requests that
// waited for a slot (proxy.QueueWaitHeader; repeated here so the drill
// does not link the proxy).
const QueueWaitHeader = "X-Vllm-Guard-Queue-Wait-Ms"

// result is one request.
type result struct {
	start   time.Time
	outcome Outcome
	status  int
	latency time.Duration
	ttft    time.Duration // 0: no token seen
	queued  bool
	detail  string // what went wrong, for the report's examples
}

// runLoad runs the workers until o.Duration has passed and every request
// they started has ended.
func runLoad(ctx context.Context, o Options) []result {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: o.Concurrency,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	path := "/v1/completions"
	if o.Chat {
		path = "/v1/chat/completions"
	}
	endpoint := strings.TrimRight(o.URL, "/") + path

	start := time.Now()
	stopAt := start.Add(o.Duration)
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	for w := range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o.Ramp > 0 {
				pause(ctx, o.Ramp*time.Duration(w)/time.Duration(o.Concurrency))
			}
			for seq := 0; time.Now().Before(stopAt) && ctx.Err() == nil; seq++ {
				body := requestBody(o, fmt.Sprintf("w%d-%d", w, seq))
				r, counted := doRequest(ctx, client, endpoint, body, o)
				if !counted {
					return
				}
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
				if r.outcome == OutcomeConnError {
					// Nobody listens (vLLM is down): do not spin on refusals.
					pause(ctx, connErrorPause)
				}
			}
		}()
	}
	wg.Wait()
	return results
}

// connErrorPause is a worker's rest after a connection error.
const connErrorPause = 100 * time.Millisecond

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// prompt is text of n tokens at 4 characters each, unique per request
// (tag) so that no prefix cache makes it cheap.
func prompt(tokens int, tag string) string {
	const filler = "The quick brown fox jumps over the lazy dog while the drill measures. "
	var b strings.Builder
	n := tokens * 4
	b.Grow(n)
	b.WriteString("[drill " + tag + "] ")
	for b.Len() < n {
		b.WriteString(filler)
	}
	return b.String()[:n]
}

func requestBody(o Options, tag string) []byte {
	req := map[string]any{"model": o.Model, "max_tokens": o.MaxTokens, "temperature": 0, "stream": o.Stream}
	text := prompt(o.PromptTokens, tag)
	if o.Chat {
		req["messages"] = []map[string]string{{"role": "user", "content": text}}
	} else {
		req["prompt"] = text
	}
	b, _ := json.Marshal(req)
	return b
}

// doRequest sends one request and classifies it. counted is false when
// the drill itself was interrupted.
func doRequest(parent context.Context, client *http.Client, endpoint string, body []byte, o Options) (r result, counted bool) {
	ctx, cancel := context.WithTimeout(parent, o.Timeout)
	defer cancel()
	r.start = time.Now()
	fail := func(err error) (result, bool) {
		r.latency = time.Since(r.start)
		switch {
		case parent.Err() != nil:
			return r, false
		case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
			r.outcome = OutcomeTimeout
		default:
			r.outcome = OutcomeConnError
		}
		r.detail = err.Error()
		return r, true
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	if o.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := client.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	r.queued = resp.Header.Get(QueueWaitHeader) != ""
	if resp.StatusCode != http.StatusOK {
		msg, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			return fail(err)
		}
		r.latency = time.Since(r.start)
		switch code := resp.StatusCode; {
		case code == http.StatusTooManyRequests:
			r.outcome = Outcome429
		case code == http.StatusServiceUnavailable:
			r.outcome = Outcome503
		case code >= 500:
			r.outcome = Outcome5xx
		default:
			r.outcome = Outcome4xx
		}
		r.detail = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return r, true
	}
	if !o.Stream || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		r.ttft = time.Since(r.start)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return fail(err)
		}
		r.latency = time.Since(r.start)
		r.outcome = OutcomeOK
		return r, true
	}
	done, errEvent, err := readStream(resp.Body, func() {
		if r.ttft == 0 {
			r.ttft = time.Since(r.start)
		}
	})
	if err != nil {
		return fail(err)
	}
	r.latency = time.Since(r.start)
	switch {
	case errEvent != "":
		r.outcome = OutcomeStreamCut
		r.detail = "error event: " + errEvent
	case !done:
		r.outcome = OutcomeStreamCut
		r.detail = "the stream ended without data: [DONE]"
	default:
		r.outcome = OutcomeOK
	}
	return r, true
}

// readStream reads an SSE answer: token calls back at each event that
// carries generated text; done is whether "data: [DONE]" came; errEvent
// is the first error event's data.
func readStream(body io.Reader, token func()) (done bool, errEvent string, err error) {
	rd := bufio.NewReaderSize(body, 64<<10)
	for {
		line, rerr := rd.ReadSlice('\n')
		if errors.Is(rerr, bufio.ErrBufferFull) {
			// A line longer than the buffer: not ours to parse; skip it.
			for errors.Is(rerr, bufio.ErrBufferFull) {
				_, rerr = rd.ReadSlice('\n')
			}
			continue
		}
		if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			switch ev := parseEvent(data); {
			case ev.done:
				done = true
			case ev.err != "" && errEvent == "":
				errEvent = ev.err
			case ev.text:
				token()
			}
		}
		if rerr == io.EOF {
			return done, errEvent, nil
		}
		if rerr != nil {
			return done, errEvent, rerr
		}
	}
}

type event struct {
	done bool
	err  string // an error event's message
	text bool   // carries generated text
}

// parseEvent reads one SSE data payload of an OpenAI stream.
func parseEvent(data []byte) event {
	if string(data) == "[DONE]" {
		return event{done: true}
	}
	var ev struct {
		Object  string          `json:"object"`
		Message string          `json:"message"`
		Error   json.RawMessage `json:"error"`
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return event{}
	}
	if len(ev.Error) > 0 && string(ev.Error) != "null" {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(ev.Error, &e) != nil || e.Message == "" {
			e.Message = string(ev.Error)
		}
		return event{err: e.Message}
	}
	if ev.Object == "error" {
		return event{err: cmpOr(ev.Message, "error")}
	}
	for _, c := range ev.Choices {
		if c.Text != "" || c.Delta.Content != "" {
			return event{text: true}
		}
	}
	return event{}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
