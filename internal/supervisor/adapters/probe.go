package adapters

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/ownconns"
	"github.com/vllm-guard/vllm-guard/internal/supervisor/heart"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// probeSpec is what a prober must know of the vLLM it asks.
type ProbeSpec struct {
	Names []string // the served names; /v1/models must list one of them
	Key   string   // an API key vLLM accepts ("" when it needs none)
	// taskHint is --convert, --task or --runner from the command line ("" when not given).
	TaskHint string
	// tasks returns vLLM's "Supported tasks: [...]" as its log printed them
	// in this run (nil before the line).
	Tasks func() []string
	Conns *ownconns.Set // records the prober's connections (nil: not recorded)
	// tree is vLLM's process tree in this run: a connection is kept only
	// when the listener it reaches is held by one of these processes, and
	// only then does the key go (nil: nothing is checked and no key is
	// sent).
	Tree func() []int
}

// prober asks vLLM whether it is ready or still alive, over plain HTTP.
type Prober struct {
	Client *http.Client
	Base   string
	Spec   ProbeSpec
	// pooling is learned from a 404 on /v1/completions when neither the log
	// nor the command line said the task.
	Pooling bool
}

func NewProber(ep launch.Endpoint, spec ProbeSpec) *Prober {
	d := &net.Dialer{Timeout: 2 * time.Second}
	dial := d.DialContext
	if spec.Conns != nil {
		dial = spec.Conns.Dial(d)
	}
	if spec.Tree != nil {
		dial = VLLMOnly(dial, spec.Tree)
	} else {
		spec.Key = "" // a listener nobody checked gets no key
	}
	tr := &http.Transport{
		DialContext:         dial,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &Prober{Client: &http.Client{Transport: tr}, Base: ep.URL(), Spec: spec}
}

func (p *Prober) Close() { p.Client.CloseIdleConnections() }

type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// vllmOnly wraps dial so that a connection is kept only when it reaches
// vLLM's own process tree (servedByTree): the API key, and every answer
// the guard believes, come from vLLM alone (issue 41: a listener of user
// nobody on the port while vLLM loaded got the key). A refused connect
// (vLLM loading) reads nothing; a made one is judged before a byte is
// sent on it.
func VLLMOnly(dial DialFunc, tree func() []int) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		local, _ := c.LocalAddr().(*net.TCPAddr)
		remote, _ := c.RemoteAddr().(*net.TCPAddr)
		if local == nil || remote == nil {
			c.Close()
			return nil, &NotVLLMs{"not a TCP connection: " + addr}
		}
		if err := ServedByTree(local, remote, tree()); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// probeResult is one probe's answer.
// refusal: vLLM's server answered with a 4xx that waiting does not heal
// (not a timeout or a rate limit): the probe does not fit this vLLM.

type ProbeResult = heart.ProbeResult

// ready runs the readiness chain up to level: health → models → the
// deepest request ("completion", or for "auto" the request the model
// serves), each bounded by timeout.
func (p *Prober) Ready(ctx context.Context, level string, timeout time.Duration) ProbeResult {
	r := p.Health(ctx, timeout)
	if !r.OK || level == "health" {
		r.Probe = "health: GET /health"
		return r
	}
	model, r := p.Models(ctx, timeout)
	if !r.OK || level == "models" {
		r.Probe = "models: GET /v1/models lists " + fmt.Sprintf("%q", model)
		return r
	}
	if level == "completion" {
		r = p.Completion(ctx, model, timeout)
		r.Probe = "completion: POST /v1/completions"
		return r
	}
	return p.Auto(ctx, model, timeout)
}

// auto is the deepest real request the model serves: a 1-token completion
// for a generating model, a 1-input request to the pooling endpoint of its
// task for a pooling model. The task comes from vLLM's Supported tasks
// line, else --convert/--task/--runner, else a 404 on /v1/completions.
func (p *Prober) Auto(ctx context.Context, model string, timeout time.Duration) ProbeResult {
	task, from := p.Task()
	if task == "" || task == "generate" {
		r := p.Completion(ctx, model, timeout)
		if r.Status != http.StatusNotFound || task == "generate" {
			r.Probe = "auto: POST /v1/completions (" + CmpOr(from, "generating model assumed") + ")"
			return r
		}
		// No completions: a pooling model whose task nothing said.
		p.Pooling = true
		task, from = "pooling", "/v1/completions answered 404"
	}
	step, path, body := PoolingRequest(task, model)
	r, _ := p.Do(ctx, step, http.MethodPost, path, body, timeout)
	r.Probe = fmt.Sprintf("auto: POST %s (task %s, %s)", path, task, from)
	return r
}

// taskOrder: when vLLM serves several tasks, the probe asks the first of
// these it serves (a generating model first, then each pooling task by the
// endpoint that serves it most simply).
var TaskOrder = []string{"generate", "embed", "classify", "score", "token_embed", "token_classify", "reward", "encode", "plugin"}

// task is the model's task and where it was learned.
func (p *Prober) Task() (task, from string) {
	if p.Spec.Tasks != nil {
		if ts := p.Spec.Tasks(); len(ts) > 0 {
			for _, t := range TaskOrder {
				if slices.Contains(ts, t) {
					return t, "vLLM's Supported tasks line"
				}
			}
			return ts[0], "vLLM's Supported tasks line"
		}
	}
	switch h := p.Spec.TaskHint; {
	case h == "embedding":
		return "embed", "--task"
	case h == "generate" || vllmargs.Pooling(h):
		return h, "--task/--runner/--convert"
	}
	if p.Pooling {
		return "pooling", "/v1/completions answered 404"
	}
	return "", ""
}

// poolingRequest is the 1-input request to the task's own endpoint: vLLM
// registers a pooling route only for a task it serves.
func PoolingRequest(task, model string) (step, path string, body []byte) {
	req := map[string]any{"model": model, "input": "ping"}
	switch task {
	case "embed":
		step, path = "embeddings", "/v1/embeddings"
	case "classify":
		step, path = "classify", "/classify"
	case "score":
		step, path = "score", "/score"
		req = map[string]any{"model": model, "text_1": "ping", "text_2": "pong"}
	default: // token_embed, token_classify, plugin, reward, encode, the pooling runner, or one not known
		step, path = "pooling", "/pooling"
	}
	body, _ = json.Marshal(req)
	return step, path, body
}

func (p *Prober) Health(ctx context.Context, timeout time.Duration) ProbeResult {
	r, _ := p.Do(ctx, "health", http.MethodGet, "/health", nil, timeout)
	return r
}

// paused asks GET /is_paused, which vLLM serves (in dev mode,
// VLLM_SERVER_DEV_MODE=1) as {"is_paused": true|false}: an operator's
// POST /pause stops generation on purpose until /resume. Any other answer
// (404 without dev mode, an error, a timeout) is not paused.
func (p *Prober) Paused(ctx context.Context, timeout time.Duration) ProbeResult {
	r, body := p.Do(ctx, "paused", http.MethodGet, "/is_paused", nil, timeout)
	if r.OK {
		var st struct {
			IsPaused bool `json:"is_paused"`
		}
		r.Paused = json.Unmarshal(body, &st) == nil && st.IsPaused
	}
	return r
}

// models checks that /v1/models lists one of the served names and returns
// the first it lists.
func (p *Prober) Models(ctx context.Context, timeout time.Duration) (string, ProbeResult) {
	r, body := p.Do(ctx, "models", http.MethodGet, "/v1/models", nil, timeout)
	if !r.OK {
		return "", r
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return "", ProbeResult{Step: "models", Status: r.Status, Err: "/v1/models answered something that is not a model list: " + err.Error()}
	}
	ids := []string{}
	for _, m := range list.Data {
		if slices.Contains(p.Spec.Names, m.ID) {
			return m.ID, r
		}
		ids = append(ids, m.ID)
	}
	return "", ProbeResult{Step: "models", Status: r.Status, Explains: true,
		Err: fmt.Sprintf("/v1/models lists %q, not the served name %s: set --served-model-name in the vLLM command or [vllm] served_model_name to one it lists",
			ids, QuoteAll(p.Spec.Names))}
}

func QuoteAll(names []string) string {
	if len(names) == 0 {
		return "(none: the command names no model)"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, " or ")
}

func (p *Prober) Completion(ctx context.Context, model string, timeout time.Duration) ProbeResult {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0})
	r, _ := p.Do(ctx, "completion", http.MethodPost, "/v1/completions", body, timeout)
	return r
}

func (p *Prober) Do(ctx context.Context, step, method, path string, body []byte, timeout time.Duration) (ProbeResult, []byte) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.Base+path, rd)
	if err != nil {
		return ProbeResult{Step: step, Err: err.Error()}, nil
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if p.Spec.Key != "" {
		req.Header.Set("Authorization", "Bearer "+p.Spec.Key)
	}
	resp, err := p.Client.Do(req)
	if err != nil {
		if nv := (*NotVLLMs)(nil); errors.As(err, &nv) {
			return ProbeResult{Step: step, Err: fmt.Sprintf("%s %s not sent: %s; the guard sends nothing (no API key) until vLLM's own process listens there",
				method, path, nv.Why)}, nil
		}
		return ProbeResult{Step: step, Err: err.Error(), Refused: IsRefused(err)}, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return ProbeResult{Step: step, Status: resp.StatusCode, Err: "reading the answer: " + err.Error()}, nil
	}
	own := p.Spec.Tree != nil
	switch resp.StatusCode {
	case http.StatusOK:
		return ProbeResult{OK: true, Step: step, Status: resp.StatusCode, Own: own}, b
	case http.StatusUnauthorized, http.StatusForbidden:
		return ProbeResult{Step: step, Status: resp.StatusCode, Explains: true, Err: AuthReason(resp.StatusCode, p.Spec.Key != ""), Own: own}, b
	}
	return ProbeResult{Step: step, Status: resp.StatusCode, Err: fmt.Sprintf("%s %s answered %d", method, path, resp.StatusCode), Own: own}, b
}

// authReason says why vLLM refused the guard's request, and what to do.
func AuthReason(status int, sent bool) string {
	what := "the guard has no valid API key"
	if sent {
		what = "the guard has no valid API key (vLLM refused the key it sent)"
	}
	return fmt.Sprintf("vLLM answers %d: %s; give vLLM its key with --api-key in [vllm] command or the extra arguments, or VLLM_API_KEY in [vllm] env", status, what)
}

func CmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func IsRefused(err error) bool {
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
