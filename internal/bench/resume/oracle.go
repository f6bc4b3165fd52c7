package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// oracle is what a client's answer is judged against: for greedy runs the
// request's uninterrupted answer; for sampled runs the consistency of the
// answer with its own ids, detokenized by a simulator that does not fail
// (base).
type oracle struct {
	answers map[request]string
	base    string
}

// consistent says what is wrong with a sampled answer that ended with
// [DONE] ("" when nothing is): its text must be its ids detokenized, at
// most max_tokens of them, usage.completion_tokens their count, and
// finish_reason "length" only at max_tokens.
func (o oracle) consistent(r record) string {
	switch {
	case len(r.ids) == 0 && r.text != "":
		return "text without ids"
	case len(r.ids) > maxTokens:
		return fmt.Sprintf("%d ids, more than max_tokens %d", len(r.ids), maxTokens)
	case r.usage != len(r.ids):
		return fmt.Sprintf("usage.completion_tokens %d for %d ids", r.usage, len(r.ids))
	case r.finish == "length" && len(r.ids) != maxTokens:
		return fmt.Sprintf("finish_reason length after %d of %d tokens", len(r.ids), maxTokens)
	}
	text, err := o.detokenize(r.ids)
	switch {
	case err != nil:
		return "detokenize: " + err.Error()
	case text == r.text:
		return ""
	case r.finish == "stop" && r.req.stops() != nil && stoppedAt(text, r.text, r.req.stops()):
		// vLLM ends the text before a stop string it found, while the ids
		// keep the tokens that spelled it.
		return ""
	}
	return fmt.Sprintf("text %q is not its ids detokenized %q", r.text, text)
}

// stoppedAt says whether text is full cut before one of stops.
func stoppedAt(full, text string, stops []string) bool {
	rest, ok := strings.CutPrefix(full, text)
	return ok && slices.ContainsFunc(stops, func(s string) bool { return strings.HasPrefix(rest, s) })
}

var detokClient = &http.Client{Timeout: 30 * time.Second}

// detokenize is vLLM's POST /detokenize on the oracle's simulator.
func (o oracle) detokenize(ids []int) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "tokens": ids})
	resp, err := detokClient.Post(o.base+"/detokenize", "application/json", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var d struct {
		Prompt string `json:"prompt"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return "", err
	}
	return d.Prompt, nil
}
