// Package weightcache owns the weight cache daemon's life: vLLM 0.32.0's
// `vllm preload`, which loads the weights once and holds them on the GPU
// so that a vLLM started with `--load-format ipc_cache` maps them over
// CUDA IPC instead of reading the disk (docs/standby-facts.md). It reads
// from vLLM's command line whether the daemon is wanted and derives its
// command (argv.go); it runs it as a process tree of its own under the
// keeper (internal/proctree), ready once its /health answers 200, starts
// it again only when it died, and stops it (daemon.go). The guard starts
// it before vLLM and stops it after; the supervisor waits for it before
// each launch of vLLM.
package weightcache

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// IPCFormat is the load format of an engine that maps the daemon's weights.
const IPCFormat = "ipc_cache"

// Wanted says whether the guard runs the daemon for vLLM's command line a,
// with [weights] cache: "daemon" always, "auto" when vLLM loads with
// --load-format ipc_cache, "off" never.
func Wanted(cache string, a *vllmargs.Args) bool {
	switch cache {
	case "daemon":
		return true
	case "off":
		return false
	}
	return a.LoadFormat == IPCFormat
}

// EngineArgs are the arguments the guard adds to vLLM's for the daemon to
// be used: --load-format ipc_cache when cache = "daemon" and vLLM's command
// line does not load that way already.
func EngineArgs(cache string, a *vllmargs.Args) []string {
	if cache == "daemon" && a.LoadFormat != IPCFormat {
		return []string{"--load-format", IPCFormat}
	}
	return nil
}

// Command is what the guard runs for [weights] cache over vLLM's command
// line a: the daemon's command without its health flags (nil: no daemon)
// and the arguments added to vLLM's (EngineArgs).
func Command(cache string, a *vllmargs.Args) (preload, add []string, err error) {
	if !Wanted(cache, a) {
		return nil, nil, nil
	}
	preload, err = PreloadArgv(a) // --load-format is not the daemon's: adding it changes nothing here
	if err != nil {
		return nil, nil, err
	}
	return preload, EngineArgs(cache, a), nil
}

// weightFlags are vLLM's engine flags that decide which weights a rank
// holds (the daemon's fingerprint, WeightCacheKey: the checkpoint, its
// revision, the parallel sizes, dtype, quantization, the draft model) or
// how they are found and read: the daemon gets them as vLLM does, so that
// its weights match the engine's. Flags that take no value are marked.
var weightFlags = []struct {
	name    string
	noValue bool
}{
	{"--tensor-parallel-size", false}, {"--pipeline-parallel-size", false}, {"--data-parallel-size", false},
	{"--dtype", false}, {"--quantization", false}, {"--revision", false}, {"--code-revision", false},
	{"--max-model-len", false}, {"--trust-remote-code", true}, {"--download-dir", false},
	{"--hf-overrides", false}, {"--speculative-config", false}, {"--hf-token", false},
}

// PreloadArgv is the daemon's command for vLLM's command line a, without
// its health flags (Daemon adds them at each start): the same program with
// `preload` in place of `serve`, --model, and the flags that shape the
// weights. The socket folder follows the engine's
// --model-loader-extra-config socket_dir.
func PreloadArgv(a *vllmargs.Args) ([]string, error) {
	argv, err := preloadLauncher(a.Launcher)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(a.Model) == "" {
		return nil, fmt.Errorf("vLLM's command names no model: the weight cache daemon needs one (write the model after serve)")
	}
	argv = append(argv, "--model", a.Model)
	for _, f := range weightFlags {
		vals, given := a.Value(f.name)
		switch {
		case !given:
		case f.noValue:
			argv = append(argv, f.name)
		case len(vals) > 0:
			argv = append(argv, f.name, vals[0])
		}
	}
	lc, err := LoaderConfig(a)
	if err != nil {
		return nil, err
	}
	if lc.SocketDir != "" {
		argv = append(argv, "--weight-cache-socket-dir", lc.SocketDir)
	}
	return argv, nil
}

// preloadLauncher is the program that runs `vllm preload`, from the one
// that runs vLLM's server: `… serve` → `… preload`; `python -m
// vllm.entrypoints.openai.api_server` → `python -m vllm.entrypoints.cli.main
// preload` (preload is a subcommand of vLLM's CLI).
func preloadLauncher(l []string) ([]string, error) {
	if n := len(l); n > 0 && l[n-1] == "serve" {
		return append(append([]string(nil), l[:n-1]...), "preload"), nil
	}
	for i, x := range l {
		if x == "-m" && i+1 < len(l) {
			return append(append([]string(nil), l[:i+1]...), "vllm.entrypoints.cli.main", "preload"), nil
		}
	}
	return nil, fmt.Errorf("cannot tell how to run `vllm preload` from vLLM's command %q: write it as [\"vllm\", \"serve\", MODEL, …] (or python -m …), or set [weights] cache = \"off\" and run the daemon yourself",
		strings.Join(l, " "))
}

// Loader is what the guard reads of the engine's
// --model-loader-extra-config for ipc_cache (ipc_loader.py's options).
type Loader struct {
	SocketDir string // socket_dir: the daemon's socket folder ("" default)
	Mode      string // "zero_copy" (vLLM's default) or "copy"
	Fallback  bool   // fallback: a missing daemon is a disk load (default true)
}

// LoaderConfig reads --model-loader-extra-config as the ipc_cache loader
// does, refusing what defeats the daemon: a socket_path (the daemon names
// its socket after the GPU; give socket_dir) and copy mode (the daemon
// releases its copy after the first load, so a restart reads the disk).
func LoaderConfig(a *vllmargs.Args) (Loader, error) {
	vals, _ := a.Value("--model-loader-extra-config")
	raw := ""
	if len(vals) > 0 {
		raw = vals[0]
	}
	return ParseLoader(raw)
}

// ParseLoader reads the JSON of --model-loader-extra-config ("" or absent:
// the defaults).
func ParseLoader(raw string) (Loader, error) {
	l := Loader{Mode: "zero_copy", Fallback: true}
	if strings.TrimSpace(raw) == "" {
		return l, nil
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return l, fmt.Errorf("vLLM's --model-loader-extra-config is not a JSON object (%v): write one such as '{\"socket_dir\": \"/run/vllm-weights\"}'", err)
	}
	if v, ok := cfg["socket_path"]; ok {
		return l, fmt.Errorf("vLLM's --model-loader-extra-config sets socket_path %s: the weight cache daemon names its socket after the GPU; set socket_dir instead", quote(v))
	}
	if v, ok := cfg["socket_dir"]; ok {
		s, isStr := v.(string)
		if !isStr || s == "" || !filepath.IsAbs(s) {
			return l, fmt.Errorf("vLLM's --model-loader-extra-config socket_dir %s is not an absolute folder name: write one such as \"/run/vllm-weights\"", quote(v))
		}
		l.SocketDir = filepath.Clean(s)
	}
	if v, ok := cfg["mode"]; ok {
		l.Mode, _ = v.(string)
		if l.Mode != "zero_copy" && l.Mode != "copy" {
			return l, fmt.Errorf("vLLM's --model-loader-extra-config mode %s is not \"zero_copy\" or \"copy\"", quote(v))
		}
	}
	if l.Mode == "copy" {
		return l, fmt.Errorf("vLLM's --model-loader-extra-config mode \"copy\" releases the daemon's weights after the first load, so a restart reads the disk: use \"zero_copy\" (vLLM's default) or set [weights] cache = \"off\"")
	}
	if v, ok := cfg["fallback"]; ok {
		b, isBool := v.(bool)
		l.Fallback = !isBool || b
	}
	return l, nil
}

func quote(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return strconv.Quote(fmt.Sprint(v))
	}
	return string(b)
}
