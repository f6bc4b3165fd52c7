package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// serveArgs is the part of `vllm serve`'s command line the simulator
// understands. set records which flags were given, for the
// `non-default args` line.
type serveArgs struct {
	Model               string
	Host                string
	Port                int
	GPUMemUtil          float64
	MaxNumSeqs          int
	MaxModelLen         int
	MaxModelLenAuto     bool // --max-model-len auto (or -1): fit to memory
	ServedName          string
	ServedNames         []string
	EnforceEager        bool
	MaxNumBatchedTokens int
	KVCacheMemoryBytes  int64
	APIKeys             []string // --api-key (nargs +); VLLM_API_KEY is read by the API process
	Task                string   // --task as given ("" = auto); older eras only
	Runner              string   // --runner as given ("" = auto)
	Convert             string   // --convert as given ("" = auto)
	TensorParallel      int
	ShutdownTimeout     float64
	DisableAccessLog    bool
	UvicornLogLevel     string
	DisableLogStats     bool
	StreamInterval      int  // --stream-interval: output ids per streamed chunk after the first
	EnableLogRequests   bool // --enable-log-requests: "Added request …" lines
	ConfigFile          string
	modelFlag           string

	// Standby (issue 42): sleep.go and preload.go read them.
	EnableSleepMode   bool   // --enable-sleep-mode
	LoadFormat        string // --load-format ("" = auto)
	LoaderExtraConfig string // --model-loader-extra-config, JSON as given

	// Multi-node (issue 44; headless.go): a follower serves no HTTP.
	Headless   bool
	NNodes     int
	NodeRank   int
	MasterAddr string

	// Warnings are vLLM's warnings about the command line (a repeated
	// flag, the deprecated --model), printed by the API process.
	Warnings []string

	set map[string]bool
}

// argError is an argparse-style usage error: exit 2 with the usage line.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// helpRequested is returned for -h/--help.
var errHelp = &argError{msg: "help"}

const usageText = `usage: vllm serve [-h] [--config CONFIG] [--host HOST] [--port PORT]
                  [--api-key API_KEY [API_KEY ...]]
                  [--gpu-memory-utilization GPU_MEMORY_UTILIZATION]
                  [--max-num-seqs MAX_NUM_SEQS] [--max-model-len MAX_MODEL_LEN]
                  [--served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]]
                  [--model MODEL] [--task TASK] [--runner RUNNER]
                  [--convert CONVERT]
                  [--tensor-parallel-size TENSOR_PARALLEL_SIZE]
                  [--enforce-eager]
                  [--max-num-batched-tokens MAX_NUM_BATCHED_TOKENS]
                  [--kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES]
                  [--shutdown-timeout SHUTDOWN_TIMEOUT]
                  [--disable-uvicorn-access-log]
                  [--uvicorn-log-level UVICORN_LOG_LEVEL]
                  [--disable-log-stats]
                  [--stream-interval STREAM_INTERVAL]
                  [--enable-sleep-mode] [--load-format LOAD_FORMAT]
                  [--model-loader-extra-config MODEL_LOADER_EXTRA_CONFIG]
                  [model_tag]
`

const helpText = `
Start the vLLM OpenAI Compatible API server (simulated by fakevllm).

positional arguments:
  model_tag             The model tag to serve

options:
  -h, --help            show this help message and exit
  --config CONFIG       Read CLI options from a YAML config file; command-line flags override it.
  --host HOST           Host name. (default: 0.0.0.0)
  --port PORT           Port number. (default: 8000)
  --api-key API_KEY [API_KEY ...]
                        If provided, the server will require one of these keys under /v1. (default: None)
  --gpu-memory-utilization GPU_MEMORY_UTILIZATION
                        The fraction of GPU memory to be used for the model executor. (default: 0.9)
  --max-num-seqs MAX_NUM_SEQS
                        Maximum number of sequences per iteration. (default: 256)
  --max-model-len MAX_MODEL_LEN
                        Model context length; 'auto' or -1 fits it to memory. Accepts 1k, 1K, 25.6k. (default: 4096)
  --served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]
                        The model name(s) used in the API. (default: model_tag)
  --model MODEL         Deprecated with vllm serve: give the model as model_tag.
  --task TASK           auto, generate, embed, classify, score, reward (older vLLM). (default: auto)
  --runner RUNNER       auto, generate, pooling. (default: auto)
  --convert CONVERT     auto, none, embed, classify: adapt the model to a pooling task. (default: auto)
  -tp, --tensor-parallel-size TENSOR_PARALLEL_SIZE
                        Number of tensor parallel groups. (default: 1)
  --enforce-eager       Always use eager-mode PyTorch. (default: False)
  --max-num-batched-tokens MAX_NUM_BATCHED_TOKENS
                        Maximum number of batched tokens per iteration. (default: None)
  --kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES
                        Size of KV Cache per GPU in bytes; overrides gpu_memory_utilization. Accepts 1k, 1K, 2G. (default: None)
  --shutdown-timeout SHUTDOWN_TIMEOUT
                        Seconds to drain in-flight requests on SIGTERM/SIGINT; 0 aborts them. (default: 0)
  --disable-uvicorn-access-log
                        Disable uvicorn access log. (default: False)
  --uvicorn-log-level UVICORN_LOG_LEVEL
                        Log level for uvicorn. (default: info)
  --disable-log-stats   Disable logging statistics. (default: False)
  --stream-interval STREAM_INTERVAL
                        Output tokens per streamed chunk after the first (the first and the last chunk go at once). (default: 1)
  --enable-sleep-mode   Enable sleep mode for the engine (only cuda and hip platforms are supported). (default: False)
  --load-format LOAD_FORMAT
                        The format of the model weights to load; "ipc_cache" maps them from a weight cache daemon (vllm preload). (default: auto)
  --model-loader-extra-config MODEL_LOADER_EXTRA_CONFIG
                        Extra config for the model loader, JSON (ipc_cache: socket_path, socket_dir, mode, fallback, connect_timeout_s, state_timeout_s). (default: {})
`

// flagKind says how a flag takes its value.
type flagKind int

const (
	kindString flagKind = iota
	kindInt
	kindHumanInt // vLLM's human_readable_int: 1k = 1000, 1K = 1024
	kindFloat
	kindBool
	kindList // nargs="+": one or more values up to the next flag
)

var knownFlags = map[string]flagKind{
	"--host":                       kindString,
	"--port":                       kindInt,
	"--gpu-memory-utilization":     kindFloat,
	"--max-num-seqs":               kindInt,
	"--max-model-len":              kindHumanInt,
	"--served-model-name":          kindList,
	"--enforce-eager":              kindBool,
	"--max-num-batched-tokens":     kindHumanInt,
	"--kv-cache-memory-bytes":      kindHumanInt,
	"--api-key":                    kindList,
	"--model":                      kindString,
	"--task":                       kindString,
	"--runner":                     kindString,
	"--convert":                    kindString,
	"--tensor-parallel-size":       kindInt,
	"--shutdown-timeout":           kindInt, // merged vLLM: an integer number of seconds
	"--disable-uvicorn-access-log": kindBool,
	"--uvicorn-log-level":          kindString,
	"--disable-log-stats":          kindBool,
	"--stream-interval":            kindInt,
	"--enable-log-requests":        kindBool,
	"--config":                     kindString,
	"--dtype":                      kindString, // accepted, not simulated (the tests serve real tiny models as float32)
	"--enable-sleep-mode":          kindBool,
	"--load-format":                kindString,
	"--model-loader-extra-config":  kindString,
	// Multi-node (issue 44): a follower runs --headless (headless.go).
	"--headless":                        kindBool,
	"--nnodes":                          kindInt,
	"--node-rank":                       kindInt,
	"--master-addr":                     kindString,
	"--master-port":                     kindInt,
	"--distributed-timeout-seconds":     kindInt,
	"--cpu-distributed-timeout-seconds": kindInt,
}

// shortFlags are argparse aliases.
var shortFlags = map[string]string{"-tp": "--tensor-parallel-size"}

var choices = map[string][]string{
	"--task":              {"auto", "generate", "embedding", "embed", "classify", "score", "reward"},
	"--runner":            {"auto", "generate", "pooling"},
	"--convert":           {"auto", "none", "embed", "classify"},
	"--uvicorn-log-level": {"critical", "error", "warning", "info", "debug", "trace"},
}

// normalizeFlag turns "--max_num_seqs" into "--max-num-seqs" (vLLM's
// FlexibleArgumentParser accepts underscores in flag names), an
// unambiguous abbreviation ("--api-ke") into its flag, as argparse's
// allow_abbrev does over all of vLLM's flags (vllmargs.ResolveFlag), and
// resolves short aliases. The value after '=' is kept as is.
func normalizeFlag(tok string) string {
	t := spellFlag(tok)
	name, value, has := strings.Cut(t, "=")
	if !strings.HasPrefix(name, "--") {
		return t
	}
	name, _ = vllmargs.ResolveFlag(name)
	if has {
		return name + "=" + value
	}
	return name
}

// ambiguous is argparse's refusal of an abbreviation that several of
// vLLM's flags share ("--api" could be --api-key or --api-server-count).
func ambiguous(tok string) error {
	name, _, _ := strings.Cut(spellFlag(tok), "=")
	if !strings.HasPrefix(name, "--") {
		return nil
	}
	if _, amb := vllmargs.ResolveFlag(name); len(amb) > 1 {
		return &argError{msg: fmt.Sprintf("ambiguous option: %s could match %s", tok, strings.Join(amb, ", "))}
	}
	return nil
}

// spellFlag is normalizeFlag without abbreviations: vLLM finds "--config"
// by its exact spelling before argparse sees the command line.
func spellFlag(tok string) string {
	if !strings.HasPrefix(tok, "--") {
		if long, ok := shortFlags[tok]; ok {
			return long
		}
		name, value, has := strings.Cut(tok, "=")
		if long, ok := shortFlags[name]; ok && has {
			return long + "=" + value
		}
		return tok
	}
	name, value, has := strings.Cut(tok, "=")
	name = strings.ReplaceAll(name, "_", "-")
	if has {
		return name + "=" + value
	}
	return name
}

// removedIn are flags an era's vllm serve no longer has: argparse treats
// them as unknown (merged vLLM dropped --task for --runner and --convert).
var removedIn = map[era]map[string]bool{eraV1Plain: {"--task": true}}

// parseServeArgsFor parses the arguments after `serve` the way era e's
// vLLM argparse parser does: `--flag value` and `--flag=value`, underscores
// as dashes, unambiguous abbreviations, `--config FILE` expanded right after
// the model, repeated flags last-wins (with a warning), every unknown token
// collected into one "unrecognized arguments" error.
func parseServeArgsFor(argv []string, e era) (*serveArgs, error) {
	a := &serveArgs{
		Host:           "0.0.0.0",
		Port:           8000,
		GPUMemUtil:     0.9,
		MaxNumSeqs:     256,
		MaxModelLen:    4096,
		TensorParallel: 1,
		StreamInterval: 1,
		set:            map[string]bool{},
	}
	// Repeated flags on the command line warn (last wins); a config key
	// overridden by a flag does not.
	seen := map[string]int{}
	for _, tok := range argv {
		if tok == "--" {
			break
		}
		if strings.HasPrefix(tok, "--") {
			name, _, _ := strings.Cut(normalizeFlag(tok), "=")
			if _, ok := knownFlags[name]; ok {
				seen[name]++
			}
		} else if long, ok := shortFlags[tok]; ok {
			seen[long]++
		}
	}
	argv, err := a.expandConfig(argv)
	if err != nil {
		return nil, err
	}
	var unknown []string
	positional := 0
	modelFromConfig := false
	for i := 0; i < len(argv); i++ {
		tok := argv[i]
		if tok == "-h" || tok == "--help" {
			return nil, errHelp
		}
		if tok == configModelMarker {
			modelFromConfig = true
			continue
		}
		if tok == "--" {
			// argparse: everything after -- is positional.
			for _, p := range argv[i+1:] {
				if positional == 0 {
					a.Model = p
				} else {
					unknown = append(unknown, p)
				}
				positional++
			}
			break
		}
		if !strings.HasPrefix(tok, "-") || tok == "-" || isNegativeNumber(tok) {
			if positional == 0 {
				a.Model = tok
			} else {
				unknown = append(unknown, tok)
			}
			positional++
			continue
		}
		if err := ambiguous(tok); err != nil {
			return nil, err
		}
		tok = normalizeFlag(tok)
		name, value, hasValue := strings.Cut(tok, "=")
		kind, ok := knownFlags[name]
		if !ok || removedIn[e][name] {
			unknown = append(unknown, argv[i])
			continue
		}
		switch kind {
		case kindBool:
			if hasValue {
				return nil, &argError{msg: fmt.Sprintf("argument %s: ignored explicit argument '%s'", name, value)}
			}
			a.setBool(name)
		case kindList:
			var vals []string
			if hasValue {
				vals = append(vals, value)
			}
			for i+1 < len(argv) && (!strings.HasPrefix(argv[i+1], "-") || isNegativeNumber(argv[i+1])) && argv[i+1] != configModelMarker {
				i++
				vals = append(vals, argv[i])
			}
			if len(vals) == 0 {
				return nil, &argError{msg: fmt.Sprintf("argument %s: expected at least one argument", name)}
			}
			a.setList(name, vals)
		default:
			if !hasValue {
				if i+1 >= len(argv) || (strings.HasPrefix(argv[i+1], "-") && !isNegativeNumber(argv[i+1])) {
					return nil, &argError{msg: fmt.Sprintf("argument %s: expected one argument", name)}
				}
				i++
				value = argv[i]
			}
			if err := a.setFlag(name, kind, value); err != nil {
				return nil, err
			}
		}
		a.set[name] = true
		if name == "--model" && !modelFromConfig {
			a.Warnings = append(a.Warnings, "With `vllm serve`, you should provide the model as a positional argument or in a config file instead of via the `--model` option. The `--model` option will be removed in a future version.")
		}
		modelFromConfig = false
	}
	if len(unknown) > 0 {
		return nil, &argError{msg: "unrecognized arguments: " + strings.Join(unknown, " ")}
	}
	var dups []string
	for _, f := range sortedKeys(seen) {
		if seen[f] > 1 {
			dups = append(dups, f)
		}
	}
	if len(dups) > 0 {
		a.Warnings = append(a.Warnings, "Found duplicate keys "+strings.Join(dups, ", ")+"; the last value of each is used")
	}
	// The positional model wins over --model (serve's cmd does so).
	if a.Model == "" {
		a.Model = a.modelFlag
	}
	if a.Model == "" {
		return nil, &argError{msg: "the following arguments are required: model_tag"}
	}
	if len(a.ServedNames) == 0 {
		a.ServedNames = []string{a.Model}
	}
	a.ServedName = a.ServedNames[0]
	return a, nil
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func (a *serveArgs) setBool(name string) {
	switch name {
	case "--enforce-eager":
		a.EnforceEager = true
	case "--disable-uvicorn-access-log":
		a.DisableAccessLog = true
	case "--disable-log-stats":
		a.DisableLogStats = true
	case "--enable-log-requests":
		a.EnableLogRequests = true
	case "--enable-sleep-mode":
		a.EnableSleepMode = true
	case "--headless":
		a.Headless = true
	}
}

func (a *serveArgs) setList(name string, vals []string) {
	switch name {
	case "--served-model-name":
		a.ServedNames = vals
	case "--api-key":
		a.APIKeys = vals
	}
}

func (a *serveArgs) setFlag(name string, kind flagKind, value string) error {
	if opts, ok := choices[name]; ok {
		found := false
		for _, o := range opts {
			found = found || o == value
		}
		if !found {
			quoted := make([]string, len(opts))
			for i, o := range opts {
				quoted[i] = "'" + o + "'"
			}
			return &argError{msg: fmt.Sprintf("argument %s: invalid choice: '%s' (choose from %s)", name, value, strings.Join(quoted, ", "))}
		}
	}
	switch kind {
	case kindInt, kindHumanInt:
		if name == "--max-model-len" {
			if v := strings.TrimSpace(value); v == "auto" || v == "-1" {
				a.MaxModelLenAuto = true
				return nil
			}
		}
		var n int64
		var err error
		if kind == kindHumanInt {
			n, err = humanReadableInt(value)
		} else {
			n, err = strconv.ParseInt(strings.TrimSpace(value), 10, 64)
			if err != nil {
				err = &argError{msg: fmt.Sprintf("argument %s: invalid int value: '%s'", name, value)}
			}
		}
		if err != nil {
			var ae *argError
			if errors.As(err, &ae) && strings.HasPrefix(ae.msg, "argument ") {
				return err
			}
			return &argError{msg: fmt.Sprintf("argument %s: %s", name, err.Error())}
		}
		switch name {
		case "--port":
			a.Port = int(n)
		case "--max-num-seqs":
			a.MaxNumSeqs = int(n)
		case "--max-model-len":
			a.MaxModelLen = int(n)
			a.MaxModelLenAuto = false
		case "--max-num-batched-tokens":
			a.MaxNumBatchedTokens = int(n)
		case "--kv-cache-memory-bytes":
			a.KVCacheMemoryBytes = n
		case "--tensor-parallel-size":
			a.TensorParallel = int(n)
		case "--shutdown-timeout":
			a.ShutdownTimeout = float64(n)
		case "--stream-interval":
			a.StreamInterval = int(n)
		case "--nnodes":
			a.NNodes = int(n)
		case "--node-rank":
			a.NodeRank = int(n)
		}
	case kindFloat:
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return &argError{msg: fmt.Sprintf("argument %s: invalid float value: '%s'", name, value)}
		}
		switch name {
		case "--gpu-memory-utilization":
			a.GPUMemUtil = f
		}
	case kindString:
		switch name {
		case "--host":
			a.Host = value
		case "--model":
			a.modelFlag = value
		case "--task":
			a.Task = value
		case "--runner":
			a.Runner = value
		case "--convert":
			a.Convert = value
		case "--uvicorn-log-level":
			a.UvicornLogLevel = value
		case "--dtype":
			if !slices.Contains([]string{"auto", "half", "float16", "bfloat16", "float", "float32"}, value) {
				return &argError{msg: fmt.Sprintf("argument --dtype: invalid choice: '%s' (choose from auto, half, float16, bfloat16, float, float32)", value)}
			}
		case "--master-addr":
			a.MasterAddr = value
		case "--load-format":
			a.LoadFormat = value
		case "--model-loader-extra-config":
			a.LoaderExtraConfig = value
		case "--config":
			// Expanded before parsing; only reached for a --config that
			// came out of a config file, which vLLM does not follow.
			a.ConfigFile = value
		}
	}
	return nil
}

// humanReadableInt is vLLM's human_readable_int: a plain integer, or a
// number with a suffix: lowercase k/m/g/t are decimal (25.6k = 25600),
// uppercase K/M/G/T binary (2G = 2 GiB) and take no decimals.
func humanReadableInt(value string) (int64, error) {
	v := strings.TrimSpace(value)
	if v != "" {
		suffix := v[len(v)-1]
		num := v[:len(v)-1]
		dec := map[byte]float64{'k': 1e3, 'm': 1e6, 'g': 1e9, 't': 1e12}
		bin := map[byte]int64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
		if validNumber(num) {
			if mul, ok := dec[suffix]; ok {
				f, err := strconv.ParseFloat(num, 64)
				if err == nil && f*mul < 1<<62 {
					return int64(f * mul), nil
				}
			}
			if mul, ok := bin[suffix]; ok {
				n, err := strconv.ParseInt(num, 10, 64)
				if err != nil {
					return 0, &argError{msg: fmt.Sprintf("Decimals are not allowed with binary suffixes like %c. Did you mean to use %s%c instead?", suffix, num, suffix+('a'-'A'))}
				}
				if n > (1<<62)/mul {
					return 0, &argError{msg: fmt.Sprintf("invalid human_readable_int value: '%s'", value)}
				}
				return n * mul, nil
			}
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, &argError{msg: fmt.Sprintf("invalid human_readable_int value: '%s'", value)}
	}
	return n, nil
}

// validNumber matches \d+(\.\d+)?.
func validNumber(s string) bool {
	intPart, frac, hasDot := strings.Cut(s, ".")
	digits := func(x string) bool {
		if x == "" {
			return false
		}
		for _, c := range x {
			if c < '0' || c > '9' {
				return false
			}
		}
		return true
	}
	return digits(intPart) && (!hasDot || digits(frac))
}

// configModelMarker precedes a --model that came from a config file, so
// that it neither warns nor counts as a duplicate.
const configModelMarker = "\x00config-model"

// expandConfig implements `--config FILE`: the file's keys become flags
// inserted right after the model (the first token, when it is not a
// flag) so that every later command-line flag overrides them, as vLLM's
// FlexibleArgumentParser does. A `model` key is used only when the
// command line has no positional model.
func (a *serveArgs) expandConfig(argv []string) ([]string, error) {
	idx := -1
	var path string
	for i, tok := range argv {
		if tok == "--" {
			break
		}
		n := spellFlag(tok)
		if n == "--config" {
			if i+1 >= len(argv) {
				return nil, &argError{msg: "argument --config: expected one argument"}
			}
			idx, path = i, argv[i+1]
			break
		}
		if v, ok := strings.CutPrefix(n, "--config="); ok {
			idx, path = i, v
			break
		}
	}
	if idx < 0 {
		return argv, nil
	}
	data, err := readConfigFile(path)
	if err != nil {
		return nil, &argError{msg: fmt.Sprintf("argument --config: cannot read %s: %v", path, err)}
	}
	kv, err := parseYAMLSubset(data)
	if err != nil {
		return nil, &argError{msg: fmt.Sprintf("argument --config: %s: %v", path, err)}
	}
	var cfgArgs []string
	for _, e := range kv {
		flag := "--" + strings.ReplaceAll(e.key, "_", "-")
		switch {
		case flag == "--model":
			cfgArgs = append(cfgArgs, configModelMarker, flag, e.values[0])
		case e.list:
			if len(e.values) > 0 {
				cfgArgs = append(cfgArgs, flag)
				cfgArgs = append(cfgArgs, e.values...)
			}
		case e.values[0] == "true" || e.values[0] == "True":
			cfgArgs = append(cfgArgs, flag)
		case e.values[0] == "false" || e.values[0] == "False":
			// vLLM drops false booleans (newer versions pass --no-FLAG).
		default:
			cfgArgs = append(cfgArgs, flag, e.values[0])
		}
	}
	rest := append(append([]string{}, argv[:idx]...), argv[idx+2:]...)
	if idx < len(argv) && strings.HasPrefix(spellFlag(argv[idx]), "--config=") {
		rest = append(append([]string{}, argv[:idx]...), argv[idx+1:]...)
	}
	a.ConfigFile = path
	a.set["--config"] = true
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		return append(append([]string{rest[0]}, cfgArgs...), rest[1:]...), nil
	}
	return append(cfgArgs, rest...), nil
}

// isNegativeNumber mirrors argparse: "-5" is a value, not a flag, when no
// flag looks like a number.
func isNegativeNumber(s string) bool {
	if len(s) < 2 || s[0] != '-' {
		return false
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// validate checks what vLLM's config classes check after parsing; a failure
// is a ValueError traceback at startup (exit 1), not a usage error.
func (a *serveArgs) validate() error {
	switch {
	case a.GPUMemUtil <= 0 || a.GPUMemUtil > 1:
		return fmt.Errorf("GPU memory utilization must be within (0, 1]. Got %s.", pyFloat(a.GPUMemUtil))
	case a.MaxNumSeqs < 1:
		return fmt.Errorf("max_num_seqs (%d) must be greater than or equal to 1.", a.MaxNumSeqs)
	case a.MaxModelLen < 1:
		return fmt.Errorf("max_model_len (%d) must be greater than or equal to 1.", a.MaxModelLen)
	case a.set["--max-num-batched-tokens"] && a.MaxNumBatchedTokens < a.MaxNumSeqs:
		return fmt.Errorf("max_num_batched_tokens (%d) must be greater than or equal to max_num_seqs (%d).", a.MaxNumBatchedTokens, a.MaxNumSeqs)
	case a.set["--kv-cache-memory-bytes"] && a.KVCacheMemoryBytes <= 0:
		return fmt.Errorf("kv_cache_memory_bytes (%d) must be positive.", a.KVCacheMemoryBytes)
	case a.TensorParallel < 1:
		return fmt.Errorf("tensor_parallel_size (%d) must be greater than or equal to 1.", a.TensorParallel)
	case a.ShutdownTimeout < 0:
		return fmt.Errorf("shutdown_timeout (%s) must be greater than or equal to 0.", pyFloat(a.ShutdownTimeout))
	case a.StreamInterval < 1:
		// SchedulerConfig's field (ge=1): pydantic's error, not a ValueError.
		return &validationError{model: "SchedulerConfig", field: "stream_interval", value: a.StreamInterval}
	}
	return nil
}

// validationError is pydantic's refusal of a config field below its
// bound, as vLLM 0.32.0 prints it for --stream-interval 0 (exit 1).
type validationError struct {
	model, field string
	value        int
}

func (e *validationError) Error() string { return "1 validation error for " + e.model }

// lines is the exception as Python prints it: its line, then pydantic's.
func (e *validationError) lines() []string {
	return []string{
		"pydantic_core._pydantic_core.ValidationError: " + e.Error(),
		e.field,
		fmt.Sprintf("  Input should be greater than or equal to 1 [type=greater_than_equal, input_value=%d, input_type=int]", e.value),
		"    For further information visit https://errors.pydantic.dev/2.14/v/greater_than_equal",
	}
}

// nonDefaultArgs renders vLLM's `non-default args: {...}` dict. The guard
// always passes max_num_seqs and gpu_memory_utilization, and the guard's
// tests look for them, so they are always listed. The API keys are listed
// as vLLM lists them: in clear (its logs carry secrets).
func (a *serveArgs) nonDefaultArgs() string {
	var parts []string
	add := func(k, v string) { parts = append(parts, "'"+k+"': "+v) }
	pyList := func(vs []string) string {
		q := make([]string, len(vs))
		for i, v := range vs {
			q[i] = pyStr(v)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	add("model_tag", pyStr(a.Model))
	if a.set["--config"] {
		add("config", pyStr(a.ConfigFile))
	}
	if a.set["--host"] {
		add("host", pyStr(a.Host))
	}
	if a.set["--port"] {
		add("port", strconv.Itoa(a.Port))
	}
	if a.set["--uvicorn-log-level"] {
		add("uvicorn_log_level", pyStr(a.UvicornLogLevel))
	}
	if a.DisableAccessLog {
		add("disable_uvicorn_access_log", "True")
	}
	if len(a.APIKeys) > 0 {
		add("api_key", pyList(a.APIKeys))
	}
	add("model", pyStr(a.Model))
	if a.set["--task"] {
		add("task", pyStr(a.Task))
	}
	if a.set["--runner"] {
		add("runner", pyStr(a.Runner))
	}
	if a.set["--convert"] {
		add("convert", pyStr(a.Convert))
	}
	if a.set["--max-model-len"] {
		if a.MaxModelLenAuto {
			add("max_model_len", "-1")
		} else {
			add("max_model_len", strconv.Itoa(a.MaxModelLen))
		}
	}
	if a.EnforceEager {
		add("enforce_eager", "True")
	}
	if a.set["--served-model-name"] {
		add("served_model_name", pyList(a.ServedNames))
	}
	if a.set["--tensor-parallel-size"] {
		add("tensor_parallel_size", strconv.Itoa(a.TensorParallel))
	}
	if a.set["--load-format"] {
		add("load_format", pyStr(a.LoadFormat))
	}
	if a.EnableSleepMode {
		add("enable_sleep_mode", "True")
	}
	add("gpu_memory_utilization", pyFloat(a.GPUMemUtil))
	if a.set["--kv-cache-memory-bytes"] {
		add("kv_cache_memory_bytes", strconv.FormatInt(a.KVCacheMemoryBytes, 10))
	}
	if a.set["--max-num-batched-tokens"] {
		add("max_num_batched_tokens", strconv.Itoa(a.MaxNumBatchedTokens))
	}
	add("max_num_seqs", strconv.Itoa(a.MaxNumSeqs))
	if a.DisableLogStats {
		add("disable_log_stats", "True")
	}
	if a.set["--shutdown-timeout"] {
		add("shutdown_timeout", pyNum(a.ShutdownTimeout))
	}
	if a.set["--stream-interval"] {
		add("stream_interval", strconv.Itoa(a.StreamInterval))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// pyNum prints an int-valued float as an int (argparse type=int), else as a float.
func pyNum(f float64) string {
	if f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10)
	}
	return pyFloat(f)
}

// argv renders the arguments back, for the engine process's command line.
// The API keys stay in the API process: the engine does not need them.
func (a *serveArgs) argv() []string {
	out := []string{a.Model,
		"--host=" + a.Host,
		"--port=" + strconv.Itoa(a.Port),
		"--gpu-memory-utilization=" + strconv.FormatFloat(a.GPUMemUtil, 'g', -1, 64),
		"--max-num-seqs=" + strconv.Itoa(a.MaxNumSeqs),
		"--tensor-parallel-size=" + strconv.Itoa(a.TensorParallel),
	}
	if a.MaxModelLenAuto {
		out = append(out, "--max-model-len=auto")
	} else {
		out = append(out, "--max-model-len="+strconv.Itoa(a.MaxModelLen))
	}
	out = append(out, "--served-model-name")
	out = append(out, a.ServedNames...)
	if a.Task != "" {
		out = append(out, "--task="+a.Task)
	}
	if a.Runner != "" {
		out = append(out, "--runner="+a.Runner)
	}
	if a.Convert != "" {
		out = append(out, "--convert="+a.Convert)
	}
	if a.EnforceEager {
		out = append(out, "--enforce-eager")
	}
	if a.set["--max-num-batched-tokens"] {
		out = append(out, "--max-num-batched-tokens="+strconv.Itoa(a.MaxNumBatchedTokens))
	}
	if a.set["--kv-cache-memory-bytes"] {
		out = append(out, "--kv-cache-memory-bytes="+strconv.FormatInt(a.KVCacheMemoryBytes, 10))
	}
	if a.EnableSleepMode {
		out = append(out, "--enable-sleep-mode")
	}
	if a.LoadFormat != "" {
		out = append(out, "--load-format="+a.LoadFormat)
	}
	if a.LoaderExtraConfig != "" {
		out = append(out, "--model-loader-extra-config="+a.LoaderExtraConfig)
	}
	if a.NNodes > 1 {
		out = append(out, "--nnodes="+strconv.Itoa(a.NNodes), "--node-rank="+strconv.Itoa(a.NodeRank))
	}
	return out
}

// poolingTask is the model's task: "generate", or a pooling task.
// vLLM learns it from the model's architecture; the simulator has no
// config.json, so --convert / --task / --runner decide, else the model's
// name does: a name with "rerank", "classif" or "cross-encoder" is a
// classifier, one with "reward" a reward model, one with "embed", "bge",
// "e5-", "gte-" or "minilm" an embedding model; anything else generates.
// --convert embed|classify adapts any model to that task (and implies the
// pooling runner); with --runner pooling an unrecognised name embeds
// (vLLM's default convert).
func (a *serveArgs) poolingTask() string {
	switch a.Convert {
	case "embed":
		return "embed"
	case "classify":
		return "classify"
	}
	switch a.Task {
	case "generate":
		return "generate"
	case "embed", "embedding":
		return "embed"
	case "classify", "score":
		return "classify"
	case "reward":
		return "reward"
	}
	if a.Runner == "generate" {
		return "generate"
	}
	byName := taskFromName(a.Model)
	if a.Runner == "pooling" && byName == "generate" {
		return "embed"
	}
	return byName
}

func taskFromName(model string) string {
	n := strings.ToLower(model)
	if i := strings.LastIndex(n, "/"); i >= 0 {
		n = n[i+1:]
	}
	for _, s := range []string{"rerank", "classif", "cross-encoder"} {
		if strings.Contains(n, s) {
			return "classify"
		}
	}
	if strings.Contains(n, "reward") {
		return "reward"
	}
	for _, s := range []string{"embed", "bge", "e5-", "gte-", "minilm"} {
		if strings.Contains(n, s) {
			return "embed"
		}
	}
	return "generate"
}

// supportedTasks is what vLLM logs as its supported tasks for the task:
// the names of 2025 ("encode", "score", "reward") in the older eras,
// merged vLLM's ("token_embed", "token_classify") in the newest.
func supportedTasks(task string, e era) []string {
	if e == eraV1Plain {
		switch task {
		case "embed":
			return []string{"embed", "token_embed"}
		case "classify":
			return []string{"classify", "token_classify"}
		case "reward":
			return []string{"token_classify"}
		}
		return []string{"generate"}
	}
	switch task {
	case "embed":
		return []string{"encode", "embed"}
	case "classify":
		return []string{"encode", "classify", "score"}
	case "reward":
		return []string{"encode", "reward"}
	}
	return []string{"generate"}
}

// pyFloat prints a float the way Python's repr does for ordinary values.
func pyFloat(f float64) string {
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s
}

// pyStr prints a string the way Python's repr does for ordinary values.
func pyStr(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
