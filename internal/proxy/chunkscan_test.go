package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// newTestResumer is a resumable stream of a request to path with body,
// in the middle of its first answer, writing to a recorder.
func newTestResumer(t testing.TB, path, body string) (*resumer, *httptest.ResponseRecorder) {
	t.Helper()
	plan, reason := planStream(path, []byte(body))
	if plan == nil {
		t.Fatalf("%s: not resumable (%q)", body, reason)
	}
	rr := httptest.NewRecorder()
	p := New(proxyConfig(), &fakeUp{ready: true, seqs: 1}, nil, nil)
	s := &resumer{p: p, w: &recorder{ResponseWriter: rr, rc: http.NewResponseController(rr)}, plan: plan, sends: 1, headerSent: true,
		st: &reqState{}, r: httptest.NewRequest(http.MethodPost, path, nil)}
	if len(plan.stops) > 0 {
		s.text = &stopText{stops: plan.stops, keep: plan.keepStop}
		s.text.init()
	}
	return s, rr
}

func decodeEvent(t testing.TB, out string) any {
	t.Helper()
	d, ok := strings.CutPrefix(out, "data: ")
	if !ok || !strings.HasSuffix(d, "\n\n") || strings.Count(d, "\n") != 2 {
		t.Fatalf("not one data event: %q", out)
	}
	dec := json.NewDecoder(strings.NewReader(d))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("event %q: %v", out, err)
	}
	return v
}

// throughRewrite runs data through a resumer's one chunk rewrite
// (onChunk): handled is whether the scan read it as a chunk of one choice
// (else the stream is no longer continued), out what the client got.
func throughRewrite(t testing.TB, path, body string, prime func(*resumer), data []byte) (*resumer, string, bool) {
	t.Helper()
	s, w := newTestResumer(t, path, body)
	prime(s)
	handled := bytes.IndexByte(data, '\n') < 0 && bytes.IndexByte(data, '\r') < 0 && json.Valid(data) &&
		s.scan.read(data, s.plan.chat) == chunkChoice
	s.onChunk(append([]byte("data: "), data...), data)
	s.flush()
	if handled && s.notResumed == nrUnknownChunk {
		t.Fatalf("%s: read, yet not resumable", data)
	}
	return s, w.Body.String(), handled
}

func noPrime(*resumer) {}

const (
	scanCompletions = `{"stream":true,"prompt":"x","max_tokens":1000}`
	scanChat        = `{"stream":true,"messages":[]}`
)

// The fast path reads the choice's own token ids and nothing that only
// looks like them: token_ids inside the text (escaped quotes, unicode
// escapes), as a key nested elsewhere, or at the top level; and it leaves
// to the decoding path keys that decode or fold to a name it reads.
func TestChunkScanTrickyChunks(t *testing.T) {
	for _, c := range []struct {
		name, path, chunk string
		handled           bool
		ids               []int
		keeps             string // bytes the output must hold as they came
	}{
		{"plain", "/v1/completions",
			`{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[5]}]}`,
			true, []int{5}, `"text":" a"`},
		// The real vLLM 0.32.0's (docs/resume-facts.md).
		{"real completions, first chunk", "/v1/completions",
			`{"id":"cmpl-a4a8ca5a21121e30","object":"text_completion","created":1796318347,"model":"tiny","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[46,77,66,68,220,84,79,78,77,220,64,220,83,72,76,68],"token_ids":[121]}]}`,
			true, []int{121}, `"prompt_token_ids":null,"token_ids":null}]}`},
		{"real chat, role chunk", "/v1/chat/completions",
			`{"id":"chatcmpl-a10e7867a8cb9e25","object":"chat.completion.chunk","created":1796318415,"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[259,46,77,66,68,220,84,79,78,77,220,64,220,83,72,76,68,257,260],"prompt_text":null}`,
			true, nil, `"prompt_token_ids":null,"prompt_text":null}`},
		{"real chat, a token", "/v1/chat/completions",
			`{"id":"chatcmpl-a10e7867a8cb9e25","object":"chat.completion.chunk","created":1796318415,"model":"tiny","choices":[{"index":0,"delta":{"content":"-"},"logprobs":null,"finish_reason":null,"token_ids":[12]}]}`,
			true, []int{12}, `"delta":{"content":"-"},"logprobs":null,"finish_reason":null,"token_ids":null}]}`},
		{"token_ids in the text, escaped quotes", "/v1/completions",
			`{"choices":[{"index":0,"text":"say \"token_ids\":[9,9] \\","token_ids":[5,6]}]}`,
			true, []int{5, 6}, `"text":"say \"token_ids\":[9,9] \\"`},
		{"token_ids in the text, unicode escapes", "/v1/completions",
			`{"choices":[{"index":0,"text":"\u0022token_ids\u0022:[9] \u00e9\ud83d\ude00","token_ids":[5]}]}`,
			true, []int{5}, `"text":"\u0022token_ids\u0022:[9] \u00e9\ud83d\ude00"`},
		{"token_ids nested in logprobs", "/v1/completions",
			`{"choices":[{"index":0,"logprobs":{"token_ids":[7],"x":[{"token_ids":[8]}]},"text":"a","token_ids":[5]}]}`,
			true, []int{5}, `"logprobs":{"token_ids":[7],"x":[{"token_ids":[8]}]}`},
		{"token_ids at the top level", "/v1/completions",
			`{"token_ids":[7],"choices":[{"index":0,"text":"a","token_ids":[5]}]}`,
			true, []int{5}, `{"token_ids":[7],`},
		{"token_ids nested in the delta", "/v1/chat/completions",
			`{"choices":[{"index":0,"delta":{"content":"x","token_ids":[8]},"finish_reason":null,"token_ids":[5]}]}`,
			true, []int{5}, `"delta":{"content":"x","token_ids":[8]}`},
		{"chat role chunk with the prompt", "/v1/chat/completions",
			`{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3],"prompt_text":null}`,
			true, nil, `"delta":{"role":"assistant","content":""}`},
		{"spaces everywhere", "/v1/completions",
			` { "choices" : [ { "text" : "a b" , "token_ids" : [ 1 , -2 ] , "prompt_token_ids" : [ ] } ] } `,
			true, []int{1, -2}, `"text" : "a b"`},
		{"several ids, text held back", "/v1/completions",
			`{"choices":[{"text":"","token_ids":[1,2,3]}]}`, true, []int{1, 2, 3}, `"text":""`},
		{"escaped key", "/v1/completions", `{"choices":[{"text":"a","token\u005fids":[5]}]}`, false, nil, ""},
		{"escaped top-level key", "/v1/completions", `{"choi\u0063es":[{"text":"a","token_ids":[5]}]}`, false, nil, ""},
		{"key in other case", "/v1/completions", `{"choices":[{"text":"a","TOKEN_IDS":[5]}]}`, false, nil, ""},
		{"Kelvin sign folds to k", "/v1/completions", "{\"choices\":[{\"text\":\"a\",\"to\u212aen_ids\":[5]}]}", false, nil, ""},
		{"duplicate token_ids", "/v1/completions", `{"choices":[{"text":"a","token_ids":[5],"token_ids":[6]}]}`, false, nil, ""},
		{"an id that is not an integer", "/v1/completions", `{"choices":[{"text":"a","token_ids":[1.0]}]}`, false, nil, ""},
		{"a huge id", "/v1/completions", `{"choices":[{"text":"a","token_ids":[1234567890123456789012]}]}`, false, nil, ""},
		{"the finish", "/v1/completions", `{"choices":[{"text":"a","finish_reason":"length","token_ids":[5]}]}`, true, []int{5}, `"finish_reason":"length"`},
		{"usage", "/v1/completions", `{"choices":[],"usage":{"prompt_tokens":1}}`, false, nil, ""},
		{"two choices", "/v1/completions", `{"choices":[{"text":"a","token_ids":[5]},{"text":"b","token_ids":[6]}]}`, false, nil, ""},
		{"flat error", "/v1/completions", `{"object":"error","choices":[{"text":"a","token_ids":[5]}]}`, false, nil, ""},
		{"chat content null", "/v1/chat/completions", `{"choices":[{"delta":{"content":null},"token_ids":[5]}]}`, false, nil, ""},
		{"not JSON", "/v1/completions", `{"choices":[{"text":"a","token_ids":[5]}]`, false, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := scanCompletions
			if c.path == "/v1/chat/completions" {
				body = scanChat
			}
			s, out, handled := throughRewrite(t, c.path, body, noPrime, []byte(c.chunk))
			if handled != c.handled {
				t.Fatalf("read: %v, want %v", handled, c.handled)
			}
			if !handled {
				return
			}
			if fmt.Sprint(s.led.ids) != fmt.Sprint(c.ids) && len(s.led.ids)+len(c.ids) > 0 {
				t.Fatalf("ids %v, want %v", s.led.ids, c.ids)
			}
			if !strings.Contains(out, c.keeps) {
				t.Fatalf("%q does not keep %s", out, c.keeps)
			}
			if strings.Contains(out, `"token_ids":[5`) || strings.Contains(out, `"prompt_token_ids":[1`) || strings.Contains(out, `"token_ids" : [`) {
				t.Fatalf("ids the client did not ask for passed on: %s", out)
			}
		})
	}
}

// A client that asked for the ids gets vLLM's chunks as they came, the
// prompt's ids once.
func TestChunkScanPassesAskedIDs(t *testing.T) {
	body := `{"stream":true,"prompt":"x","return_token_ids":true}`
	first := `{"choices":[{"index":0,"text":"a","prompt_token_ids":[1,2],"token_ids":[5]}]}`
	s, fw := newTestResumer(t, "/v1/completions", body)
	for _, c := range []string{first, `{"choices":[{"index":0,"text":"b","prompt_token_ids":[1,2],"token_ids":[6]}]}`} {
		if _, _, cut := s.onChunk([]byte("data: "+c), []byte(c)); cut || s.notResumed != "" {
			t.Fatalf("not taken: %s", c)
		}
	}
	s.flush()
	want := "data: " + first + "\n\n" + `data: {"choices":[{"index":0,"text":"b","prompt_token_ids":null,"token_ids":[6]}]}` + "\n\n"
	if fw.Body.String() != want {
		t.Fatalf("wrote\n%s\nwant\n%s", fw.Body, want)
	}
	if fmt.Sprint(s.prompt, s.led.ids) != "[1 2] [5 6]" {
		t.Fatalf("prompt %v given %v", s.prompt, s.led.ids)
	}
}

// A client that did not ask gets vLLM's chunk byte for byte as vLLM sends
// it without return_token_ids: the same keys, in the same order, the ids
// null.
func TestChunkScanIsVLLMsChunkWithoutIDs(t *testing.T) {
	with := `{"id":"cmpl-a4a8ca5a21121e30","object":"text_completion","created":1796318347,"model":"tiny","choices":[{"index":0,"text":"\ufffd\ufffd-","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[46,77,66],"token_ids":[12]}]}`
	without := `{"id":"cmpl-a4a8ca5a21121e30","object":"text_completion","created":1796318347,"model":"tiny","choices":[{"index":0,"text":"\ufffd\ufffd-","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}`
	_, out, handled := throughRewrite(t, "/v1/completions", scanCompletions, noPrime, []byte(with))
	if !handled || out != "data: "+without+"\n\n" {
		t.Fatalf("taken %v, wrote %q\nwant %q", handled, out, without)
	}
}

// The hand parser against encoding/json, on any chunk: when it takes a
// chunk, the ids it read are the choice's token_ids as encoding/json reads
// them, and the output decodes to the input with the ids the client did
// not ask for made null.
func FuzzChunkScanAgainstDecode(f *testing.F) {
	for _, s := range []string{
		`{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2],"token_ids":[5]}]}`,
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"prompt_token_ids":[1,2],"prompt_text":null}`,
		`{"choices":[{"index":0,"delta":{"content":"x\"token_ids\":[1]","reasoning":"r"},"token_ids":[5,6]}]}`,
		`{"choices":[{"text":"\u0022token_ids\u0022","logprobs":{"token_ids":[7]},"token_ids":[]}]}`,
		`{"choices":[{"text":"a","Token_Ids":[5]}]}`,
		`{"choices":[{"text":"a","token_ids":null,"prompt_token_ids":null}],"usage":null,"error":null}`,
		`{"choices":[{"delta":{"content":"ab"},"token_ids":[1]}],"prompt_token_ids":null}`,
		` { "choices" : [ { "text" : "" , "token_ids" : [ -0 , 3 ] } ] , "x" : 1e5 } `,
	} {
		for _, chat := range []bool{false, true} {
			f.Add([]byte(s), chat, false, false, false)
			f.Add([]byte(s), chat, true, true, true)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, chat, wantIDs, stops, primed bool) {
		path, body := "/v1/completions", `{"stream":true,"prompt":"x","max_tokens":1000`
		if chat {
			path, body = "/v1/chat/completions", `{"stream":true,"messages":[]`
		}
		if wantIDs {
			body += `,"return_token_ids":true`
		}
		if stops {
			body += `,"stop":["ab","xyz"]`
		}
		body += "}"
		prime := noPrime
		if primed {
			prime = func(s *resumer) {
				s.led = ledger{ids: []int{7, 8}, whole: 1, rawSince: "q", chunks: 1}
				s.prompt, s.promptSent, s.roleSent = []int{1}, true, true
				s.id, s.created, s.model = json.RawMessage(`"c0"`), json.RawMessage("1"), json.RawMessage(`"m"`)
			}
		}
		s, out, handled := throughRewrite(t, path, body, prime, data)
		if !handled {
			return
		}
		var in map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if dec.Decode(&in) != nil {
			t.Fatalf("took a chunk encoding/json does not read: %q", data)
		}
		choice := in["choices"].([]any)[0].(map[string]any)
		var want []int
		if ids, ok := choice["token_ids"].([]any); ok {
			for _, id := range ids {
				n, err := id.(json.Number).Int64()
				if err != nil {
					t.Fatalf("took an id encoding/json reads as %v: %q", id, data)
				}
				want = append(want, int(n))
			}
		}
		if got := s.led.ids[len(s.led.ids)-len(want):]; len(s.led.ids)-len(want) != map[bool]int{false: 0, true: 2}[primed] || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("read ids %v, encoding/json %v: %q", s.led.ids, want, data)
		}
		if wantIDs || stops || out == "" {
			return
		}
		// Stripped: the choice's token_ids and prompt_token_ids, and the
		// prompt's ids at the top level (chat); a top-level token_ids is
		// not vLLM's and passes.
		for m, keys := range map[*map[string]any][]string{&in: {"prompt_token_ids"}, &choice: {"token_ids", "prompt_token_ids"}} {
			for _, k := range keys {
				if _, has := (*m)[k]; has {
					(*m)[k] = nil
				}
			}
		}
		if got := decodeEvent(t, out); !reflect.DeepEqual(got, any(in)) {
			t.Fatalf("wrote %s for %s", out, data)
		}
	})
}

// eventDataBySplit is how the proxy read an event's data before
// eventData, which does not copy it.
func eventDataBySplit(ev []byte) []byte {
	var data []byte
	for _, l := range bytes.Split(ev, []byte("\n")) {
		l = bytes.TrimRight(l, "\r")
		if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(d, []byte(" "))...)
		}
	}
	return data
}

func FuzzEventData(f *testing.F) {
	for _, ev := range []string{"data: {}\n", "data:{}\r\n", ": c\ndata: a\ndata:  b\n", "data:\ndata: x\n", "data:\n", "event: x\nid: 1\n", "data: [DONE]"} {
		f.Add([]byte(ev))
	}
	f.Fuzz(func(t *testing.T, ev []byte) {
		orig := bytes.Clone(ev)
		got, want := eventData(ev), eventDataBySplit(ev)
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Fatalf("%q: data %q, want %q", ev, got, want)
		}
		if !bytes.Equal(ev, orig) {
			t.Fatalf("the event was changed: %q, was %q", ev, orig)
		}
	})
}
