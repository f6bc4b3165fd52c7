package realvllm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// What resuming a stream relies on (docs/resume-facts.md): where vLLM puts
// the token ids it returns, that it takes a prompt of token ids, and that
// a greedy request continued from its prompt's ids plus a prefix of its
// output yields the rest. observeTokens writes it down in words both
// sides can be compared by: the shapes (the keys and where the ids are),
// never the ids themselves (the tiny model's and the simulator's differ).

// sse posts a streaming request and returns its events (the JSON ones;
// "[DONE]" is reported by done).
func sse(url, key string, body map[string]any) (evs []map[string]any, done bool) {
	body["stream"] = true
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			return evs, true
		}
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) == nil {
			evs = append(evs, ev)
		}
	}
	return evs, false
}

// keys names an object's keys, sorted, with "=null" on the null ones.
func keys(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Sprintf("not an object: %T", v)
	}
	var ks []string
	for k, x := range m {
		if x == nil {
			k += "=null"
		}
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return strings.Join(ks, ",")
}

// ints reads a JSON list of numbers; ok false when v is not one.
func ints(v any) (out []int, ok bool) {
	l, ok := v.([]any)
	if !ok {
		return nil, false
	}
	for _, x := range l {
		f, isNum := x.(float64)
		if !isNum {
			return nil, false
		}
		out = append(out, int(f))
	}
	return out, true
}

func choice(ev map[string]any) map[string]any {
	cs, _ := ev["choices"].([]any)
	if len(cs) == 0 {
		return nil
	}
	c, _ := cs[0].(map[string]any)
	return c
}

// streamed is one stream's ids: the prompt's (wherever they were) and the
// generated ones, chunk by chunk.
type streamed struct {
	evs        []map[string]any
	done       bool
	prompt     []int
	promptAt   string // where the prompt's ids were: "choice of chunk N" or "top of chunk N"
	ids        []int
	idsPerText []int // ids per chunk that carries a choice with text or a delta
}

// idsSeen says how many ids a stream carried and whether every chunk
// with a token-id field carried at least one (how many per chunk varies:
// a loaded vLLM merges several into one chunk).
func idsSeen(s streamed) string {
	every := len(s.idsPerText) > 0
	for _, n := range s.idsPerText {
		every = every && n > 0
	}
	return fmt.Sprint(len(s.ids), " ", every)
}

func readIDs(evs []map[string]any, done bool) streamed {
	s := streamed{evs: evs, done: done}
	for i, ev := range evs {
		if p, ok := ints(ev["prompt_token_ids"]); ok {
			s.prompt, s.promptAt = p, fmt.Sprintf("top of chunk %d", i)
		}
		c := choice(ev)
		if c == nil {
			continue
		}
		if p, ok := ints(c["prompt_token_ids"]); ok {
			s.prompt, s.promptAt = p, fmt.Sprintf("choice of chunk %d", i)
		}
		if ids, ok := ints(c["token_ids"]); ok {
			s.ids = append(s.ids, ids...)
			s.idsPerText = append(s.idsPerText, len(ids))
		}
	}
	return s
}

// observeTokens asks a generative server for token ids every way resuming
// needs them and writes down the answers' shapes.
func observeTokens(s *server, key, name string) map[string]string {
	obs := map[string]string{}
	const prompt = "Once upon a time"
	greedy := func(extra map[string]any) map[string]any {
		b := map[string]any{"model": name, "temperature": 0, "ignore_eos": true}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	msgs := []map[string]string{{"role": "user", "content": prompt}}

	// Completions, streaming, with and without return_token_ids.
	c := readIDs(sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": prompt, "max_tokens": 12, "return_token_ids": true})))
	obs["completions stream: [DONE]"] = fmt.Sprint(c.done)
	obs["completions stream: prompt ids at"] = c.promptAt
	obs["completions stream: ids, every chunk with some"] = idsSeen(c)
	if len(c.evs) > 1 {
		obs["completions stream: first chunk"] = keys(c.evs[0])
		obs["completions stream: first choice"] = keys(choice(c.evs[0]))
		obs["completions stream: middle choice"] = keys(choice(c.evs[1]))
		obs["completions stream: last chunk"] = keys(c.evs[len(c.evs)-1])
		obs["completions stream: last choice"] = keys(choice(c.evs[len(c.evs)-1]))
	}
	plain, _ := sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": prompt, "max_tokens": 2}))
	if len(plain) > 0 {
		obs["completions stream without return_token_ids: first choice"] = keys(choice(plain[0]))
	}
	u, _ := sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": prompt, "max_tokens": 2, "stream_options": map[string]any{"include_usage": true}}))
	if len(u) > 0 {
		obs["completions stream with usage: last chunk"] = keys(u[len(u)-1])
		obs["completions stream with usage: usage"] = keys(u[len(u)-1]["usage"])
		obs["completions stream with usage: finishing chunk"] = keys(u[len(u)-2])
	}

	// Chat, streaming.
	ch := readIDs(sse(s.url("/v1/chat/completions"), key, greedy(map[string]any{"messages": msgs, "max_tokens": 12, "return_token_ids": true})))
	obs["chat stream: [DONE]"] = fmt.Sprint(ch.done)
	obs["chat stream: prompt ids at"] = ch.promptAt
	obs["chat stream: ids, every chunk with some"] = idsSeen(ch)
	if len(ch.evs) > 2 {
		obs["chat stream: first chunk"] = keys(ch.evs[0])
		obs["chat stream: first choice"] = keys(choice(ch.evs[0]))
		obs["chat stream: first delta"] = keys(choice(ch.evs[0])["delta"])
		obs["chat stream: middle choice"] = keys(choice(ch.evs[1]))
		obs["chat stream: last chunk"] = keys(ch.evs[len(ch.evs)-1])
		obs["chat stream: last choice"] = keys(choice(ch.evs[len(ch.evs)-1]))
	}
	plain, _ = sse(s.url("/v1/chat/completions"), key, greedy(map[string]any{"messages": msgs, "max_tokens": 2}))
	if len(plain) > 1 {
		obs["chat stream without return_token_ids: first chunk"] = keys(plain[0])
		obs["chat stream without return_token_ids: middle choice"] = keys(choice(plain[1]))
	}
	tok := post(s.url("/tokenize"), key, map[string]any{"model": name, "messages": msgs})
	var tokens struct{ Tokens []int }
	_ = json.Unmarshal([]byte(tok.body), &tokens)
	obs["/tokenize messages == the chat's prompt_token_ids"] = fmt.Sprint(tok.status, " ", len(ch.prompt) > 0 && slices.Equal(tokens.Tokens, ch.prompt))
	obs["/tokenize with token ids"] = fmt.Sprint(post(s.url("/tokenize"), key, map[string]any{"model": name, "prompt": []int{1, 2}}).status)

	// Not streaming.
	shape := func(path string, body map[string]any) (top, ch, inner string, got map[string]any) {
		a := post(s.url(path), key, body)
		if json.Unmarshal([]byte(a.body), &got) != nil {
			return fmt.Sprint(a.status), "", "", nil
		}
		c := choice(got)
		return fmt.Sprint(a.status, " ", keys(got)), keys(c), keys(c["message"]), got
	}
	top, cc, _, got := shape("/v1/completions", greedy(map[string]any{"prompt": prompt, "max_tokens": 4, "return_token_ids": true}))
	obs["completions: answer"], obs["completions: choice"] = top, cc
	if one := choice(got); one != nil {
		ids, _ := ints(one["token_ids"])
		p, _ := ints(one["prompt_token_ids"])
		obs["completions: ids"] = fmt.Sprintf("token_ids %d, prompt_token_ids == the stream's %v", len(ids), len(p) > 0 && slices.Equal(p, c.prompt))
	}
	top, cc, msg, got := shape("/v1/chat/completions", greedy(map[string]any{"messages": msgs, "max_tokens": 4, "return_token_ids": true}))
	obs["chat: answer"], obs["chat: choice"], obs["chat: message"] = top, cc, msg
	if one := choice(got); one != nil {
		ids, _ := ints(one["token_ids"])
		p, _ := ints(got["prompt_token_ids"])
		obs["chat: ids"] = fmt.Sprintf("token_ids %d, top-level prompt_token_ids == the stream's %v", len(ids), len(p) > 0 && slices.Equal(p, ch.prompt))
	}

	// A prompt of token ids, and the continuation from a prefix.
	if len(c.prompt) > 0 && len(c.ids) == 12 {
		a := post(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": c.prompt, "max_tokens": 2}))
		obs["completions: a token-id prompt"] = fmt.Sprint(a.status, " ", a.finish)
		cont := readIDs(sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": append(slices.Clone(c.prompt), c.ids[:4]...), "max_tokens": 8, "return_token_ids": true})))
		obs["completions: prompt + 4 ids continues with the other 8"] = fmt.Sprint(slices.Equal(cont.ids, c.ids[4:]), ", its prompt ids the ones sent ", slices.Equal(cont.prompt, append(slices.Clone(c.prompt), c.ids[:4]...)))
	}
	if len(c.prompt) > 0 && len(c.ids) == 12 {
		// Every cut: the ids always continue; the text too when the cut
		// follows a chunk that carried text and ends on a whole character;
		// else the continuation's text,
		// if any, starts with the whole prompt's (vLLM's DecodeStream).
		chunkText := func(ev map[string]any) string {
			t, _ := choice(ev)["text"].(string)
			return t
		}
		var full strings.Builder
		for _, ev := range c.evs {
			full.WriteString(chunkText(ev))
		}
		// Cuts at chunk boundaries: a loaded server merges several ids
		// into one chunk (vLLM's RequestOutputCollector).
		var detok struct{ Prompt string }
		_ = json.Unmarshal([]byte(post(s.url("/detokenize"), key, map[string]any{"model": name, "tokens": c.prompt}).body), &detok)
		idsOK, textRule, inside, outside, glitch := true, true, 0, 0, false
		var before strings.Builder
		k := 0
		for j, ev := range c.evs[:len(c.evs)-1] {
			ids, _ := ints(choice(ev)["token_ids"])
			k += len(ids)
			before.WriteString(chunkText(ev))
			if k == 0 || k >= 12 {
				continue
			}
			cont := readIDs(sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": append(slices.Clone(c.prompt), c.ids[:k]...), "max_tokens": 12 - k, "return_token_ids": true})))
			contText := ""
			for _, ev := range cont.evs {
				contText += chunkText(ev)
			}
			// Whether the ids so far end on a whole character: vLLM's
			// detokenizer holds text back while it ends in U+FFFD. A chunk
			// with text can still end mid-character when a loaded server
			// merged ids into it (docs/resume-facts.md).
			var so struct{ Prompt string }
			_ = json.Unmarshal([]byte(post(s.url("/detokenize"), key, map[string]any{"model": name, "tokens": c.ids[:k]}).body), &so)
			carried := chunkText(c.evs[j]) != "" && !strings.HasSuffix(so.Prompt, "\ufffd")
			idsOK = idsOK && slices.Equal(cont.ids, c.ids[k:])
			startsWithPrompt := detok.Prompt != "" && strings.HasPrefix(contText, detok.Prompt)
			glitch = glitch || !carried && startsWithPrompt
			if carried {
				textRule = textRule && before.String()+contText == full.String()
			} else {
				textRule = textRule && (contText == "" || startsWithPrompt)
			}
			if carried {
				outside++
			} else {
				inside++
			}
		}
		obs["completions: every cut continues the ids; the text after a chunk with text, else the prompt's text first; both kinds of cut seen; the prompt's text seen"] = fmt.Sprint(idsOK, " ", textRule, " ", inside > 0 && outside > 0, " ", glitch)
	}
	if len(ch.prompt) > 0 && len(ch.ids) == 12 {
		cont := readIDs(sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": append(slices.Clone(ch.prompt), ch.ids[:4]...), "max_tokens": 8, "return_token_ids": true})))
		obs["chat: chat prompt ids + 4 ids continues with the other 8 (/v1/completions)"] = fmt.Sprint(slices.Equal(cont.ids, ch.ids[4:]))
	}
	obs["completions: an empty token-id prompt"] = fmt.Sprint(post(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": []int{}, "max_tokens": 1})).status)
	obs["completions: a token id out of the vocabulary"] = fmt.Sprint(post(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": []int{99999999}, "max_tokens": 1})).status)

	// Stops: the ids are never held back, the held-back text comes at the end.
	if len(c.ids) == 12 {
		stopID := readIDs(sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": prompt, "max_tokens": 12, "return_token_ids": true, "stop_token_ids": []int{c.ids[0]}})))
		if len(stopID.evs) > 0 {
			last := choice(stopID.evs[len(stopID.evs)-1])
			obs["stop_token_ids: the first id stops"] = fmt.Sprintf("chunks %d, ids %v, finish %v, stop_reason is the id %v, text %q",
				len(stopID.evs), stopID.idsPerText, last["finish_reason"], last["stop_reason"] == float64(c.ids[0]), last["text"])
		}
		text := func(s streamed) string {
			var b strings.Builder
			for _, ev := range s.evs {
				if c := choice(ev); c != nil {
					t, _ := c["text"].(string)
					b.WriteString(t)
				}
			}
			return b.String()
		}
		never := readIDs(sse(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": prompt, "max_tokens": 12, "return_token_ids": true, "stop": []string{"\x01\x02\x03never"}})))
		obs["a stop string that never comes: ids, same ids, same text"] = fmt.Sprint(idsSeen(never), " ", slices.Equal(never.ids, c.ids), " ", text(never) == text(c))
	}
	obs["use_beam_search with stream"] = fmt.Sprint(post(s.url("/v1/completions"), key, greedy(map[string]any{"prompt": prompt, "max_tokens": 1, "stream": true, "use_beam_search": true})).status)
	return obs
}
