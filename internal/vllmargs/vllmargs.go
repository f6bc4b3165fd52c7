// Package vllmargs owns reading vLLM's effective command line: the guard's
// [vllm] command, the extra arguments after `--`, a `--config file.yaml`
// (read relative to [vllm] workdir, its keys inserted right after the model
// so that command-line flags override them), and the environment vLLM will
// see. It answers what the guard must know of that command line — the
// served names, the API keys, the task or runner, the KV cache size in
// bytes, the shutdown timeout, the tensor-parallel size — and renders it
// with every secret masked. It reads the way vLLM's FlexibleArgumentParser
// does: `--flag=value` and `--flag value`, underscores in flag names taken
// as dashes, unambiguous abbreviations (ResolveFlag), a repeated flag's
// last value wins, the positional model anywhere after `serve`, the
// deprecated `--model`.
package vllmargs

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Mask replaces a secret wherever the guard shows vLLM's command line.
const Mask = "***"

// Args is what the guard reads from vLLM's effective command line.
type Args struct {
	// Argv is the command line as the guard will run it (command, then the
	// extra arguments), before the guard's own profile flags are added.
	Argv []string
	// ConfigFile is the --config YAML file as vLLM will open it ("" for none).
	ConfigFile string
	// Model is the positional model (or --model, or the YAML's model).
	Model string
	// ServedNames is every --served-model-name, else [Model].
	ServedNames []string
	// APIKeys are the keys vLLM accepts: every --api-key value, else
	// VLLM_API_KEY from its environment. Empty: no key is required.
	APIKeys []string
	// Task, Runner and Convert are --task (older vLLM only), --runner and
	// --convert as given ("" when not).
	Task, Runner, Convert string
	// KVCacheMemoryBytes is --kv-cache-memory-bytes (0 when not given).
	KVCacheMemoryBytes uint64
	// ShutdownTimeout is --shutdown-timeout (0 when not given).
	ShutdownTimeout time.Duration
	// TensorParallelSize is --tensor-parallel-size or -tp (1 when not given).
	TensorParallelSize int
	// Host and Port are --host and --port when given anywhere ("", 0 when not).
	Host string
	Port int
	// Launcher is what runs vLLM before its options: [vllm serve], or
	// [python -m vllm.entrypoints.openai.api_server].
	Launcher []string
	// LoadFormat is --load-format ("" when not given).
	LoadFormat string

	secrets []string
	last    map[string]opt // every flag's last occurrence, the --config file's keys first (Value, GroupFlags)
}

// Value is the last value(s) given for flag (its canonical spelling, such
// as "--dtype"), from the command line or the --config file; given is
// false when it never was. A flag that takes no value has none.
func (a *Args) Value(flag string) (values []string, given bool) {
	o, ok := a.last[flag]
	if !ok {
		return nil, false
	}
	return append([]string(nil), o.values...), true
}

// Env looks up a variable of the environment vLLM will see.
type Env func(name string) (string, bool)

// EnvOf is the environment vLLM sees: over, then base (the guard's own).
func EnvOf(over map[string]string, base func(string) (string, bool)) Env {
	return func(k string) (string, bool) {
		if v, ok := over[k]; ok {
			return v, true
		}
		if base == nil {
			return "", false
		}
		return base(k)
	}
}

// OSEnv is the guard's own environment.
func OSEnv(k string) (string, bool) { return os.LookupEnv(k) }

// Error is a command line or --config file vLLM would refuse, or the guard
// cannot read.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func errorf(format string, a ...any) error { return &Error{Msg: fmt.Sprintf(format, a...)} }

// boolFlags are vLLM's flags that take no value (argparse store_true, and
// the --no-X of BooleanOptionalAction, handled by prefix). Every other flag
// takes one value, or several for multiFlags.
var boolFlags = map[string]bool{
	"--enforce-eager": true, "--trust-remote-code": true, "--disable-log-stats": true,
	"--disable-log-requests": true, "--enable-log-requests": true, "--enable-prefix-caching": true,
	"--enable-chunked-prefill": true, "--disable-uvicorn-access-log": true, "--enable-auto-tool-choice": true,
	"--disable-frontend-multiprocessing": true, "--enable-lora": true, "--disable-custom-all-reduce": true,
	"--enable-sleep-mode": true, "--headless": true, "--enable-expert-parallel": true,
	"--skip-tokenizer-init": true, "--disable-sliding-window": true, "--enable-prompt-tokens-details": true,
	"--enable-server-load-tracking": true, "--enable-force-include-usage": true, "--disable-fastapi-docs": true,
	"--enable-request-id-headers": true, "--disable-cascade-attn": true, "--enable-prompt-embeds": true,
	"--enable-log-outputs": true, "--enable-tokenizer-info-endpoint": true, "--use-tqdm-on-load": true,
	"--disable-async-output-proc": true, "--enable-lora-bias": true, "--fully-sharded-loras": true,
	"--ray-workers-use-nsight": true, "--disable-mm-preprocessor-cache": true, "--enable-eplb": true,
	"--enable-dbo": true, "--async-scheduling": true, "--enable-mfu-metrics": true,
	"--help": true, "-h": true, "--version": true,
}

// multiFlags take one or more values (vLLM's list fields, nargs="+").
var multiFlags = map[string]bool{
	"--api-key": true, "--served-model-name": true, "--allowed-origins": true, "--allowed-methods": true,
	"--allowed-headers": true, "--middleware": true, "--lora-modules": true, "--prompt-adapters": true,
}

// secretFlags carry secrets: their values are masked.
var secretFlags = map[string]bool{"--api-key": true, "--ssl-keyfile-password": true, "--hf-token": true}

// secretEnv are the variables of vLLM's environment whose values are masked.
var secretEnv = []string{"VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}

// SecretEnvName says whether an environment variable's value is a secret
// to mask where the guard shows [vllm] env: the variables above, and any
// whose name says it holds a key, token, secret, password, credentials or
// authentication (a value shaped like a key is masked whatever its name:
// internal/redact).
func SecretEnvName(name string) bool {
	u := strings.ToUpper(name)
	for _, s := range secretEnv {
		if u == s {
			return true
		}
	}
	for _, w := range []string{"KEY", "TOKEN", "SECRET", "PASS", "CRED", "AUTH"} {
		if strings.Contains(u, w) {
			return true
		}
	}
	return false
}

// shortFlags are the single-dash aliases the guard must understand.
var shortFlags = map[string]string{"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size", "-q": "--quantization",
	// vLLM 0.32.0's multi-node aliases (arg_utils.py): the group's flags.
	"-n": "--nnodes", "-r": "--node-rank", "-dpl": "--data-parallel-size-local", "-dpr": "--data-parallel-start-rank",
	"-dpa": "--data-parallel-address", "-dpp": "--data-parallel-rpc-port"}

// normName turns a flag name into vLLM's canonical spelling: underscores in
// the name are dashes, short aliases are their long names.
func normName(name string) string {
	if long, ok := shortFlags[name]; ok {
		return long
	}
	if strings.HasPrefix(name, "--") {
		return "--" + strings.ReplaceAll(name[2:], "_", "-")
	}
	return name
}

func isFlag(a string) bool {
	if !strings.HasPrefix(a, "-") || a == "-" {
		return false
	}
	// A negative number is a value, not a flag.
	if _, err := strconv.ParseFloat(a, 64); err == nil {
		return false
	}
	return true
}

func takesNoValue(name string) bool { return boolFlags[name] || strings.HasPrefix(name, "--no-") }

// opt is one flag of the command line with its values.
type opt struct {
	name   string // canonical
	values []string
	inline bool // written --flag=value
	abbrev bool // written as an abbreviation of name
}

// scan splits args (the part after the program, or after `serve`) into
// options and positionals.
func scan(args []string) (opts []opt, positional []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !isFlag(a) {
			positional = append(positional, a)
			continue
		}
		written, val, inline := strings.Cut(a, "=")
		name, _ := ResolveFlag(written)
		abbrev := name != normName(written)
		if inline {
			opts = append(opts, opt{name, []string{val}, true, abbrev})
			continue
		}
		if takesNoValue(name) {
			opts = append(opts, opt{name, nil, false, abbrev})
			continue
		}
		var vals []string
		for i+1 < len(args) && !isFlag(args[i+1]) {
			vals = append(vals, args[i+1])
			i++
			if !multiFlags[name] {
				break
			}
		}
		opts = append(opts, opt{name, vals, false, abbrev})
	}
	return opts, positional
}

// serveAt is the index of "serve" in argv, or -1 (an api_server module
// invocation has no subcommand: everything after the program is options).
func serveAt(argv []string) int {
	for i, a := range argv {
		if a == "serve" {
			return i
		}
	}
	return -1
}

// Parse reads the effective command line: command then extra, the --config
// file it names (relative to workdir), and env (the environment vLLM sees).
func Parse(command, extra []string, workdir string, env Env) (*Args, error) {
	argv := append(append([]string(nil), command...), extra...)
	a := &Args{Argv: argv, TensorParallelSize: 1}
	start := serveAt(argv) + 1
	if start == 0 {
		start = min(1, len(argv))
		// `python -m vllm.entrypoints.openai.api_server`: options start after the module.
		for i, x := range argv {
			if x == "-m" && i+1 < len(argv) {
				start = i + 2
				break
			}
		}
	}
	a.Launcher = append([]string(nil), argv[:start]...)
	opts, pos := scan(argv[start:])
	if len(pos) > 0 {
		a.Model = pos[0]
	}

	// The --config file's keys come first, so the command line overrides
	// them. vLLM expands only "--config PATH": "--config=PATH" or an
	// abbreviation reaches its parser as a plain option and the file is
	// never read.
	var all []opt
	for _, o := range opts {
		if o.name != "--config" || o.inline || o.abbrev {
			continue
		}
		if len(o.values) == 0 || o.values[0] == "" {
			return nil, errorf("vLLM's --config has no file name; write --config FILE.yaml or remove it")
		}
		path := o.values[0]
		if ext := strings.ToLower(filepath.Ext(path)); ext != ".yaml" && ext != ".yml" {
			return nil, errorf("vLLM's --config file %s is not a .yaml or .yml file; vLLM refuses any other (\"Config file must be of a yaml/yml type\"): rename it", path)
		}
		if !filepath.IsAbs(path) && workdir != "" {
			path = filepath.Join(workdir, path)
		}
		a.ConfigFile = path
		data, err := readCapped(path)
		if err != nil {
			return nil, errorf("vLLM's --config file %s cannot be read (%v); it is read relative to [vllm] workdir: fix the path", path, err)
		}
		entries, err := parseYAML(data)
		if err != nil {
			return nil, errorf("vLLM's --config file %s: %v", path, err)
		}
		for _, e := range entries {
			name, _ := ResolveFlag("--" + e.key)
			if name == "--model" && a.Model == "" && len(e.values) > 0 {
				a.Model = e.values[0]
				continue
			}
			all = append(all, opt{name: name, values: e.values})
		}
	}
	all = append(all, opts...)

	last := map[string]opt{}
	for _, o := range all {
		last[o.name] = o
	}
	a.last = last
	first := func(name string) (string, bool) {
		o, ok := last[name]
		if !ok || len(o.values) == 0 {
			return "", false
		}
		return o.values[0], true
	}
	if m, ok := first("--model"); ok && a.Model == "" {
		a.Model = m
	}
	if o, ok := last["--served-model-name"]; ok {
		a.ServedNames = append([]string(nil), o.values...)
	}
	if len(a.ServedNames) == 0 && a.Model != "" {
		a.ServedNames = []string{a.Model}
	}
	if o, ok := last["--api-key"]; ok {
		for _, k := range o.values {
			if k != "" {
				a.APIKeys = append(a.APIKeys, k)
			}
		}
	}
	if len(a.APIKeys) == 0 && env != nil {
		if k, ok := env("VLLM_API_KEY"); ok && k != "" {
			a.APIKeys = []string{k}
		}
	}
	// Every value that vLLM takes as a secret is masked, the overridden ones too.
	for _, o := range all {
		if secretFlags[o.name] {
			a.secrets = append(a.secrets, o.values...)
		}
	}
	if env != nil {
		for _, k := range secretEnv {
			if v, ok := env(k); ok && v != "" {
				a.secrets = append(a.secrets, v)
			}
		}
	}
	// --task is gone from vllm serve (vLLM refuses it); it is still read so
	// that `check` can say so, and for older vLLM run directly.
	a.Task, _ = first("--task")
	a.Convert, _ = first("--convert")
	a.Runner, _ = first("--runner")
	a.Host, _ = first("--host")
	a.LoadFormat, _ = first("--load-format")
	if v, ok := first("--port"); ok {
		p, err := strconv.Atoi(v)
		if err != nil || p < 0 || p > 65535 {
			return nil, errorf("vLLM's --port %q is not a port number; write one from 1 to 65535", v)
		}
		a.Port = p
	}
	if v, ok := first("--kv-cache-memory-bytes"); ok {
		n, err := HumanInt(v)
		if err != nil || n <= 0 {
			return nil, errorf("vLLM's --kv-cache-memory-bytes %q is not a size; write bytes such as 21474836480, 20G (GiB) or 21.5g (10^9)", v)
		}
		a.KVCacheMemoryBytes = uint64(n)
	}
	if v, ok := first("--shutdown-timeout"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, errorf("vLLM's --shutdown-timeout %q is not a whole number of seconds; write one such as 30", v)
		}
		a.ShutdownTimeout = time.Duration(n) * time.Second
	}
	if v, ok := first("--tensor-parallel-size"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, errorf("vLLM's --tensor-parallel-size %q is not a positive whole number", v)
		}
		a.TensorParallelSize = n
	}
	return a, nil
}

// readCapped reads a --config file up to maxConfigBytes (and one more, so
// that parseYAML says it is too large).
func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
}

var humanRe = regexp.MustCompile(`^(\d+(?:\.\d+)?)([kKmMgGtT])$`)

// HumanInt reads a number the way vLLM's human_readable_int does: a plain
// integer, or a number with a suffix: k, m, g, t are powers of 1000 (and
// allow decimals: 25.6k = 25600), K, M, G, T powers of 1024 (whole
// numbers only: 2G = 2 GiB).
func HumanInt(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if m := humanRe.FindStringSubmatch(s); m != nil {
		num, suf := m[1], m[2]
		exp := strings.IndexByte("kmgt", strings.ToLower(suf)[0]) + 1
		if suf == strings.ToLower(suf) {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return 0, err
			}
			v := f * math.Pow(1000, float64(exp))
			if v >= math.MaxInt64 {
				return 0, fmt.Errorf("%s is too large", s)
			}
			return int64(v), nil
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("decimals are not allowed with binary suffixes like %s", suf)
		}
		shift := uint(10 * exp)
		if n > math.MaxInt64>>shift {
			return 0, fmt.Errorf("%s is too large", s)
		}
		return n << shift, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// Secrets are the values to mask wherever vLLM's command line or output
// is shown: every API key and other secret flag's value, and the secret
// variables of vLLM's environment.
func (a *Args) Secrets() []string { return append([]string(nil), a.secrets...) }

// Masked is argv with every secret replaced by ***.
func (a *Args) Masked(argv []string) []string { return MaskArgv(argv, a.secrets) }

// MaskArgv returns argv with the values of secret flags and every
// occurrence of secrets replaced by ***.
func MaskArgv(argv []string, secrets []string) []string {
	out := make([]string, len(argv))
	inSecret := false
	for i, x := range argv {
		if isFlag(x) {
			name, _, inline := strings.Cut(x, "=")
			name, _ = ResolveFlag(name)
			inSecret = secretFlags[name] && !inline
			if secretFlags[name] && inline {
				x = x[:strings.IndexByte(x, '=')+1] + Mask
			}
			out[i] = MaskText(x, secrets)
			continue
		}
		if inSecret {
			out[i] = Mask
			continue
		}
		out[i] = MaskText(x, secrets)
	}
	return out
}

// MaskText replaces every occurrence of each secret in s by ***.
func MaskText(s string, secrets []string) string {
	for _, k := range secrets {
		if k != "" && strings.Contains(s, k) {
			s = strings.ReplaceAll(s, k, Mask)
		}
	}
	return s
}

// Pooling says whether a task or runner names a pooling model (no
// completions; vLLM serves its pooling endpoints instead): the runner
// "pooling", today's pooling tasks (embed, classify, token_embed,
// token_classify, plugin) and older names (embedding, score, reward,
// encode).
func Pooling(taskOrRunner string) bool {
	switch taskOrRunner {
	case "pooling", "embed", "classify", "token_embed", "token_classify", "plugin",
		"embedding", "score", "reward", "encode":
		return true
	}
	return false
}
