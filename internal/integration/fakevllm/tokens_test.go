package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// streamIDs posts a streaming request and returns its events, the
// prompt's ids (where vLLM puts them: the choice of a completions chunk,
// the top level of a chat's first chunk) and the generated ids and text.
func streamIDs(t *testing.T, url string, body map[string]any) (evs []map[string]any, prompt, ids []int, text string) {
	t.Helper()
	body["stream"] = true
	resp := postJSON(t, url, body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d", url, resp.StatusCode)
	}
	evs, done := sseEvents(t, resp.Body)
	if !done {
		t.Fatalf("POST %s: no [DONE]", url)
	}
	asInts := func(v any) []int {
		var out []int
		for _, x := range v.([]any) {
			out = append(out, int(x.(float64)))
		}
		return out
	}
	for i, ev := range evs {
		if p, ok := ev["prompt_token_ids"]; ok && p != nil {
			prompt = asInts(p)
		}
		for _, c := range ev["choices"].([]any) {
			ch := c.(map[string]any)
			if p, ok := ch["prompt_token_ids"]; ok && p != nil {
				if i != 0 {
					t.Errorf("event %d carries the prompt's ids; vLLM sends them on the first chunk only", i)
				}
				prompt = asInts(p)
			}
			if v, ok := ch["token_ids"]; ok && v != nil {
				ids = append(ids, asInts(v)...)
			}
			if s, ok := ch["text"].(string); ok {
				text += s
			}
			if d, ok := ch["delta"].(map[string]any); ok {
				s, _ := d["content"].(string)
				text += s
			}
		}
	}
	return evs, prompt, ids, text
}

// A greedy stream continued from its prompt's ids plus the ids it
// delivered yields exactly the rest: for completions and for chat (the
// continuation a /v1/completions request), as on the real vLLM.
func TestGreedyContinuation(t *testing.T) {
	t.Parallel()
	_, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1"}), "org/model", "--served-model-name", "m")
	for _, c := range []struct {
		name, path string
		req        map[string]any
	}{
		{"completions", "/v1/completions", map[string]any{"prompt": "Once upon a time"}},
		{"chat", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Once upon a time"}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := map[string]any{"model": "m", "max_tokens": 64, "temperature": 0, "return_token_ids": true}
			for k, v := range c.req {
				body[k] = v
			}
			_, prompt, ids, text := streamIDs(t, url+c.path, body)
			if len(prompt) == 0 || len(ids) != 64 {
				t.Fatalf("prompt ids %v, %d generated ids; want the prompt's ids and 64", prompt, len(ids))
			}
			if distinct := len(slices.Compact(slices.Sorted(slices.Values(ids)))); distinct < 32 {
				t.Errorf("%d distinct ids in 64: the sequence should look like a model's, not a loop", distinct)
			}
			_, again, ids2, _ := streamIDs(t, url+c.path, body)
			if !slices.Equal(again, prompt) || !slices.Equal(ids2, ids) {
				t.Errorf("a second greedy run differs: %v %v", again, ids2)
			}
			cont := map[string]any{"model": "m", "prompt": append(slices.Clone(prompt), ids[:10]...), "max_tokens": 54, "temperature": 0, "return_token_ids": true}
			_, contPrompt, rest, restText := streamIDs(t, url+"/v1/completions", cont)
			if !slices.Equal(contPrompt, cont["prompt"].([]int)) {
				t.Errorf("the continuation's prompt_token_ids %v, want the ids sent", contPrompt)
			}
			if got := append(slices.Clone(ids[:10]), rest...); !slices.Equal(got, ids) {
				t.Errorf("first 10 + continuation:\n%v\nwant the uninterrupted run:\n%v", got, ids)
			}
			if !strings.HasSuffix(text, restText) || restText == "" {
				t.Errorf("the continuation's text %q does not end the uninterrupted text %q", restText, text)
			}
		})
	}
	t.Run("tokenize messages gives the chat's prompt ids", func(t *testing.T) {
		msgs := []any{map[string]any{"role": "user", "content": "Once upon a time"}}
		_, prompt, _, _ := streamIDs(t, url+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 1, "return_token_ids": true})
		resp := postJSON(t, url+"/tokenize", map[string]any{"model": "m", "messages": msgs})
		defer resp.Body.Close()
		var tok struct{ Tokens []int }
		if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil || !slices.Equal(tok.Tokens, prompt) {
			t.Errorf("/tokenize messages: %v (%v), want the chat's prompt_token_ids %v", tok.Tokens, err, prompt)
		}
	})
	t.Run("a seed repeats a sample, a continuation does not", func(t *testing.T) {
		body := map[string]any{"model": "m", "prompt": "Once upon a time", "max_tokens": 20, "seed": 7, "return_token_ids": true}
		_, prompt, a, _ := streamIDs(t, url+"/v1/completions", body)
		_, _, b, _ := streamIDs(t, url+"/v1/completions", body)
		if !slices.Equal(a, b) {
			t.Errorf("the same seed gave %v then %v", a, b)
		}
		cont := map[string]any{"model": "m", "prompt": append(slices.Clone(prompt), a[:5]...), "max_tokens": 15, "seed": 7, "return_token_ids": true}
		_, _, rest, _ := streamIDs(t, url+"/v1/completions", cont)
		if slices.Equal(rest, a[5:]) {
			t.Error("a sampled continuation reproduced the rest of the sample: vLLM's per-request generator restarts")
		}
	})
}

// The token-id fields where vLLM 0.32.0 puts them, and null when not asked
// for; token-id prompts; the refusals on the way.
func TestTokenIDShapes(t *testing.T) {
	t.Parallel()
	_, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1"}), "org/model", "--served-model-name", "m")
	post := func(path string, body map[string]any) (int, map[string]any) {
		t.Helper()
		resp := postJSON(t, url+path, body)
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	t.Run("completions stream without return_token_ids", func(t *testing.T) {
		evs, _, _, _ := streamIDs(t, url+"/v1/completions", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 2})
		for i, ev := range evs {
			ch := ev["choices"].([]any)[0].(map[string]any)
			for _, k := range []string{"prompt_token_ids", "token_ids", "stop_reason", "logprobs"} {
				if v, ok := ch[k]; !ok || v != nil {
					t.Errorf("event %d: %s = %v (present %v), want null", i, k, v, ok)
				}
			}
			_, fp := ev["system_fingerprint"]
			if last := i == len(evs)-1; fp != last {
				t.Errorf("event %d: system_fingerprint %v; vLLM puts it on the finishing chunk only", i, ev["system_fingerprint"])
			}
		}
	})
	t.Run("chat stream with usage", func(t *testing.T) {
		evs, prompt, ids, _ := streamIDs(t, url+"/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 3, "return_token_ids": true,
			"messages": []any{map[string]any{"role": "user", "content": "hello there"}}, "stream_options": map[string]any{"include_usage": true}})
		if len(evs) != 5 || len(prompt) == 0 || len(ids) != 3 {
			t.Fatalf("%d events, prompt %v, ids %v; want the role chunk, 3 tokens, the usage chunk", len(evs), prompt, ids)
		}
		role := evs[0]["choices"].([]any)[0].(map[string]any)
		if _, ok := role["token_ids"]; ok || evs[0]["prompt_text"] != nil {
			t.Errorf("role chunk %v: no token_ids in its choice, prompt_text null", evs[0])
		}
		final := evs[3]["choices"].([]any)[0].(map[string]any)
		if final["finish_reason"] != "length" || evs[3]["system_fingerprint"] != nil {
			t.Errorf("final chunk %v: finish length, the fingerprint on the usage chunk instead", evs[3])
		}
		u := evs[4]["usage"].(map[string]any)
		if len(evs[4]["choices"].([]any)) != 0 || u["prompt_tokens"] != float64(len(prompt)) || u["completion_tokens"] != 3.0 || evs[4]["system_fingerprint"] == nil {
			t.Errorf("usage chunk %v", evs[4])
		}
	})
	t.Run("non-streaming", func(t *testing.T) {
		code, out := post("/v1/completions", map[string]any{"model": "m", "prompt": []int{1500, 1501, 1502}, "max_tokens": 4, "temperature": 0, "return_token_ids": true})
		ch := out["choices"].([]any)[0].(map[string]any)
		if code != 200 || len(ch["token_ids"].([]any)) != 4 || len(ch["prompt_token_ids"].([]any)) != 3 || out["usage"].(map[string]any)["prompt_tokens"] != 3.0 {
			t.Errorf("completion of a token-id prompt: %d %v", code, out)
		}
		code, out = post("/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 2, "return_token_ids": true,
			"messages": []any{map[string]any{"role": "user", "content": "hello"}}})
		ch = out["choices"].([]any)[0].(map[string]any)
		if _, inChoice := ch["prompt_token_ids"]; code != 200 || len(ch["token_ids"].([]any)) != 2 || out["prompt_token_ids"] == nil || inChoice {
			t.Errorf("chat: %d %v; want token_ids in the choice, prompt_token_ids at the top", code, out)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for _, c := range []struct {
			path string
			body map[string]any
			want string
		}{
			{"/v1/completions", map[string]any{"model": "m", "prompt": []int{}}, "You must pass at least one prompt"},
			{"/v1/completions", map[string]any{"model": "m", "prompt": []int{99999}}, "Token id 99999 is out of vocabulary"},
			{"/v1/completions", map[string]any{"model": "m", "prompt": "x", "stream": true, "use_beam_search": true}, "Streaming is not currently supported with beam search"},
			{"/v1/completions", map[string]any{"model": "m", "prompt": "x", "stream_options": map[string]any{"include_usage": true}}, "Stream options can only be defined when `stream=True`."},
			{"/tokenize", map[string]any{"model": "m", "prompt": []int{1, 2}}, "prompt must be a string"},
		} {
			code, out := post(c.path, c.body)
			e, _ := out["error"].(map[string]any) // 0.32.0 nests the error
			if msg, _ := e["message"].(string); code != 400 || !strings.Contains(msg, c.want) {
				t.Errorf("%s %v: %d %v, want 400 %q", c.path, c.body, code, out, c.want)
			}
		}
	})
}

// Stop strings and stop ids as vLLM's detokenizer applies them: text held
// back while a stop string may be forming, ids never held back.
func TestStopRule(t *testing.T) {
	// 1000 " the", 1001 " quick", 1002 " brown", 1003 " fox".
	type step struct {
		id     int
		last   bool
		delta  string
		reason any
	}
	for _, c := range []struct {
		name  string
		req   completionRequest
		steps []step
	}{
		{"stop string held back, cut before it", completionRequest{Stop: json.RawMessage(`" brown"`)}, []step{
			{1000, false, "", nil}, {1001, false, " the ", nil}, {1002, false, "quick", " brown"}}},
		{"held text flushed at max_tokens", completionRequest{Stop: json.RawMessage(`["zzzzzz"]`)}, []step{
			{1000, false, "", nil}, {1001, false, " the ", nil}, {1002, true, "quick brown", nil}}},
		{"include_stop_str_in_output: no hold-back", completionRequest{Stop: json.RawMessage(`[" brown"]`), IncludeStopStrInOutput: true}, []step{
			{1000, false, " the", nil}, {1001, false, " quick", nil}, {1002, false, " brown", " brown"}}},
		{"a stop string inside a token", completionRequest{Stop: json.RawMessage(`["ui"]`)}, []step{
			{1000, false, " th", nil}, {1001, false, "e q", "ui"}}},
		{"stop id: its text dropped", completionRequest{StopTokenIDs: []laxInt{1002}}, []step{
			{1000, false, " the", nil}, {1001, false, " quick", nil}, {1002, false, "", 1002}}},
		{"stop id kept with include_stop_str_in_output", completionRequest{StopTokenIDs: []laxInt{1002}, IncludeStopStrInOutput: true}, []step{
			{1001, false, " quick", nil}, {1002, false, " brown", 1002}}},
		{"min_tokens defers the stop id", completionRequest{StopTokenIDs: []laxInt{1002}, MinTokens: 3}, []step{
			{1002, false, " brown", nil}, {1002, false, " brown", nil}, {1002, false, "", 1002}}},
		{"min_tokens defers the stop string", completionRequest{Stop: json.RawMessage(`"."`), MinTokens: 2}, []step{
			{1009, false, ".", nil}, {1003, false, " fox", nil}, {1009, false, "", "."}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := newStopRule(&c.req, newTextStream(nil, false))
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range c.steps {
				delta, reason, stopped := r.step(s.id, s.last)
				if delta != s.delta || reason != s.reason || stopped != (s.reason != nil) {
					t.Errorf("step %d (id %d): %q %v %v, want %q %v", i, s.id, delta, reason, stopped, s.delta, s.reason)
				}
			}
		})
	}
	if _, err := newStopRule(&completionRequest{Stop: json.RawMessage(`3`)}, newTextStream(nil, false)); err == nil {
		t.Error("stop 3 accepted")
	}
}

// Whatever the stop strings and ids, the text sent is the text kept, none
// is sent twice or lost, and without include_stop_str_in_output no stop
// string reaches the client (past min_tokens).
func FuzzStopRule(f *testing.F) {
	f.Add(" brown|.", []byte{0, 1, 2, 3}, false, uint8(0), false)
	f.Add("ui", []byte{1, 1, 9, 2}, true, uint8(2), false)
	f.Add("", []byte{5}, false, uint8(1), true)
	f.Add("\u00e9 t|\ufffd", []byte{0, 10, 0, 23}, false, uint8(0), true)
	f.Fuzz(func(t *testing.T, stops string, ids []byte, include bool, minTokens uint8, split bool) {
		list, _ := json.Marshal(strings.Split(stops, "|"))
		req := completionRequest{Stop: list, IncludeStopStrInOutput: include, MinTokens: laxInt(minTokens % 8), StopTokenIDs: []laxInt{firstWordID + 7}}
		r, err := newStopRule(&req, newTextStream(nil, split))
		if err != nil {
			t.Fatal(err)
		}
		var sent, all strings.Builder
		var stoppedBy any
		for i, b := range ids {
			id := firstWordID + int(b/10%2)*10 + int(b%10) // tens digit 0 or 1: the split characters
			all.WriteString(tokenBytes(id, false))
			delta, reason, stopped := r.step(id, i == len(ids)-1)
			if !utf8.ValidString(delta) {
				t.Fatalf("a character cut: %q", delta)
			}
			sent.WriteString(delta)
			if stopped {
				stoppedBy = reason
				break
			}
		}
		if sent.String() != r.outputText && (stoppedBy != nil || len(ids) > 0) {
			t.Fatalf("sent %q, kept %q", sent.String(), r.outputText)
		}
		if stoppedBy == nil && len(ids) > 0 && !split && sent.String() != all.String() {
			t.Fatalf("no stop, sent %q, generated %q", sent.String(), all.String())
		}
		// (Text from the first min_tokens ids is never searched, as in vLLM.)
		if s, ok := stoppedBy.(string); ok && !include && req.MinTokens == 0 && strings.Contains(sent.String(), s) {
			t.Fatalf("stop string %q sent: %q", s, sent.String())
		}
	})
}

// Split characters: an id that leaves a character incomplete gives no
// text; the id that completes it gives both ids' text; a prompt that ends
// inside a character makes the first text the whole prompt's, as vLLM
// 0.32.0 does.
func TestTextStream(t *testing.T) {
	// 1000: " the" + the first byte of "é"; 1010: its second byte + " the";
	// 1023: " fox".
	s := newTextStream(nil, true)
	for i, c := range []struct {
		id   int
		want string
	}{{1000, ""}, {1010, " the\u00e9 the"}, {1000, ""}, {1023, " the\ufffd fox"}, {1023, " fox"}} {
		if got := s.next(c.id); got != c.want {
			t.Errorf("step %d (id %d): %q, want %q", i, c.id, got, c.want)
		}
	}
	if got := newTextStream([]int{1023, 1000}, true).next(1010); got != " fox the\u00e9 the" {
		t.Errorf("after a prompt ending inside a character: %q, want the prompt's text first", got)
	}
	if got := newTextStream([]int{1023, 1000}, false).next(1010); got != " the" {
		t.Errorf("without split characters: %q", got)
	}
	if got := detokenize([]int{idUser, 1023, 1000}, true); got != " fox the\ufffd" {
		t.Errorf("detokenize %q", got)
	}
}

// With split characters the simulator shows what the real tiny model
// shows: a greedy continuation always gives the same ids, and the same
// text exactly when the cut follows a chunk that carried text.
func TestSplitCharsContinuation(t *testing.T) {
	t.Parallel()
	_, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1", "FAKEVLLM_SPLIT_CHARS": "1"}), "org/model", "--served-model-name", "m")
	body := func(prompt any, n int) map[string]any {
		return map[string]any{"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "return_token_ids": true}
	}
	evs, prompt, ids, text := streamIDs(t, url+"/v1/completions", body("Once upon a time", 40))
	chunkText := func(ev map[string]any) string { return ev["choices"].([]any)[0].(map[string]any)["text"].(string) }
	held, whole := 0, 0
	for k := 1; k < 40; k++ {
		var before strings.Builder
		for _, ev := range evs[:k] {
			before.WriteString(chunkText(ev))
		}
		_, _, rest, restText := streamIDs(t, url+"/v1/completions", body(append(slices.Clone(prompt), ids[:k]...), 40-k))
		if !slices.Equal(rest, ids[k:]) {
			t.Errorf("cut %d: the continuation's ids differ", k)
		}
		carried := chunkText(evs[k-1]) != ""
		if same := before.String()+restText == text; same != carried {
			t.Errorf("cut %d: text the same %v, the last chunk carried text %v", k, same, carried)
		}
		if carried {
			whole++
		} else {
			held++
		}
	}
	if held == 0 || whole == 0 {
		t.Errorf("%d cuts inside a character, %d outside: the run shows only one kind", held, whole)
	}
}

// The stop hold-back counts characters, as vLLM does, never cutting one.
func TestStopHoldBackCountsCharacters(t *testing.T) {
	r, err := newStopRule(&completionRequest{Stop: json.RawMessage(`"zzz"`)}, newTextStream(nil, true))
	if err != nil {
		t.Fatal(err)
	}
	var sent strings.Builder
	for i, id := range []int{1000, 1010, 1000, 1023} { // " theé the", " the\ufffd fox"
		delta, _, _ := r.step(id, i == 3)
		if !utf8.ValidString(delta) {
			t.Fatalf("step %d sent %q: a character cut", i, delta)
		}
		sent.WriteString(delta)
	}
	if sent.String() != " the\u00e9 the the\ufffd fox" {
		t.Errorf("sent %q", sent.String())
	}
}
