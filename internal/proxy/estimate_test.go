package proxy

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// nested is a prompt list nested depth deep around one token id.
func nested(depth int) []byte {
	return []byte(`{"prompt": ` + strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth) + `}`)
}

func imageMessage(imageBytes int) []byte {
	data := base64.StdEncoding.EncodeToString(make([]byte, imageBytes))
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "what is in this picture?"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + data}},
		map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": data, "format": "wav"}},
	}}}})
	return b
}

func TestPromptTokensShapes(t *testing.T) {
	deep := nested(10_000)
	for _, c := range []struct {
		name string
		body []byte
		want float64
	}{
		{"base64 image and audio are not prompt text", imageMessage(800 << 10), 6},
		{"nested past the depth cap: a quarter of its bytes", deep, float64(len(deep)) / 4},
		{"nested within the cap", nested(40), 1},
		{"a repeated key replaces the earlier value", []byte(`{"prompt": "abcdabcdabcd", "prompt": "abcd"}`), 1},
		{"escapes are one character each", []byte(`{"prompt": "\u00e9\n\t\"\\\ud83d\ude00ab"}`), 2},
		{"content parts' text only", []byte(`{"messages": [{"content": [{"type": "text", "text": "abcd", "extra": ["abcdabcd"]}, 7]}]}`), 2},
		{"messages not a list: a quarter of its bytes", []byte(`{"messages": "abcdabcdabcdabcd"}`), 8},
		{"a message not an object", []byte(`{"messages": [1, 2, 3]}`), 5.75},
		{"an object where text goes counts nothing", []byte(`{"prompt": {"text": "abcdabcd"}}`), 0},
		{"other fields are skipped", []byte(`{"tools": [{"x": "abcdabcdabcd"}], "prompt": "abcd", "n": [1, 2, 3]}`), 1},
		{"trailing comma: not JSON", []byte(`{"prompt": [1, 2, ]}`), 5},
		{"two values: not JSON", []byte(`{"prompt": "abcd"} {}`), 5.25},
		{"unterminated", []byte(`{"prompt": "abcd`), 4},
		{"a top-level list", []byte(`["abcdabcd"]`), 3},
		{"null messages", []byte(`{"messages": null, "prompt": "abcd"}`), 1},
		{"literals in a token list count nothing", []byte(`{"prompt": [true, false, null, 3]}`), 1},
	} {
		if got := PromptTokens(c.body); got != c.want {
			t.Errorf("%s: %v tokens, want %v", c.name, got, c.want)
		}
	}
}

// The estimate is one pass: no allocation for each level of nesting or
// each value (issue 24: the old estimate re-parsed every nested list, a
// 1 MiB body nested 10,000 deep took 160 s). Counted, not timed.
func TestPromptTokensAllocatesNothingPerLevel(t *testing.T) {
	for _, depth := range []int{60, 2_000} {
		body := nested(depth)
		if n := testing.AllocsPerRun(5, func() { PromptTokens(body) }); n > 4 {
			t.Errorf("a body nested %d deep: %v allocations an estimate, want at most 4", depth, n)
		}
	}
	ids := []byte(`{"prompt": [` + strings.Repeat("12345, ", 100_000) + `1]}`)
	if n := testing.AllocsPerRun(5, func() { PromptTokens(ids) }); n > 4 {
		t.Errorf("100,000 token ids: %v allocations an estimate, want at most 4", n)
	}
}

// Feeding the body in any two pieces gives the estimate of the whole: the
// scanner keeps its place across pieces (strings, escapes, numbers,
// literals cut anywhere).
func FuzzPromptTokens(f *testing.F) {
	for _, s := range []string{
		`{"prompt": "ab\u00e9cd", "input": [[1, 2], "x", {"text": "yy"}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi\n"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}`,
		`{"prompt": [true, false, null, -1.5e3]}`, `not json`, `{"prompt": "\ud83d\ude00"}`, `[[[[[[`, `{"prompt":1}`, ``,
	} {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16) {
		whole := PromptTokens(body)
		if math.IsNaN(whole) || whole < 0 || whole > float64(len(body)) {
			t.Fatalf("%q: %v tokens, want 0 to %d", body, whole, len(body))
		}
		at := int(cut) % (len(body) + 1)
		s := newPromptScanner()
		s.feed(body[:at])
		s.feed(body[at:])
		if got := s.tokens(int64(len(body))); got != whole {
			t.Fatalf("%q cut at %d: %v tokens, whole %v", body, at, got, whole)
		}
		if !json.Valid(body) && whole != float64(len(body))/4 && !strings.ContainsAny(string(body), "+-.eE0123456789") {
			t.Fatalf("%q is not JSON but counted %v tokens, not a quarter of its bytes", body, whole)
		}
	})
}

// Figures for the estimate (MB/s: it is linear in the body's size).
func BenchmarkPromptTokens(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"chat-4KiB", []byte(completion(1000))},
		{"text-1MiB", []byte(completion(256 << 10))},
		{"ids-1MiB", []byte(`{"prompt": [` + strings.Repeat("12345, ", 150_000) + `1]}`)},
		{"image-1MiB", imageMessage(768 << 10)},
		{"nested-1MiB-10000-deep", []byte(`{"prompt": ` + strings.Repeat("[", 10_000) + strings.Repeat("1,", 500_000) + "1" + strings.Repeat("]", 10_000) + `}`)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				PromptTokens(c.body)
			}
		})
	}
}

// After a 100 Continue the body must come at expectMinRate: the deadline
// for each read allows the grace and the bytes so far plus the next piece
// at that rate, no more.
func TestMinRateDeadline(t *testing.T) {
	start := time.Unix(1000, 0)
	d := minRateDeadline(start)
	if got, want := d(0), start.Add(expectGrace+time.Second); !got.Equal(want) {
		t.Errorf("first read: deadline %v, want %v", got, want)
	}
	if got, want := d(15<<20), start.Add(expectGrace+16*time.Second); !got.Equal(want) {
		t.Errorf("after 15 MiB: deadline %v, want %v", got, want)
	}
}
