package redact

import (
	"slices"
	"strings"
	"testing"
)

// cases: the text, and the secrets that must not survive it.
var cases = []struct {
	in      string
	secrets []string
	want    string // "" when only the secrets matter
}{
	{"vllm serve m --api-key sk-abc123 --port 8000", []string{"sk-abc123"}, "vllm serve m --api-key *** --port 8000"},
	{"vllm serve m --api-key=abc123", []string{"abc123"}, "vllm serve m --api-key=***"},
	{"['vllm', 'serve', '--api-key', 'k3y-value']", []string{"k3y-value"}, "['vllm', 'serve', '--api-key', '***']"},
	{`["--hf-token","hfvalue99"]`, []string{"hfvalue99"}, `["--hf-token","***"]`},
	{"(APIServer pid=7) INFO [utils.py:233] non-default args: {'model_tag': 'm', 'api_key': 'supersecret', 'port': 8000}",
		[]string{"supersecret"}, "(APIServer pid=7) INFO [utils.py:233] non-default args: {'model_tag': 'm', 'api_key': '***', 'port': 8000}"},
	{"non-default args: {'api_key': ['k1', 'k2'], 'max_num_seqs': 8}", []string{"k1", "k2"}, "non-default args: {'api_key': ['***'], 'max_num_seqs': 8}"},
	{`{"api_key": "jsonsecret", "max_tokens": 16}`, []string{"jsonsecret"}, `{"api_key": "***", "max_tokens": 16}`},
	{"args: Namespace(host=None, api_key='nsSecret', lora_modules=None)", []string{"nsSecret"}, "args: Namespace(host=None, api_key='***', lora_modules=None)"},
	{"args: Namespace(api_key=None, tokenizer=None)", nil, "args: Namespace(api_key=None, tokenizer=None)"},
	{"env VLLM_API_KEY=envsecret HF_TOKEN=hf_zzzzzzzzzzzzzzzzzzzzzzzz ok", []string{"envsecret", "zzzzzzzzzzzzzzzz"}, "env VLLM_API_KEY=*** HF_TOKEN=*** ok"},
	{"GET /v1/models Authorization: Bearer abc.def-ghi", []string{"abc.def-ghi"}, "GET /v1/models Authorization: Bearer ***"},
	{"curl -H 'Authorization: Basic dXNlcjpwYXNz' x", []string{"dXNlcjpwYXNz"}, "curl -H 'Authorization: Basic ***' x"},
	{"sent bearer tok_123 upstream", []string{"tok_123"}, "sent bearer *** upstream"},
	{"token hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 loaded", []string{"hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"}, "token *** loaded"},
	{"POST https://alice:pa55@hooks.example.com/x failed", []string{"alice", "pa55"}, "POST https://***@hooks.example.com/x failed"},
	{"POST https://u:p@ss@hooks.example.com/x", []string{"p@ss"}, "POST https://***@hooks.example.com/x"},
	{"webhook https://hooks.example.com/x?token=qs-secret&a=1", []string{"qs-secret"}, "webhook https://hooks.example.com/x?token=***&a=1"},
	// vLLM reads an unambiguous abbreviation, with underscores, as the flag
	// (issue 32 item 3); an ambiguous one (--api) it refuses.
	{"vllm serve m --api-ke abbrevkey1 --port 8000", []string{"abbrevkey1"}, "vllm serve m --api-ke *** --port 8000"},
	{"vllm serve m --api_k=abbrevkey2", []string{"abbrevkey2"}, "vllm serve m --api_k=***"},
	{"['vllm', 'serve', '--hf-tok', 'abbrevkey3']", []string{"abbrevkey3"}, "['vllm', 'serve', '--hf-tok', '***']"},
	{"vllm serve m --api 4 --api-server-c 2 --max-num-se 8", nil, "vllm serve m --api 4 --api-server-c 2 --max-num-se 8"},
	// Every value of a flag that takes several (issue 41): vLLM reads
	// --api-key k1 k2 as two keys; a rendered argv list is an argv.
	{"vllm serve m --api-key firstkey1 secondkey2 --port 8000", []string{"firstkey1", "secondkey2"}, "vllm serve m --api-key *** *** --port 8000"},
	{"['vllm', 'serve', '--api-key', 'firstkey1', 'secondkey2', '--port', '8000']", []string{"firstkey1", "secondkey2"},
		"['vllm', 'serve', '--api-key', '***', '***', '--port', '8000']"},
	{`["notify", "--token", "tok1value", "tok2value"]`, []string{"tok1value", "tok2value"}, `["notify", "--token", "***", "***"]`},
	// A flag of vLLM's that takes one value: the next word is the model.
	{"vllm serve --hf-token hftokvalue org/model --port 8000", []string{"hftokvalue"}, "vllm serve --hf-token *** org/model --port 8000"},
	// Keys by their shape, whatever their name.
	{"MY_CREDS=Zx9pQ7rT2mVb8LkW4nHs6YdC3fJa1GeU", []string{"Zx9pQ7rT2mVb8LkW4nHs6YdC3fJa1GeU"}, "MY_CREDS=***"},
	{"creds: 'q8Rt5ZmW2xKp9LvN3bYh7JcF' ok", []string{"q8Rt5ZmW2xKp9LvN3bYh7JcF"}, "creds: '***' ok"},
	{"base64 kR4+/nZ8wQ2xLm9PvB7yTc3HdF6gJs1A== end", []string{"kR4+/nZ8wQ2xLm9PvB7yTc3HdF6gJs1A"}, "base64 ***== end"},
	{"hex 3f9a0c7e5b1d2f4a6c8e0b9d7f5a3c1e2d4f6a8c0e9b7d5f3a1c2e4f6a8b0c9d here",
		[]string{"3f9a0c7e5b1d2f4a6c8e0b9d7f5a3c1e2d4f6a8c0e9b7d5f3a1c2e4f6a8b0c9d"}, "hex *** here"},
	{"jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl", []string{"eyJzdWIiOiJhbGljZSJ9", "c2lnbmF0dXJl"}, "jwt ***"},
	{"gh ghp_abcdefghijklmnopqrstuvwxyz0123456789 aws AKIAIOSFODNN7EXAMPLE", []string{"ghp_abcdefghij", "AKIAIOSFODNN7EXAMPLE"}, "gh *** aws ***"},
	{"openai sk-proj-abcdefghijklmnop1234", []string{"sk-proj-abcdefghijklmnop1234"}, "openai ***"},
	// Not secrets: left alone.
	{"Added request chatcmpl-3f2a9c0e8b7d4e1f9a6b5c4d3e2f1a0b. Resolved architecture: Qwen2_5_VLForConditionalGeneration", nil,
		"Added request chatcmpl-3f2a9c0e8b7d4e1f9a6b5c4d3e2f1a0b. Resolved architecture: Qwen2_5_VLForConditionalGeneration"},
	{"loading /root/.cache/huggingface/hub/models--meta-llama--Meta-Llama-3-8B-Instruct/snapshots/0e9e39f249a16976918f6564b8830bc894c89659", nil,
		"loading /root/.cache/huggingface/hub/models--meta-llama--Meta-Llama-3-8B-Instruct/snapshots/0e9e39f249a16976918f6564b8830bc894c89659"},
	{"model deepseek-ai/DeepSeek-R1-Distill-Qwen-32B and RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", nil,
		"model deepseek-ai/DeepSeek-R1-Distill-Qwen-32B and RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"},
	{"max_tokens=16 tokenizer=gpt2 --tokenizer-mode auto --max-num-seqs 8 key cache 4.5 GiB", nil,
		"max_tokens=16 tokenizer=gpt2 --tokenizer-mode auto --max-num-seqs 8 key cache 4.5 GiB"},
	{"Maximum concurrency for 4096 tokens per request: 12.5x", nil, "Maximum concurrency for 4096 tokens per request: 12.5x"},
}

func TestString(t *testing.T) {
	for _, c := range cases {
		got := String(c.in)
		for _, s := range c.secrets {
			if strings.Contains(got, s) {
				t.Errorf("String(%q) = %q: %q survived", c.in, got, s)
			}
		}
		if c.want != "" && got != c.want {
			t.Errorf("String(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
		if again := String(got); again != got {
			t.Errorf("not idempotent: %q → %q → %q", c.in, got, again)
		}
	}
}

// vLLM's stats lines (many a second) never reach the regular expressions.
func TestStatsLinesAreCheap(t *testing.T) {
	line := "(APIServer pid=7) INFO 12-02 09:31:24 [loggers.py:123] Engine 000: Avg prompt throughput: 1234.5 tokens/s, Avg generation throughput: 99.0 tokens/s, Running: 12 reqs, GPU KV cache usage: 41.2%"
	if mayHoldSecret(line) {
		t.Errorf("a stats line goes through the regular expressions: %q", line)
	}
	if allocs := testing.AllocsPerRun(100, func() { String(line) }); allocs != 0 {
		t.Errorf("String allocates %.0f times on a stats line", allocs)
	}
}

func TestArgs(t *testing.T) {
	in := []string{"vllm", "serve", "m", "--api-key", "sk-plain", "--hf-token=hf_x", "--port", "8000", "https://u:p@h/"}
	want := []string{"vllm", "serve", "m", "--api-key", Mask, "--hf-token=***", "--port", "8000", "https://***@h/"}
	if got := Args(in); !slices.Equal(got, want) {
		t.Errorf("Args:\n got %q\nwant %q", got, want)
	}
	in = []string{"vllm", "serve", "m", "--api-ke", "sk-plain", "--api_k", "k2", "--api", "x", "--hf-t=k3"}
	want = []string{"vllm", "serve", "m", "--api-ke", Mask, "--api_k", Mask, "--api", "x", "--hf-t=***"}
	if got := Args(in); !slices.Equal(got, want) {
		t.Errorf("Args:\n got %q\nwant %q", got, want)
	}
	// Every value of a secret flag (issue 41): --api-key takes several, an
	// unknown secret flag (an alert command's) is taken to; --hf-token
	// takes one, and the model may follow it.
	in = []string{"vllm", "serve", "--hf-token", "hfv", "org/m", "--api-key", "k1", "k2", "--port", "8000", "--api-key", "k3"}
	want = []string{"vllm", "serve", "--hf-token", Mask, "org/m", "--api-key", Mask, Mask, "--port", "8000", "--api-key", Mask}
	if got := Args(in); !slices.Equal(got, want) {
		t.Errorf("Args:\n got %q\nwant %q", got, want)
	}
	in = []string{"notify", "--token", "t1", "t2", "-v", "--password", "-", "p2"}
	want = []string{"notify", "--token", Mask, Mask, "-v", "--password", Mask, Mask}
	if got := Args(in); !slices.Equal(got, want) {
		t.Errorf("Args:\n got %q\nwant %q", got, want)
	}
	if !IsSecretFlag("--api-key") || !IsSecretFlag("--HF-TOKEN") || IsSecretFlag("--tokenizer") || IsSecretFlag("api_key") ||
		!IsSecretFlag("--api-ke") || IsSecretFlag("--api") || IsSecretFlag("--api-key=x") {
		t.Error("IsSecretFlag misjudges a flag")
	}
}

// FuzzString: never panics, is idempotent, and a secret seeded into one of
// the shapes above never survives, whatever surrounds it.
func FuzzString(f *testing.F) {
	for _, c := range cases {
		f.Add(c.in, "s3cretValue")
	}
	f.Add("", "abcdefgh")
	f.Add("\x00\xff'\"[]{}", "x9x9x9x9")
	shapes := []string{
		"%s --api-key SECRET %s", "%s --api-key=SECRET%s", "%s'api_key': 'SECRET'%s", `%s"api_key": "SECRET"%s`,
		"%s VLLM_API_KEY=SECRET %s", "%s HF_TOKEN=SECRET %s", "%s Authorization: Bearer SECRET %s",
		"%s https://user:SECRET@host/p %s", "%s --api-ke SECRET %s", "%s --api_k=SECRET%s", "%s'--hf-tok', 'SECRET'%s",
		"%s --api-key k1 SECRET %s", "%s'--api-key', 'k1', 'SECRET'%s", `%s["--token", "t1", "SECRET"]%s`,
	}
	f.Fuzz(func(t *testing.T, around, secret string) {
		out := String(around)
		if String(out) != out {
			t.Fatalf("not idempotent on %q: %q then %q", around, out, String(out))
		}
		// A secret the shapes can carry: a run of letters and digits, long
		// enough not to occur by chance in the mask or the shape itself.
		if len(secret) < 8 || strings.IndexFunc(secret, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		}) >= 0 {
			return
		}
		pre, post := around, around
		if i := len(around) / 2; i > 0 {
			pre, post = around[:i], around[i:]
		}
		for _, shape := range shapes {
			in := strings.Replace(strings.Replace(shape, "SECRET", secret, 1), "%s", pre, 1)
			in = strings.Replace(in, "%s", post, 1)
			if strings.Contains(pre+post, secret) {
				continue // the secret is also outside the shape: nothing says it is one there
			}
			if got := String(in); strings.Contains(got, secret) {
				t.Fatalf("secret %q survived in %q → %q", secret, in, got)
			}
		}
	})
}
