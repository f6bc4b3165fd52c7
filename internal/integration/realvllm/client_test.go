package realvllm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

// answer is one OpenAI-style response as a client sees it.
type answer struct {
	status int
	body   string
	finish string // choices[0].finish_reason
	tokens int    // usage.completion_tokens, or stream chunks with text
	errEv  bool   // a stream carried an error event
	err    error  // the connection failed
}

// post sends a JSON body to url with an optional bearer key.
func post(url, key string, body any) answer {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: string(raw)}
	var doc struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(raw, &doc) == nil {
		if len(doc.Choices) > 0 {
			a.finish = doc.Choices[0].FinishReason
		}
		a.tokens = doc.Usage.CompletionTokens
	}
	return a
}

func get(url, key string) answer {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(raw)}
}

// completion is a 1-request body for the tiny generative model: greedy,
// ignoring its end token, so it always generates maxTokens.
func completion(modelName string, maxTokens int, stream bool) map[string]any {
	return map[string]any{"model": modelName, "prompt": "the guard keeps vLLM serving", "max_tokens": maxTokens,
		"temperature": 0, "ignore_eos": true, "stream": stream}
}

// stream is one streaming completion as its client reads it.
type stream struct {
	first chan struct{} // closed at the first chunk with text
	done  chan answer   // the whole stream: finish reason, chunks, [DONE] seen
}

// startStream opens a streaming completion and reads it in the background.
func startStream(t *testing.T, url, key, modelName string, maxTokens int) *stream {
	t.Helper()
	st := &stream{first: make(chan struct{}), done: make(chan answer, 1)}
	go func() {
		b, _ := json.Marshal(completion(modelName, maxTokens, true))
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			st.done <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		a := answer{status: resp.StatusCode}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		firstClosed := false
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if line == "[DONE]" {
				a.body = "[DONE]"
				break
			}
			if strings.HasPrefix(line, `{"error"`) {
				a.errEv = true
				continue
			}
			var chunk struct {
				Choices []struct {
					Text         string  `json:"text"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(line), &chunk) != nil || len(chunk.Choices) == 0 {
				continue
			}
			if chunk.Choices[0].FinishReason != nil {
				a.finish = *chunk.Choices[0].FinishReason
			}
			a.tokens++
			if !firstClosed {
				firstClosed = true
				close(st.first)
			}
		}
		if err := sc.Err(); err != nil {
			a.err = err
		}
		st.done <- a
	}()
	return st
}

// metrics scrapes a /metrics page: each series' name (labels dropped) to its value.
func metrics(url string) (map[string]float64, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return vllmstats.Flat(resp.Body)
}
