package realvllm

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// What a stream carries when vLLM batches ids (--stream-interval and the
// request's stream_interval), when a stop string or stop id ends it inside
// a chunk, when a character is split over ids, and how many ids a request
// without max_tokens gets (docs/resume-facts.md). observeStreaming writes
// it down in words both sides can be compared by: rules the chunks follow
// and whether each answer agrees with another answer of the same server,
// never the ids themselves (the tiny model's and the simulator's differ).

// chunk is one streamed chunk that carries generated ids.
type chunk struct {
	ids    []int
	text   string
	finish any
	reason any
}

// chunks reads a stream's chunks with a token_ids list (the chat's role
// chunk has none) and the usage chunk's completion_tokens (-1: none).
func chunks(evs []map[string]any) (out []chunk, usage int) {
	usage = -1
	for _, ev := range evs {
		c := choice(ev)
		if c == nil {
			if u, ok := ev["usage"].(map[string]any); ok {
				n, _ := u["completion_tokens"].(float64)
				usage = int(n)
			}
			continue
		}
		ids, ok := ints(c["token_ids"])
		if !ok {
			continue
		}
		ch := chunk{ids: ids, finish: c["finish_reason"], reason: c["stop_reason"]}
		if s, ok := c["text"].(string); ok {
			ch.text = s
		} else if d, ok := c["delta"].(map[string]any); ok {
			ch.text, _ = d["content"].(string)
		}
		out = append(out, ch)
	}
	return out, usage
}

func sizesOf(cs []chunk) []int {
	var out []int
	for _, c := range cs {
		out = append(out, len(c.ids))
	}
	return out
}

func joined(cs []chunk) (ids []int, text string) {
	var b strings.Builder
	for _, c := range cs {
		ids = append(ids, c.ids...)
		b.WriteString(c.text)
	}
	return ids, b.String()
}

// idealSizes is vLLM's chunking of n ids at interval k
// (RequestState.make_request_output): the first id alone, then k per
// chunk, the rest with the finish.
func idealSizes(n, k int) []int {
	out := []int{1}
	for left := n - 1; left > 0; left -= k {
		out = append(out, min(k, left))
	}
	return out
}

// chunking says whether a stream's chunks end where vLLM's interval k
// lets them: after the first id, after 1+jk ids or at the last. A
// loaded server merges chunks (RequestOutputCollector), so the real
// server may end fewer; exact demands the ideal chunking (the simulator
// never merges).
func chunking(cs []chunk, n, k int, exact bool) string {
	sizes := sizesOf(cs)
	if exact && !slices.Equal(sizes, idealSizes(n, k)) {
		return fmt.Sprintf("ids per chunk %v, want %v", sizes, idealSizes(n, k))
	}
	at := 0
	for _, s := range sizes {
		at += s
		if at != 1 && at != n && (at-1)%k != 0 {
			return fmt.Sprintf("ids per chunk %v: a chunk ends after id %d", sizes, at)
		}
	}
	if at != n {
		return fmt.Sprintf("ids per chunk %v: %d ids, want %d", sizes, at, n)
	}
	return "as the interval says"
}

// observeStreaming asks a server started with --stream-interval 2 and
// --max-model-len 128 what the proxy's continuation depends on.
func observeStreaming(t *testing.T, s *server, name string, exact bool) map[string]string {
	obs := map[string]string{}
	const prompt = "Once upon a time"
	const mml = 128
	body := func(extra map[string]any) map[string]any {
		b := map[string]any{"model": name, "prompt": prompt, "temperature": 0, "ignore_eos": true, "return_token_ids": true}
		maps.Copy(b, extra)
		return b
	}
	stream := func(path string, b map[string]any) ([]chunk, int, []map[string]any) {
		evs, _ := sse(s.url(path), "", b)
		cs, usage := chunks(evs)
		if exact {
			t.Logf("%s %v: ids per chunk %v", s.name, b, sizesOf(cs))
		}
		return cs, usage, evs
	}
	// answer is the same request without streaming: its ids and text.
	answer := func(b map[string]any) ([]int, string) {
		b = maps.Clone(b)
		b["stream"] = false
		delete(b, "stream_options")
		a := post(s.url("/v1/completions"), "", b)
		var doc struct {
			Choices []struct {
				Text     string
				TokenIDs []int `json:"token_ids"`
			}
		}
		if json.Unmarshal([]byte(a.body), &doc) != nil || len(doc.Choices) != 1 {
			t.Errorf("%s: %d %s", s.name, a.status, a.body)
			return nil, ""
		}
		return doc.Choices[0].TokenIDs, doc.Choices[0].Text
	}
	texts := map[int]string{}
	textAt := func(n int) string {
		if t, ok := texts[n]; ok {
			return t
		}
		_, texts[n] = answer(body(map[string]any{"max_tokens": n}))
		return texts[n]
	}

	// Chunk shapes.
	for _, c := range []struct {
		what     string
		extra    map[string]any
		n, every int
	}{
		{"--stream-interval 2, 9 ids", map[string]any{"max_tokens": 9}, 9, 2},
		{"--stream-interval 2, stream_interval 4, 10 ids", map[string]any{"max_tokens": 10, "stream_interval": 4}, 10, 4},
		{"--stream-interval 2, stream_interval \"4\", 6 ids", map[string]any{"max_tokens": 6, "stream_interval": "4"}, 6, 4},
		{"--stream-interval 2, stream_interval 1, 6 ids", map[string]any{"max_tokens": 6, "stream_interval": 1}, 6, 2},
	} {
		cs, _, _ := stream("/v1/completions", body(c.extra))
		ids, text := joined(cs)
		wantIDs, wantText := answer(body(c.extra))
		last := "no chunk"
		if len(cs) > 0 {
			last = fmt.Sprint(cs[len(cs)-1].finish)
		}
		obs["completions, "+c.what+": chunks; ids and text those of the answer; finish"] = fmt.Sprint(chunking(cs, c.n, c.every, exact), "; ",
			slices.Equal(ids, wantIDs), " ", text == wantText, "; ", last)
	}
	msgs := []map[string]string{{"role": "user", "content": prompt}}
	cs, _, evs := stream("/v1/chat/completions", map[string]any{"model": name, "messages": msgs, "max_tokens": 9, "temperature": 0, "ignore_eos": true, "return_token_ids": true})
	obs["chat, --stream-interval 2, 9 ids: a role chunk without ids, then chunks"] = fmt.Sprint(len(evs) == len(cs)+1, " ", chunking(cs, 9, 2, exact))
	zero := post(s.url("/v1/completions"), "", body(map[string]any{"max_tokens": 2, "stream": true, "stream_interval": 0}))
	obs["stream_interval 0: status, param"] = fmt.Sprint(zero.status, " ", errParam(zero.body))

	// A character split over ids: a chunk's text is what its ids
	// completed, "" when they completed none. Prompts until a chunk with
	// ids and no text comes (greedy: the same prompts every run).
	boundaries, empty, tried := true, false, 0
	for ; tried < 40 && !empty; tried++ {
		b := body(map[string]any{"prompt": fmt.Sprintf("%02d %s", tried, prompt), "max_tokens": 16})
		cs, _, _ := stream("/v1/completions", b)
		so, at := "", 0
		for _, c := range cs {
			so += c.text
			at += len(c.ids)
			empty = empty || c.text == "" && len(c.ids) > 0
			if tried == 0 {
				// At each chunk's end the text so far is the answer of a
				// request stopped there.
				_, want := answer(body(map[string]any{"prompt": fmt.Sprintf("%02d %s", tried, prompt), "max_tokens": at}))
				boundaries = boundaries && so == want
			}
		}
	}
	t.Logf("%s: a chunk with ids and no text after %d prompts", s.name, tried)
	obs["split characters: text at each chunk's end that of the answer stopped there; a chunk with ids and no text"] = fmt.Sprint(boundaries, " ", empty)

	// Cuts at chunk boundaries: with several ids per chunk, a chunk with
	// text may end with an id that starts a character (its text held
	// back). A continuation from a prefix that ends inside a character
	// starts with the prompt's text (DecodeStream, see "Continuing from a
	// prefix"); /detokenize of the ids so far ends in U+FFFD exactly there.
	// Prompts until such a chunk comes.
	detok := func(ids []int) string {
		var d struct{ Prompt string }
		_ = json.Unmarshal([]byte(post(s.url("/detokenize"), "", map[string]any{"model": name, "tokens": ids}).body), &d)
		return d.Prompt
	}
	found := false
	var cut []chunk
	var cutPrompt string
	for tried = 0; tried < 40 && !found; tried++ {
		cutPrompt = fmt.Sprintf("%02d %s", tried, prompt)
		cut, _, _ = stream("/v1/completions", body(map[string]any{"prompt": cutPrompt, "max_tokens": 16}))
		var ids []int
		for _, c := range cut[:max(0, len(cut)-1)] {
			ids = append(ids, c.ids...)
			found = found || c.text != "" && strings.HasSuffix(detok(ids), "\ufffd")
		}
	}
	t.Logf("%s: a chunk with text ending inside a character after %d prompts", s.name, tried)
	if found {
		evs, _ := sse(s.url("/v1/completions"), "", body(map[string]any{"prompt": cutPrompt, "max_tokens": 1}))
		promptIDs := readIDs(evs, true).prompt
		promptText := detok(promptIDs)
		all, full := joined(cut)
		idsOK, rule, before, at := true, true, "", 0
		for _, c := range cut[:len(cut)-1] {
			at += len(c.ids)
			before += c.text
			rest, _, _ := stream("/v1/completions", body(map[string]any{"prompt": append(slices.Clone(promptIDs), all[:at]...), "max_tokens": 16 - at}))
			ids, text := joined(rest)
			idsOK = idsOK && slices.Equal(ids, all[at:])
			inside := strings.HasSuffix(detok(all[:at]), "\ufffd")
			if inside {
				rule = rule && (text == "" || strings.HasPrefix(text, promptText))
			} else {
				rule = rule && before+text == full
			}
		}
		obs["a cut after each chunk: ids continue; text continues exactly unless /detokenize of the ids so far ends in U+FFFD, then the prompt's text comes first"] = fmt.Sprint(idsOK, " ", rule)
	}
	obs["a chunk with text whose last id starts a character: seen"] = fmt.Sprint(found)

	// max_tokens absent or null.
	for _, c := range []struct {
		what string
		set  map[string]any
	}{
		{"completions, max_tokens null", map[string]any{"max_tokens": nil}},
		{"completions, max_tokens absent", nil},
		{"completions, max_tokens \"5\"", map[string]any{"max_tokens": "5"}},
	} {
		b := map[string]any{"model": name, "prompt": prompt, "temperature": 0, "ignore_eos": true}
		maps.Copy(b, c.set)
		a := post(s.url("/v1/completions"), "", b)
		obs[c.what+": status, completion tokens, finish"] = fmt.Sprint(a.status, " ", a.tokens, " ", a.finish)
	}
	chat := post(s.url("/v1/chat/completions"), "", map[string]any{"model": name, "messages": msgs, "max_tokens": nil, "temperature": 0, "ignore_eos": true})
	var usage struct {
		Usage struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
		}
	}
	_ = json.Unmarshal([]byte(chat.body), &usage)
	obs["chat, max_tokens null: status, completion tokens == max_model_len - prompt, finish"] = fmt.Sprint(chat.status, " ",
		usage.Usage.Completion == mml-usage.Usage.Prompt && usage.Usage.Prompt > 0, " ", chat.finish)
	ids := func(n int) []int { return slices.Repeat([]int{100}, n) }
	for _, c := range []struct {
		what   string
		prompt []int
		max    any
	}{
		{"a prompt of 120 ids, max_tokens null", ids(120), nil},
		{"a prompt of 120 ids, max_tokens 50", ids(120), 50},
		{"a prompt of 127 ids, max_tokens null", ids(127), nil},
		{"a prompt of 128 ids, max_tokens null", ids(128), nil},
		{"a prompt of 129 ids, max_tokens 1", ids(129), 1},
		{"max_tokens 200 (over max_model_len)", nil, 200},
		{"max_tokens 5.5", nil, 5.5},
	} {
		b := map[string]any{"model": name, "prompt": prompt, "temperature": 0, "ignore_eos": true, "max_tokens": c.max}
		if c.prompt != nil {
			b["prompt"] = c.prompt
		}
		a := post(s.url("/v1/completions"), "", b)
		if a.status == 200 {
			obs["completions, "+c.what] = fmt.Sprint(a.status, " ", a.tokens, " ", a.finish)
		} else {
			obs["completions, "+c.what] = fmt.Sprint(a.status, " ", errParam(a.body))
		}
	}

	// Stops inside a chunk (stream_interval 4: chunks end after ids 1, 5,
	// 9, 13). A stop string: the last two characters of the answer
	// stopped at id k, seen nowhere before it, for the first k inside a
	// chunk.
	all, _ := answer(body(map[string]any{"max_tokens": 16}))
	k, stop := 0, ""
	for j := 2; j <= 16 && stop == ""; j++ {
		if (j-1)%4 == 0 {
			continue
		}
		text := []rune(textAt(j))
		if len(text) >= 2 && !strings.Contains(textAt(j-1), string(text[len(text)-2:])) {
			k, stop = j, string(text[len(text)-2:])
		}
	}
	stopped := func(extra map[string]any, upTo int, wantText string, reason any) string {
		b := body(map[string]any{"max_tokens": 16, "stream_interval": 4, "stream_options": map[string]any{"include_usage": true}})
		maps.Copy(b, extra)
		cs, usage, _ := stream("/v1/completions", b)
		if len(cs) == 0 || len(all) < upTo {
			return "no chunks"
		}
		ids, text := joined(cs)
		last := cs[len(cs)-1]
		return fmt.Sprint("ids those of the answer up to the stopping id ", slices.Equal(ids, all[:upTo]),
			"; chunks ", chunking(cs, upTo, 4, exact),
			"; text ", text == wantText,
			"; finish ", last.finish, ", stop_reason the stop ", fmt.Sprint(last.reason) == fmt.Sprint(reason),
			"; usage the ids sent ", usage == upTo)
	}
	if stop == "" {
		obs["stop string inside a chunk"] = "none found in 16 ids"
	} else {
		t.Logf("%s: stop string %q completed by id %d", s.name, stop, k)
		full := textAt(k)
		at := strings.Index(full, stop)
		obs["stop string inside a chunk"] = stopped(map[string]any{"stop": []string{stop}}, k, full[:at], stop)
		obs["stop string inside a chunk, include_stop_str_in_output"] = stopped(map[string]any{"stop": []string{stop}, "include_stop_str_in_output": true}, k, full[:at+len(stop)], stop)
	}
	// A stop id: the first id inside a chunk not seen before it; its text
	// is dropped unless include_stop_str_in_output, stop strings or not.
	j := -1
	for i := 1; i < len(all); i++ {
		if i%4 != 0 && !slices.Contains(all[:i], all[i]) {
			j = i
			break
		}
	}
	if j < 0 {
		obs["stop id inside a chunk"] = "none found in 16 ids"
	} else {
		obs["stop id inside a chunk"] = stopped(map[string]any{"stop_token_ids": []int{all[j]}}, j+1, textAt(j), all[j])
		obs["stop id inside a chunk, with a stop string"] = stopped(map[string]any{"stop_token_ids": []int{all[j]}, "stop": []string{"zzzz"}}, j+1, textAt(j), all[j])
		obs["stop id inside a chunk, include_stop_str_in_output"] = stopped(map[string]any{"stop_token_ids": []int{all[j]}, "include_stop_str_in_output": true}, j+1, textAt(j+1), all[j])
	}
	return obs
}

// errParam is the param of an error body, nested (0.32.0) or flat.
func errParam(body string) string {
	var e struct {
		Error struct{ Param *string }
		Param *string
	}
	_ = json.Unmarshal([]byte(body), &e)
	switch {
	case e.Error.Param != nil:
		return *e.Error.Param
	case e.Param != nil:
		return "flat " + *e.Param
	}
	return "no param"
}

// TestSimulatorStreamsAsRealVLLM compares what a stream carries on the
// real vLLM and on the simulator, both started with --stream-interval 2
// and --max-model-len 128: chunks of several ids, stops inside a chunk,
// split characters, max_tokens absent or null. Where they differ, the
// simulator is wrong.
func TestSimulatorStreamsAsRealVLLM(t *testing.T) {
	scenario(t, "streams with several ids per chunk, stops and split characters, as the real vLLM sends them")
	start := time.Now()
	args := []string{model("tiny-llama"), "--dtype", "float32", "--served-model-name", "tiny", "--enforce-eager",
		"--max-model-len", "128", "--stream-interval", "2"}
	run := func(label, bin string, env map[string]string, exact bool) map[string]string {
		began := time.Now()
		s := serve(t, label, bin, env, args...)
		s.waitUp()
		up := time.Now()
		obs := observeStreaming(t, s, "tiny", exact)
		t.Logf("%s: up in %s, asked in %s", label, up.Sub(began).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
		return obs
	}
	realObs := run("real vLLM", real.vllm, vllmEnv(t.TempDir(), t.Name()), false)
	figure("stream facts on the real vLLM (s)", time.Since(start).Round(time.Second).Seconds())
	env := simEnv(t)
	env["FAKEVLLM_TOKEN_INTERVAL"] = "1ms"
	simObs := run("simulator", real.fakevllm, env, true)

	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(streamFacts)) {
		if realObs[k] != streamFacts[k] {
			diffs = append(diffs, fmt.Sprintf("%s\n    docs/resume-facts.md: %s\n    real:                 %s", k, streamFacts[k], realObs[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(realObs)) {
		if realObs[k] != simObs[k] {
			diffs = append(diffs, fmt.Sprintf("%s\n    real:      %s\n    simulator: %s", k, realObs[k], simObs[k]))
		} else {
			t.Logf("agree  %s: %s", k, realObs[k])
		}
	}
	if len(diffs) > 0 {
		t.Errorf("vLLM %s, the facts written down and the simulator differ:\n%s", real.version, strings.Join(diffs, "\n"))
	}
}

// streamFacts are the answers docs/resume-facts.md says vLLM 0.32.0 gives
// (at --stream-interval 2, --max-model-len 128).
var streamFacts = func() map[string]string {
	const shape = "as the interval says; true true; length"
	const stopped = "ids those of the answer up to the stopping id true; chunks as the interval says; text true; finish stop, stop_reason the stop true; usage the ids sent true"
	return map[string]string{
		"completions, --stream-interval 2, 9 ids: chunks; ids and text those of the answer; finish":                        shape,
		"completions, --stream-interval 2, stream_interval 4, 10 ids: chunks; ids and text those of the answer; finish":    shape,
		"completions, --stream-interval 2, stream_interval \"4\", 6 ids: chunks; ids and text those of the answer; finish": shape,
		"completions, --stream-interval 2, stream_interval 1, 6 ids: chunks; ids and text those of the answer; finish":     shape,
		"chat, --stream-interval 2, 9 ids: a role chunk without ids, then chunks":                                          "true as the interval says",
		"stream_interval 0: status, param": "400 body.stream_interval",
		"split characters: text at each chunk's end that of the answer stopped there; a chunk with ids and no text":                                            "true true",
		"a chunk with text whose last id starts a character: seen":                                                                                             "true",
		"a cut after each chunk: ids continue; text continues exactly unless /detokenize of the ids so far ends in U+FFFD, then the prompt's text comes first": "true true",
		"completions, max_tokens null: status, completion tokens, finish":                                                                                      "200 16 length",
		"completions, max_tokens absent: status, completion tokens, finish":                                                                                    "200 16 length",
		"completions, max_tokens \"5\": status, completion tokens, finish":                                                                                     "200 5 length",
		"chat, max_tokens null: status, completion tokens == max_model_len - prompt, finish":                                                                   "200 true length",
		"completions, a prompt of 120 ids, max_tokens null":                                                                                                    "200 8 length",
		"completions, a prompt of 120 ids, max_tokens 50":                                                                                                      "200 8 length",
		"completions, a prompt of 127 ids, max_tokens null":                                                                                                    "200 1 length",
		"completions, a prompt of 128 ids, max_tokens null":                                                                                                    "400 max_tokens",
		"completions, a prompt of 129 ids, max_tokens 1":                                                                                                       "400 input_tokens",
		"completions, max_tokens 200 (over max_model_len)":                                                                                                     "400 max_tokens",
		"completions, max_tokens 5.5":                                                                                                                          "400 body.max_tokens",
		"stop string inside a chunk":                                                                                                                           stopped,
		"stop string inside a chunk, include_stop_str_in_output":                                                                                               stopped,
		"stop id inside a chunk":                                                                                                                               stopped,
		"stop id inside a chunk, with a stop string":                                                                                                           stopped,
		"stop id inside a chunk, include_stop_str_in_output":                                                                                                   stopped,
	}
}()
