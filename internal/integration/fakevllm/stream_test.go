package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// What vLLM 0.32.0 does with --stream-interval, stop strings found inside
// a chunk, split characters and max_tokens, checked on the real server
// (docs/resume-facts.md); the fidelity test (internal/integration/realvllm)
// compares the two.

// sseChunk is one streamed chunk with generated ids.
type sseChunk struct {
	ids    []int
	text   string
	finish any
	reason any
}

// chunksOf reads a stream's chunks that carry a choice with token ids
// (the chat's role chunk has none), and the usage chunk's
// completion_tokens (-1 without one).
func chunksOf(t *testing.T, evs []map[string]any) (out []sseChunk, usage int) {
	t.Helper()
	usage = -1
	for _, ev := range evs {
		cs, _ := ev["choices"].([]any)
		if len(cs) == 0 {
			if u, ok := ev["usage"].(map[string]any); ok {
				usage = int(u["completion_tokens"].(float64))
			}
			continue
		}
		ch := cs[0].(map[string]any)
		raw, ok := ch["token_ids"].([]any)
		if !ok {
			continue
		}
		c := sseChunk{finish: ch["finish_reason"], reason: ch["stop_reason"]}
		for _, x := range raw {
			c.ids = append(c.ids, int(x.(float64)))
		}
		if s, ok := ch["text"].(string); ok {
			c.text = s
		} else if d, ok := ch["delta"].(map[string]any); ok {
			c.text, _ = d["content"].(string)
		}
		out = append(out, c)
	}
	return out, usage
}

// sizes is the ids per chunk.
func sizes(cs []sseChunk) []int {
	var out []int
	for _, c := range cs {
		out = append(out, len(c.ids))
	}
	return out
}

// wantSizes is vLLM's chunking of n ids at interval k: the first id
// alone, then k per chunk, the rest in the last.
func wantSizes(n, k int) []int {
	out := []int{1}
	for left := n - 1; left > 0; left -= k {
		out = append(out, min(k, left))
	}
	return out
}

func TestWantSizes(t *testing.T) {
	for _, c := range []struct {
		n, k int
		want []int
	}{{10, 2, []int{1, 2, 2, 2, 2, 1}}, {9, 2, []int{1, 2, 2, 2, 2}}, {10, 4, []int{1, 4, 4, 1}}, {1, 4, []int{1}}, {3, 1, []int{1, 1, 1}}} {
		if got := wantSizes(c.n, c.k); !slices.Equal(got, c.want) {
			t.Errorf("wantSizes(%d, %d) = %v, want %v", c.n, c.k, got, c.want)
		}
	}
}

// whole is a request answered without streaming: its ids and text.
func whole(t *testing.T, url string, body map[string]any) ([]int, string) {
	t.Helper()
	b := map[string]any{"return_token_ids": true}
	for k, v := range body {
		b[k] = v
	}
	b["stream"] = false
	delete(b, "stream_options")
	resp := postJSON(t, url, b)
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Text     string
			TokenIDs []int `json:"token_ids"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Choices) != 1 {
		t.Fatalf("POST %s: %d %v", url, resp.StatusCode, err)
	}
	return out.Choices[0].TokenIDs, out.Choices[0].Text
}

// The server's --stream-interval and the request's stream_interval: the
// first id in a chunk of its own, then N ids per chunk, the last chunk
// the rest with the finish; each chunk's text the text its ids completed,
// "" when they completed none (a character split over ids).
func TestStreamInterval(t *testing.T) {
	t.Parallel()
	p, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1", "FAKEVLLM_SPLIT_CHARS": "1"}),
		"org/model", "--served-model-name", "m", "--stream-interval", "2")
	if !p.has("'stream_interval': 2") {
		t.Error("non-default args do not list stream_interval")
	}
	greedy := func(extra map[string]any) map[string]any {
		b := map[string]any{"model": "m", "prompt": "Once upon a time", "temperature": 0, "return_token_ids": true}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	for _, c := range []struct {
		name     string
		extra    map[string]any
		n, every int
	}{
		{"the server's interval", map[string]any{"max_tokens": 10}, 10, 2},
		{"an odd count", map[string]any{"max_tokens": 9}, 9, 2},
		{"the request's interval when larger", map[string]any{"max_tokens": 10, "stream_interval": 4}, 10, 4},
		{"the request's interval as a string", map[string]any{"max_tokens": 10, "stream_interval": "4"}, 10, 4},
		{"never below the server's", map[string]any{"max_tokens": 6, "stream_interval": 1}, 6, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			evs, _, _, _ := streamIDs(t, url+"/v1/completions", greedy(c.extra))
			cs, _ := chunksOf(t, evs)
			if got, want := sizes(cs), wantSizes(c.n, c.every); !slices.Equal(got, want) {
				t.Errorf("ids per chunk %v, want %v", got, want)
			}
			ids, text := whole(t, url+"/v1/completions", greedy(c.extra))
			var gotIDs []int
			var gotText strings.Builder
			for _, ch := range cs {
				gotIDs = append(gotIDs, ch.ids...)
				gotText.WriteString(ch.text)
			}
			if !slices.Equal(gotIDs, ids) || gotText.String() != text {
				t.Errorf("the stream's ids %v and text %q, the answer's %v %q", gotIDs, gotText.String(), ids, text)
			}
			if last := cs[len(cs)-1]; last.finish != "length" {
				t.Errorf("last chunk finish %v", last.finish)
			}
		})
	}
	t.Run("chat: the role chunk, then the same chunks", func(t *testing.T) {
		evs, prompt, _, _ := streamIDs(t, url+"/v1/chat/completions", map[string]any{"model": "m", "temperature": 0, "return_token_ids": true,
			"max_tokens": 9, "messages": []any{map[string]any{"role": "user", "content": "Once upon a time"}}})
		cs, _ := chunksOf(t, evs)
		if len(prompt) == 0 || len(evs) != len(cs)+1 {
			t.Fatalf("%d events, %d with ids; want a role chunk with the prompt's ids first", len(evs), len(cs))
		}
		if got := sizes(cs); !slices.Equal(got, wantSizes(9, 2)) {
			t.Errorf("ids per chunk %v, want %v", got, wantSizes(9, 2))
		}
	})
	t.Run("a chunk's text is the text its ids completed", func(t *testing.T) {
		// At every chunk boundary the text so far is the answer of a
		// request stopped there. Prompts until one gives a chunk with ids
		// and no text (greedy: the same prompts every run).
		empty := false
		for i := 0; i < 100 && !empty; i++ {
			body := greedy(map[string]any{"prompt": fmt.Sprintf("%02d split", i), "max_tokens": 16})
			evs, _, _, _ := streamIDs(t, url+"/v1/completions", body)
			cs, _ := chunksOf(t, evs)
			var so, at = "", 0
			for _, c := range cs {
				so += c.text
				at += len(c.ids)
				empty = empty || c.text == ""
				body["max_tokens"] = at
				if _, text := whole(t, url+"/v1/completions", body); text != so {
					t.Errorf("prompt %d after %d ids: the stream's text %q, the answer's %q", i, at, so, text)
				}
			}
		}
		if !empty {
			t.Error("no chunk with ids and no text in 100 streams of split characters")
		}
	})
	t.Run("stream_interval below 1 is refused", func(t *testing.T) {
		resp := postJSON(t, url+"/v1/completions", greedy(map[string]any{"max_tokens": 2, "stream": true, "stream_interval": 0}))
		defer resp.Body.Close()
		var e struct{ Error apiError }
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 400 || e.Error.Param == nil || *e.Error.Param != "body.stream_interval" {
			t.Errorf("%d %+v %v, want 400 naming body.stream_interval", resp.StatusCode, e, err)
		}
	})
}

// A stop string completed by an id inside a chunk ends the stream there:
// the last chunk carries the ids since the previous chunk up to that id
// (none after it), the text before the stop string (with it, given
// include_stop_str_in_output); a stop id ends it the same way, its text
// dropped unless include_stop_str_in_output, stop strings or not.
func TestStopInsideAChunk(t *testing.T) {
	t.Parallel()
	_, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1", "FAKEVLLM_SPLIT_CHARS": "1"}),
		"org/model", "--served-model-name", "m", "--stream-interval", "4")
	body := func(n int, extra map[string]any) map[string]any {
		b := map[string]any{"model": "m", "prompt": "Once upon a time", "temperature": 0, "return_token_ids": true, "max_tokens": n,
			"stream_options": map[string]any{"include_usage": true}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	all, _ := whole(t, url+"/v1/completions", body(16, nil))
	textAt := func(k int) string {
		_, text := whole(t, url+"/v1/completions", body(k, nil))
		return text
	}
	// Boundaries at interval 4: after 1, 5, 9, 13 ids. Find the first k
	// inside a chunk whose text ends with two characters seen nowhere
	// before: that suffix is a stop string completed by id k.
	k, stop := 0, ""
	for j := 2; j <= 16 && stop == ""; j++ {
		if (j-1)%4 == 0 {
			continue
		}
		text, prev := []rune(textAt(j)), textAt(j-1)
		if len(text) < 2 {
			continue
		}
		if s := string(text[len(text)-2:]); !strings.Contains(prev, s) {
			k, stop = j, s
		}
	}
	if stop == "" {
		t.Fatal("no stop string found inside a chunk")
	}
	check := func(t *testing.T, extra map[string]any, upTo int, wantText string, reason any) {
		t.Helper()
		evs, _, _, _ := streamIDs(t, url+"/v1/completions", body(16, extra))
		cs, usage := chunksOf(t, evs)
		var ids []int
		var text strings.Builder
		for _, c := range cs {
			ids = append(ids, c.ids...)
			text.WriteString(c.text)
		}
		last := cs[len(cs)-1]
		if !slices.Equal(ids, all[:upTo]) || !slices.Equal(sizes(cs), wantSizes(upTo, 4)) {
			t.Errorf("ids %v in chunks of %v; want the first %d of %v in chunks of %v", ids, sizes(cs), upTo, all, wantSizes(upTo, 4))
		}
		if text.String() != wantText || last.finish != "stop" || fmt.Sprint(last.reason) != fmt.Sprint(reason) || usage != upTo {
			t.Errorf("text %q finish %v stop_reason %v usage %d; want %q stop %v %d", text.String(), last.finish, last.reason, usage, wantText, reason, upTo)
		}
	}
	full := textAt(k)
	at := strings.Index(full, stop)
	t.Run("stop string", func(t *testing.T) {
		check(t, map[string]any{"stop": []string{stop}}, k, full[:at], stop)
	})
	t.Run("stop string kept", func(t *testing.T) {
		check(t, map[string]any{"stop": []string{stop}, "include_stop_str_in_output": true}, k, full[:at+len(stop)], stop)
	})
	// A stop id: the first id inside a chunk not seen before it.
	j := -1
	for i := 1; i < 16; i++ {
		if i%4 != 0 && !slices.Contains(all[:i], all[i]) {
			j = i
			break
		}
	}
	if j < 0 {
		t.Fatal("no stop id found inside a chunk")
	}
	t.Run("stop id", func(t *testing.T) {
		check(t, map[string]any{"stop_token_ids": []int{all[j]}}, j+1, textAt(j), all[j])
	})
	t.Run("stop id with a stop string that never comes", func(t *testing.T) {
		check(t, map[string]any{"stop_token_ids": []int{all[j]}, "stop": []string{"zzzz"}}, j+1, textAt(j), all[j])
	})
	t.Run("stop id kept", func(t *testing.T) {
		check(t, map[string]any{"stop_token_ids": []int{all[j]}, "include_stop_str_in_output": true}, j+1, textAt(j+1), all[j])
	})
}

// max_tokens as vLLM 0.32.0 decides it: completions' null or absent is
// 16, chat's is what max_model_len leaves after the prompt; a request
// asking more than the prompt leaves is cut short, not refused.
func TestMaxTokens032(t *testing.T) {
	t.Parallel()
	_, url := startReady(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1", "FAKEVLLM_TOKEN_INTERVAL": "0s"}),
		"org/model", "--served-model-name", "m", "--max-model-len", "64")
	msgs := []any{map[string]any{"role": "user", "content": "hello"}} // 4 prompt ids
	ids := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 1500 + i
		}
		return out
	}
	for _, c := range []struct {
		name, path string
		body       string
		want       int // completion tokens; < 0: refused with param
		param      string
	}{
		{"completions null", "/v1/completions", `{"prompt":"x","max_tokens":null}`, 16, ""},
		{"completions absent", "/v1/completions", `{"prompt":"x"}`, 16, ""},
		{"completions ignores max_completion_tokens", "/v1/completions", `{"prompt":"x","max_completion_tokens":3}`, 16, ""},
		{"completions as a string", "/v1/completions", `{"prompt":"x","max_tokens":"5"}`, 5, ""},
		{"completions as 5.0", "/v1/completions", `{"prompt":"x","max_tokens":5.0}`, 5, ""},
		{"completions 5.5", "/v1/completions", `{"prompt":"x","max_tokens":5.5}`, -1, "body.max_tokens"},
		{"a stream_interval that is no number", "/v1/completions", `{"prompt":"x","stream_interval":"often"}`, -1, "body.stream_interval"},
		{"chat null", "/v1/chat/completions", `{"messages":` + mustJSON(msgs) + `,"max_tokens":null}`, 64 - 4, ""},
		{"chat absent", "/v1/chat/completions", `{"messages":` + mustJSON(msgs) + `}`, 64 - 4, ""},
		{"chat: max_completion_tokens wins", "/v1/chat/completions", `{"messages":` + mustJSON(msgs) + `,"max_tokens":3,"max_completion_tokens":5}`, 5, ""},
		{"completions: the prompt leaves 4", "/v1/completions", `{"prompt":` + mustJSON(ids(60)) + `,"max_tokens":null}`, 4, ""},
		{"completions: more than the prompt leaves", "/v1/completions", `{"prompt":` + mustJSON(ids(60)) + `,"max_tokens":50}`, 4, ""},
		{"completions: the prompt leaves 1", "/v1/completions", `{"prompt":` + mustJSON(ids(63)) + `}`, 1, ""},
		{"completions: the prompt leaves none", "/v1/completions", `{"prompt":` + mustJSON(ids(64)) + `}`, -1, "max_tokens"},
		{"completions: the prompt too long", "/v1/completions", `{"prompt":` + mustJSON(ids(65)) + `,"max_tokens":1}`, -1, "input_tokens"},
		{"completions: max_tokens over max_model_len", "/v1/completions", `{"prompt":"x","max_tokens":65}`, -1, "max_tokens"},
		{"chat: max_completion_tokens over max_model_len", "/v1/chat/completions", `{"messages":` + mustJSON(msgs) + `,"max_completion_tokens":65}`, -1, "max_completion_tokens"},
		{"max_tokens 0", "/v1/completions", `{"prompt":"x","max_tokens":0}`, -1, "max_tokens"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out := do(t, "POST", url+c.path, c.body, nil)
			var a struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
				}
				Usage struct {
					Completion int `json:"completion_tokens"`
				}
				Error struct{ Param *string }
			}
			_ = json.Unmarshal([]byte(out), &a)
			if c.want < 0 {
				if code != 400 || c.param != "" && (a.Error.Param == nil || *a.Error.Param != c.param) {
					t.Errorf("%d %s; want 400 naming %q", code, out, c.param)
				}
				return
			}
			if code != 200 || a.Usage.Completion != c.want || len(a.Choices) != 1 || a.Choices[0].FinishReason != "length" {
				t.Errorf("%d %s; want %d tokens, finish length", code, out, c.want)
			}
		})
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// --stream-interval below 1 fails at startup as vLLM's SchedulerConfig
// does: pydantic's ValidationError, exit 1.
func TestStreamIntervalZeroFailsStartup(t *testing.T) {
	t.Parallel()
	p := startSim(t, merge(fast, map[string]string{"FAKEVLLM_ERA": "v1"}), "org/model", "--stream-interval", "0")
	if st := p.waitExit(20 * time.Second); st.ExitCode() != 1 {
		t.Fatalf("exit %d, want 1", st.ExitCode())
	}
	p.waitOutputEnd(10 * time.Second)
	if !p.has("pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig") || !p.has("Input should be greater than or equal to 1") {
		t.Errorf("no ValidationError for stream_interval:\n%s", p.dump())
	}
}
