package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Issue 40 item 5: the differential oracle through the running guard over
// the simulator. A stream is asked once straight from vLLM (the oracle),
// then through the guard's proxy with vLLM SIGKILLed after a seeded sample
// of chunk positions (2 ids a chunk, the request's stream_interval): a
// greedy stream comes back byte for byte the oracle's text and ids; a
// sampled one is one consistent answer (its ids within max_tokens, usage
// counting them, one finish, one [DONE], no error).
func TestResumeCutAtSampledPositionsThroughTheGuard(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_ERA"] = "v1"
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "5ms"
	proxyPort := testkit.FreePort(t)
	s.extra = fmt.Sprintf("\n[restart]\ninitial_delay = \"100ms\"\n[proxy]\nlisten = \"127.0.0.1:%d\"\n", proxyPort)
	s.start()
	readies := 1
	ready := s.WaitEvent("ready", readies, 60*time.Second, isReady)

	const maxTokens = 24
	body := func(sampling string) string {
		return `{"model":"test-model","prompt":"hello there friend","max_tokens":24,"stream":true,"stream_interval":2,` +
			`"return_token_ids":true,"stream_options":{"include_usage":true},` + sampling + `}`
	}
	greedy := body(`"temperature":0`)
	want := readStream(t, fmt.Sprintf("http://127.0.0.1:%d", s.port), greedy, -1, nil)
	if want.errors != 0 || want.done != 1 || len(want.ids) != maxTokens || want.chunks < 6 {
		t.Fatalf("vLLM's own answer: %+v", want)
	}
	proxy := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
	rng := rand.New(rand.NewPCG(40, 5))
	kill := func() {
		if err := syscall.Kill(ready.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	var cuts []int // four distinct positions, the first chunk to the last but one
	for _, c := range rng.Perm(want.chunks - 1)[:4] {
		cuts = append(cuts, c+1)
	}
	for _, cut := range cuts {
		got := readStream(t, proxy, greedy, cut, kill)
		readies++
		ready = s.WaitEvent("ready after the kill", readies, 60*time.Second, isReady)
		if got.errors != 0 || got.done != 1 || got.text != want.text || !slices.Equal(got.ids, want.ids) ||
			got.completion != want.completion || len(got.finishes) != 1 {
			t.Fatalf("greedy, vLLM killed after chunk %d: got %q ids %v finishes %v usage %d, %d errors, %d [DONE]\nwant %q ids %v usage %d",
				cut, got.text, got.ids, got.finishes, got.completion, got.errors, got.done, want.text, want.ids, want.completion)
		}
	}
	cut := 1 + rng.IntN(want.chunks-2)
	got := readStream(t, proxy, body(`"temperature":0.8`), cut, kill)
	readies++
	s.WaitEvent("ready after the kill", readies, 60*time.Second, isReady)
	if got.errors != 0 || got.done != 1 || len(got.finishes) != 1 || len(got.ids) > maxTokens || got.completion != len(got.ids) {
		t.Fatalf("sampled, vLLM killed after chunk %d: %d ids (max_tokens %d), usage %d, finishes %v, %d errors, %d [DONE]",
			cut, len(got.ids), maxTokens, got.completion, got.finishes, got.errors, got.done)
	}
	t.Logf("greedy cuts after chunks %v equal to vLLM's own answer; a sampled cut after chunk %d consistent", cuts, cut)
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// streamAnswer is what a client reads of a completion stream.
type streamAnswer struct {
	text       string
	ids        []int
	finishes   []string
	completion int // usage's completion_tokens
	chunks     int // data chunks with a choice
	errors     int
	done       int
}

// readStream posts body to base's /v1/completions and reads the stream;
// after cut chunks with a choice (cut >= 0) it calls at once, once.
func readStream(t *testing.T, base, body string, cut int, at func()) streamAnswer {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Minute}
	resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST: %s", resp.Status)
	}
	var a streamAnswer
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			a.done++
			continue
		}
		var c struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Text         string  `json:"text"`
				TokenIDs     []int   `json:"token_ids"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("a chunk that is not JSON: %q", d)
		}
		if c.Error != nil {
			a.errors++
		}
		if c.Usage != nil {
			a.completion = c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			a.chunks++
			a.text += ch.Text
			a.ids = append(a.ids, ch.TokenIDs...)
			if ch.FinishReason != nil {
				a.finishes = append(a.finishes, *ch.FinishReason)
			}
		}
		if len(c.Choices) > 0 && a.chunks == cut && at != nil {
			at()
		}
	}
	return a
}

// greedyBody is the n-th greedy streamed completion of max tokens, 2 ids
// a chunk, with its ids and usage.
func greedyBody(i, max int) string {
	return fmt.Sprintf(`{"model":"test-model","prompt":"hello there friend %d","max_tokens":%d,"stream":true,"stream_interval":2,`+
		`"return_token_ids":true,"stream_options":{"include_usage":true},"temperature":0}`, i, max)
}

// ownAnswers is vLLM's own uninterrupted answer at base to each body,
// each whole with want ids: the oracle of a stream through a death.
func ownAnswers(t *testing.T, base string, bodies []string, want int) []streamAnswer {
	t.Helper()
	out := make([]streamAnswer, len(bodies))
	for i, b := range bodies {
		out[i] = readStream(t, base, b, -1, nil)
		if out[i].errors != 0 || out[i].done != 1 || len(out[i].ids) != want {
			t.Fatalf("vLLM's own answer %d: %+v", i, out[i])
		}
	}
	return out
}

// streamsInFlight sends each body through base and returns once every
// stream has its first chunks; wait reads them all to their end.
func streamsInFlight(t *testing.T, base string, bodies []string) (wait func() []streamAnswer) {
	var started, wg sync.WaitGroup
	started.Add(len(bodies))
	got := make([]streamAnswer, len(bodies))
	for i, b := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = readStream(t, base, b, 2, started.Done)
		}()
	}
	started.Wait()
	return func() []streamAnswer { wg.Wait(); return got }
}
