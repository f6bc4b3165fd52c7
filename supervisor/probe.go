package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// prober asks vLLM whether it is ready or still alive, over plain HTTP.
type prober struct {
	client *http.Client
	base   string
	model  string
	apiKey string // sent as a bearer token when vLLM requires one
}

func newProber(ep Endpoint, model string) *prober {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &prober{
		client: &http.Client{Transport: tr},
		base:   ep.URL(),
		model:  model,
	}
}

func (p *prober) close() { p.client.CloseIdleConnections() }

// probeResult is one probe's answer.
type probeResult struct {
	ok      bool
	status  int    // HTTP status; 0 when no answer
	step    string // health | models | completion
	err     string // why not ok
	refused bool   // connection refused: vLLM is still loading (or gone)
}

// ready runs the readiness chain up to level: health → models → a
// 1-token completion, each bounded by timeout.
func (p *prober) ready(ctx context.Context, level string, timeout time.Duration) probeResult {
	if r := p.health(ctx, timeout); !r.ok || level == "health" {
		return r
	}
	if r := p.models(ctx, timeout); !r.ok || level == "models" {
		return r
	}
	return p.completion(ctx, timeout)
}

func (p *prober) health(ctx context.Context, timeout time.Duration) probeResult {
	r, _ := p.do(ctx, "health", http.MethodGet, "/health", nil, timeout)
	return r
}

func (p *prober) models(ctx context.Context, timeout time.Duration) probeResult {
	r, body := p.do(ctx, "models", http.MethodGet, "/v1/models", nil, timeout)
	if !r.ok {
		return r
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return probeResult{step: "models", status: r.status, err: "/v1/models answered something that is not a model list: " + err.Error()}
	}
	var ids []string
	for _, m := range list.Data {
		if m.ID == p.model {
			return r
		}
		ids = append(ids, m.ID)
	}
	return probeResult{step: "models", status: r.status, err: fmt.Sprintf("/v1/models does not list %q (it lists %q): set [vllm] served_model_name", p.model, ids)}
}

func (p *prober) completion(ctx context.Context, timeout time.Duration) probeResult {
	body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": "ping", "max_tokens": 1, "temperature": 0})
	r, _ := p.do(ctx, "completion", http.MethodPost, "/v1/completions", body, timeout)
	return r
}

func (p *prober) do(ctx context.Context, step, method, path string, body []byte, timeout time.Duration) (probeResult, []byte) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.base+path, rd)
	if err != nil {
		return probeResult{step: step, err: err.Error()}, nil
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return probeResult{step: step, err: err.Error(), refused: isRefused(err)}, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return probeResult{step: step, status: resp.StatusCode, err: "reading the answer: " + err.Error()}, nil
	}
	if resp.StatusCode != http.StatusOK {
		return probeResult{step: step, status: resp.StatusCode, err: fmt.Sprintf("%s %s answered %d", method, path, resp.StatusCode)}, b
	}
	return probeResult{ok: true, step: step, status: resp.StatusCode}, b
}

func isRefused(err error) bool {
	var op *net.OpError
	for e := err; e != nil; {
		if o, ok := e.(*net.OpError); ok {
			op = o
			break
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return op != nil && op.Op == "dial"
}

// APIKey is a key vLLM accepts, from where vLLM takes it: the last
// --api-key in its argv (the first of its values), else VLLM_API_KEY in
// its environment. "" when vLLM requires none.
func APIKey(argv, env []string) string {
	key := ""
	for i, a := range argv {
		if v, ok := strings.CutPrefix(a, "--api-key="); ok {
			key = v
		} else if (a == "--api-key" || a == "--api_key") && i+1 < len(argv) && !strings.HasPrefix(argv[i+1], "--") {
			key = argv[i+1]
		}
	}
	if key != "" {
		return key
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "VLLM_API_KEY="); ok {
			key = v
		}
	}
	return key
}
