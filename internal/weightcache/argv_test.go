package weightcache

import (
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func parse(t testing.TB, command ...string) *vllmargs.Args {
	t.Helper()
	a, err := vllmargs.Parse(command, nil, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The daemon's command is derived from vLLM's: the same program with
// preload in place of serve, --model, and the flags that shape the
// weights, as vLLM reads them (abbreviations, underscores, the last one
// of a repeated flag, -tp); nothing else of vLLM's (its port, its keys,
// its profile, the engine's ipc_cache).
func TestPreloadArgv(t *testing.T) {
	cases := []struct {
		name    string
		command []string
		want    string
	}{
		{"serve", []string{"vllm", "serve", "meta-llama/Llama-3.1-70B", "--load-format", "ipc_cache", "--tensor-parallel-size", "4", "--port", "9000", "--api-key", "k"},
			"vllm preload --model meta-llama/Llama-3.1-70B --tensor-parallel-size 4"},
		{"spellings vLLM reads", []string{"/opt/venv/bin/vllm", "serve", "m", "-tp", "2", "--tensor_parallel_size=8", "--dtyp", "bfloat16", "--trust-remote-code", "--max-model-len=4096", "--enforce-eager"},
			"/opt/venv/bin/vllm preload --model m --tensor-parallel-size 8 --dtype bfloat16 --max-model-len 4096 --trust-remote-code"},
		{"the weights' identity", []string{"vllm", "serve", "m", "--quantization", "fp8", "--revision", "abc", "--pipeline-parallel-size", "2", "--data-parallel-size", "2", "--download-dir", "/models", "--speculative-config", `{"method":"eagle"}`},
			`vllm preload --model m --pipeline-parallel-size 2 --data-parallel-size 2 --quantization fp8 --revision abc --download-dir /models --speculative-config {"method":"eagle"}`},
		{"--model", []string{"vllm", "serve", "--model", "m2"}, "vllm preload --model m2"},
		{"a module", []string{"python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "-tp", "2"},
			"python3 -m vllm.entrypoints.cli.main preload --model m --tensor-parallel-size 2"},
		{"the socket folder", []string{"vllm", "serve", "m", "--model-loader-extra-config", `{"socket_dir": "/run/w/"}`},
			"vllm preload --model m --weight-cache-socket-dir /run/w"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// "-tp 2" then "--tensor_parallel_size=8": the last one wins.
			got, err := PreloadArgv(parse(t, c.command...))
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.Join(got, " "); s != c.want {
				t.Fatalf("\n got %s\nwant %s", s, c.want)
			}
		})
	}
}

func TestPreloadArgvRefusals(t *testing.T) {
	for _, c := range []struct {
		command []string
		says    string
	}{
		{[]string{"vllm", "serve"}, "names no model"},
		{[]string{"./start-vllm.sh", "m"}, "cannot tell how to run `vllm preload`"},
		{[]string{"vllm", "serve", "m", "--model-loader-extra-config", `{"socket_path": "/tmp/x.sock"}`}, "set socket_dir instead"},
		{[]string{"vllm", "serve", "m", "--model-loader-extra-config", `{"mode": "copy"}`}, "use \"zero_copy\""},
		{[]string{"vllm", "serve", "m", "--model-loader-extra-config", `{"socket_dir": "rel"}`}, "not an absolute folder"},
		{[]string{"vllm", "serve", "m", "--model-loader-extra-config", `[1`}, "not a JSON object"},
	} {
		_, err := PreloadArgv(parse(t, c.command...))
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: error %v, want one saying %q", c.command, err, c.says)
		}
	}
}

// [weights] cache: auto follows vLLM's command; daemon adds the flag
// (once); off never runs one.
func TestWantedAndEngineArgs(t *testing.T) {
	plain, ipc := parse(t, "vllm", "serve", "m"), parse(t, "vllm", "serve", "m", "--load-format=ipc_cache")
	for _, c := range []struct {
		cache  string
		a      *vllmargs.Args
		wanted bool
		add    string
	}{
		{"auto", plain, false, ""}, {"auto", ipc, true, ""},
		{"daemon", plain, true, "--load-format ipc_cache"}, {"daemon", ipc, true, ""},
		{"off", ipc, false, ""},
	} {
		if got := Wanted(c.cache, c.a); got != c.wanted {
			t.Errorf("cache %q, load format %q: wanted %v", c.cache, c.a.LoadFormat, got)
		}
		if got := strings.Join(EngineArgs(c.cache, c.a), " "); got != c.add {
			t.Errorf("cache %q, load format %q: adds %q, want %q", c.cache, c.a.LoadFormat, got, c.add)
		}
	}
}

// ParseLoader never panics; what it accepts is a clean absolute socket
// folder and zero-copy mode.
func FuzzParseLoader(f *testing.F) {
	for _, s := range []string{"", `{}`, `{"socket_dir": "/run/w"}`, `{"mode": "copy"}`, `{"fallback": false}`,
		`{"socket_path": 1}`, `{"mode": 3}`, `[`, `null`, `{"socket_dir": ["x"]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		l, err := ParseLoader(raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if l.Mode != "zero_copy" || (l.SocketDir != "" && !strings.HasPrefix(l.SocketDir, "/")) {
			t.Fatalf("accepted %q as %+v", raw, l)
		}
	})
}
