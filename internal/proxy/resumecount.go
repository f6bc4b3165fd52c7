// What the proxy counts of streams it resumes or not, and what it asks
// vLLM for a continuation without max_tokens.

package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// resumeReasons are the reasons a stream is not resumed, counted in
// proxy_resume_failed_total with the hold's own.
var resumeReasons = []string{nrN, nrBeamSearch, nrStructured, nrTools, nrEcho, nrLogprobs, nrSuffix, nrPrompts,
	nrMultimodal, nrEmbeds, nrNoReplay, nrBadBody, nrNoTokenIDs, nrReasoning, nrUnknownChunk, nrLimit, nrHoldFailed, nrContinuationKO,
	nrStopTokenText, nrFieldType, nrUsageStats, nrSplitChar, nrDiverged, nrModelLen}

// streamResumed and streamNotResumed count a stream as the hold counts
// every other request (the metrics and the status's resumed count).
func (p *Proxy) streamResumed(st *reqState, how string) {
	p.noteResumed(how)
	st.resumedHow(how)
}

func (p *Proxy) streamNotResumed(reason string) { p.noteResumeFailed(reason) }

// notResumedKey marks a stream the proxy passes through as before, with
// why it would not be resumed: counted if vLLM cuts it (sseBody).
type notResumedKey struct{}

// maxModelLen is vLLM's max_model_len for model (its /v1/models says it),
// asked with the client's Authorization: vLLM took it for the stream, and
// with --api-key /v1/models asks for it too.
func (p *Proxy) maxModelLen(ctx context.Context, model json.RawMessage, auth string) (int, error) {
	u, err := p.targetURL()
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.Scheme+"://"+u.Host+"/v1/models", nil)
	if err != nil {
		return 0, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := p.tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("vLLM's /v1/models answered HTTP %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, peekLimit)).Decode(&list); err != nil {
		return 0, fmt.Errorf("vLLM's /v1/models: %w", err)
	}
	var name string
	_ = json.Unmarshal(model, &name)
	best := 0
	for _, m := range list.Data {
		if m.ID == name || (best == 0 && m.MaxModelLen > 0) {
			best = m.MaxModelLen
		}
	}
	if best <= 0 {
		return 0, errors.New("vLLM's /v1/models gave no max_model_len")
	}
	return best, nil
}

// detokenize is vLLM's text of ids (its /detokenize), asked with the
// client's Authorization.
func (p *Proxy) detokenize(ctx context.Context, model json.RawMessage, ids []int, auth string) (string, error) {
	u, err := p.targetURL()
	if err != nil {
		return "", err
	}
	body, _ := json.Marshal(map[string]any{"model": model, "tokens": ids})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.Scheme+"://"+u.Host+"/detokenize", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := p.tr.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("vLLM's /detokenize answered HTTP %d", resp.StatusCode)
	}
	var out struct {
		Prompt *string `json:"prompt"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, peekLimit)).Decode(&out); err != nil || out.Prompt == nil {
		return "", fmt.Errorf("vLLM's /detokenize: no text (%v)", err)
	}
	return *out.Prompt, nil
}
