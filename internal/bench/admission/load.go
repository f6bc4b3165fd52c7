package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// outcome is how one request ended, as its client saw it.
type outcome int

const (
	completed outcome = iota // 200, every token, then data: [DONE]
	cut                      // 200, but the stream ended without [DONE] or with an error event
	refused                  // 429, 503 or 413: the front said no
	failed                   // no answer (connection refused or reset) or another status
	aborted                  // ended by the benchmark at the end of a run: not counted
)

// record is one request.
type record struct {
	start, first, end time.Time // first: its first token (zero if none came)
	outcome           outcome
	retryAfter        string // the Retry-After of a refusal
	why               string // a failure: "status N" or "no answer"
	tokens            int
}

// load is a group of clients, each streaming completion after completion
// until the group stops.
type load struct {
	url    string
	body   []byte
	client *http.Client

	mu       sync.Mutex
	recs     []record
	stopping bool // set with stopNew closed, under mu: no client is added after

	stopNew chan struct{} // closed: no client starts another request
	abort   context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// requestBody is a streaming completion of prompt tokens (the simulator,
// like the proxy, counts a token per 4 characters) and maxTokens tokens.
func requestBody(model string, prompt, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": strings.Repeat("abcd", prompt), "max_tokens": maxTokens, "stream": true})
	return b
}

func newLoad(url string, body []byte, clients int) *load {
	ctx, cancel := context.WithCancel(context.Background())
	return &load{url: url, body: body, stopNew: make(chan struct{}), abort: ctx, cancel: cancel,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true}}}
}

// start starts n clients, the i-th spread × i / n after the first (0: all
// at once). It returns once the last one started, or when the load stops.
func (l *load) start(n int, spread time.Duration) {
	began := time.Now()
	for i := range n {
		if spread > 0 && i > 0 {
			select {
			case <-time.After(time.Until(began.Add(spread * time.Duration(i) / time.Duration(n)))):
			case <-l.stopNew:
				return
			}
		}
		l.mu.Lock()
		if l.stopping {
			l.mu.Unlock()
			return
		}
		l.wg.Add(1) // before stop's Wait: both under mu
		l.mu.Unlock()
		go l.run()
	}
}

// stop lets the requests in flight finish within drain, then aborts the
// rest and waits for every client to end.
func (l *load) stop(drain time.Duration) {
	l.mu.Lock()
	if !l.stopping {
		l.stopping = true
		close(l.stopNew)
	}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		l.cancel()
		<-done
	}
	l.cancel()
	l.client.CloseIdleConnections()
}

// run is one client: request after request; after a refusal it waits what
// Retry-After says (at most 5 s; 100 ms without one), after a failure or
// a cut stream 100 ms.
func (l *load) run() {
	defer l.wg.Done()
	for {
		select {
		case <-l.stopNew:
			return
		default:
		}
		r := l.one()
		if r.outcome == aborted {
			return
		}
		l.mu.Lock()
		l.recs = append(l.recs, r)
		l.mu.Unlock()
		var wait time.Duration
		switch r.outcome {
		case refused:
			wait = 100 * time.Millisecond
			if s, err := strconv.Atoi(r.retryAfter); err == nil && s >= 0 {
				wait = min(time.Duration(s)*time.Second, 5*time.Second)
			}
		case cut, failed:
			wait = 100 * time.Millisecond
		}
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-l.stopNew:
				return
			}
		}
	}
}

// one sends a request and classifies how it ended.
func (l *load) one() record {
	r := record{start: time.Now()}
	req, _ := http.NewRequestWithContext(l.abort, http.MethodPost, l.url+"/v1/completions", bytes.NewReader(l.body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		r.end, r.outcome, r.why = time.Now(), failed, "no answer"
		if l.abort.Err() != nil {
			r.outcome = aborted
		}
		return r
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusRequestEntityTooLarge:
		r.end, r.outcome, r.retryAfter = time.Now(), refused, resp.Header.Get("Retry-After")
		return r
	default:
		r.end, r.outcome, r.why = time.Now(), failed, fmt.Sprintf("status %d", resp.StatusCode)
		return r
	}
	done, errored := false, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		kind := sseLine(sc.Text())
		switch kind {
		case sseToken:
			if r.tokens == 0 {
				r.first = time.Now()
			}
			r.tokens++
		case sseError:
			errored = true
		case sseDone:
			done = true
		}
	}
	r.end = time.Now()
	switch {
	case l.abort.Err() != nil && !done:
		r.outcome = aborted
	case done && !errored:
		r.outcome = completed
	default:
		r.outcome = cut
	}
	return r
}

type sseKind int

const (
	sseOther sseKind = iota
	sseToken
	sseError
	sseDone
)

// sseLine classifies one line of a completion stream: a token chunk, an
// error event (vLLM's {"object":"error",…} or the guard's {"error":{…}}),
// the final [DONE], or anything else (blank lines, comments).
func sseLine(line string) sseKind {
	data, ok := strings.CutPrefix(line, "data:")
	if !ok {
		return sseOther
	}
	data = strings.TrimSpace(data)
	if data == "[DONE]" {
		return sseDone
	}
	var ev struct {
		Object  string          `json:"object"`
		Error   json.RawMessage `json:"error"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if json.Unmarshal([]byte(data), &ev) != nil {
		return sseOther
	}
	switch {
	case ev.Object == "error" || len(ev.Error) > 0 && string(ev.Error) != "null":
		return sseError
	case len(ev.Choices) > 0:
		return sseToken
	}
	return sseOther
}

// records is a copy of what the clients recorded.
func (l *load) records() []record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recs)
}

// Counts are a run's requests by outcome and what the completed ones gave.
type Counts struct {
	Requests            int            `json:"requests"`
	Completed           int            `json:"completed"`
	StreamsCut          int            `json:"streams_cut"`
	Refused             int            `json:"refused"`
	RefusedNoRetryAfter int            `json:"refused_without_retry_after"`
	Failed              int            `json:"failed"`
	FailedBy            map[string]int `json:"failed_by,omitempty"` // "no answer", "status 502", …
	GoodputTokS         float64        `json:"goodput_tokens_per_s"`
	TTFTP50Ms           float64        `json:"ttft_p50_ms"`
	TTFTP99Ms           float64        `json:"ttft_p99_ms"`
}

// count sums the requests started in [from, to]. Goodput is the tokens of
// the requests completed by to, over to − from; time to first token is
// over every request that got one.
func count(recs []record, from, to time.Time) Counts {
	var c Counts
	var ttft []float64
	tokens := 0
	for _, r := range recs {
		if r.outcome == aborted || r.start.Before(from) || r.start.After(to) {
			continue
		}
		c.Requests++
		switch r.outcome {
		case completed:
			c.Completed++
			if !r.end.After(to) {
				tokens += r.tokens
			}
		case cut:
			c.StreamsCut++
		case refused:
			c.Refused++
			if r.retryAfter == "" {
				c.RefusedNoRetryAfter++
			}
		case failed:
			c.Failed++
			if c.FailedBy == nil {
				c.FailedBy = map[string]int{}
			}
			c.FailedBy[r.why]++
		}
		if !r.first.IsZero() {
			ttft = append(ttft, float64(r.first.Sub(r.start).Microseconds())/1000)
		}
	}
	if d := to.Sub(from).Seconds(); d > 0 {
		c.GoodputTokS = float64(tokens) / d
	}
	c.TTFTP50Ms, c.TTFTP99Ms = percentile(ttft, 0.50), percentile(ttft, 0.99)
	return c
}

// percentile is the nearest-rank q-quantile of xs (0 when empty).
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}
