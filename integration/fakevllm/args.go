package main

import (
	"fmt"
	"strconv"
	"strings"
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
	ServedName          string
	EnforceEager        bool
	MaxNumBatchedTokens int
	KVCacheMemoryBytes  int64
	APIKey              string // listed in `non-default args`; not enforced (the guard's probes send none)

	set map[string]bool
}

// argError is an argparse-style usage error: exit 2 with the usage line.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// helpRequested is returned for -h/--help.
var errHelp = &argError{msg: "help"}

const usageText = `usage: vllm serve [-h] [--host HOST] [--port PORT]
                  [--gpu-memory-utilization GPU_MEMORY_UTILIZATION]
                  [--max-num-seqs MAX_NUM_SEQS] [--max-model-len MAX_MODEL_LEN]
                  [--served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]]
                  [--enforce-eager]
                  [--max-num-batched-tokens MAX_NUM_BATCHED_TOKENS]
                  [--kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES]
                  [--api-key API_KEY]
                  [model_tag]
`

const helpText = `
Start the vLLM OpenAI Compatible API server (simulated by fakevllm).

positional arguments:
  model_tag             The model tag to serve

options:
  -h, --help            show this help message and exit
  --host HOST           Host name. (default: 0.0.0.0)
  --port PORT           Port number. (default: 8000)
  --gpu-memory-utilization GPU_MEMORY_UTILIZATION
                        The fraction of GPU memory to be used for the model executor. (default: 0.9)
  --max-num-seqs MAX_NUM_SEQS
                        Maximum number of sequences per iteration. (default: 256)
  --max-model-len MAX_MODEL_LEN
                        Model context length. (default: 4096)
  --served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]
                        The model name(s) used in the API. (default: model_tag)
  --enforce-eager       Always use eager-mode PyTorch. (default: False)
  --max-num-batched-tokens MAX_NUM_BATCHED_TOKENS
                        Maximum number of batched tokens per iteration. (default: None)
  --kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES
                        Size of KV Cache per GPU in bytes; overrides gpu_memory_utilization. (default: None)
  --api-key API_KEY     If provided, the server will require this key to be presented in the header. (default: None)
`

// flagKind says how a flag takes its value.
type flagKind int

const (
	kindString flagKind = iota
	kindInt
	kindFloat
	kindBool
)

var knownFlags = map[string]flagKind{
	"--host":                   kindString,
	"--port":                   kindInt,
	"--gpu-memory-utilization": kindFloat,
	"--max-num-seqs":           kindInt,
	"--max-model-len":          kindInt,
	"--served-model-name":      kindString,
	"--enforce-eager":          kindBool,
	"--max-num-batched-tokens": kindInt,
	"--kv-cache-memory-bytes":  kindInt,
	"--api-key":                kindString,
}

// parseServeArgs parses the arguments after `serve` the way vLLM's
// argparse parser does: `--flag value` and `--flag=value`, no
// abbreviations, every unknown token collected into one
// "unrecognized arguments" error.
func parseServeArgs(argv []string) (*serveArgs, error) {
	a := &serveArgs{
		Host:        "0.0.0.0",
		Port:        8000,
		GPUMemUtil:  0.9,
		MaxNumSeqs:  256,
		MaxModelLen: 4096,
		set:         map[string]bool{},
	}
	var unknown []string
	positional := 0
	for i := 0; i < len(argv); i++ {
		tok := argv[i]
		if tok == "-h" || tok == "--help" {
			return nil, errHelp
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
		name, value, hasValue := strings.Cut(tok, "=")
		kind, ok := knownFlags[name]
		if !ok {
			unknown = append(unknown, tok)
			continue
		}
		if kind == kindBool {
			if hasValue {
				return nil, &argError{msg: fmt.Sprintf("argument %s: ignored explicit argument '%s'", name, value)}
			}
			a.set[name] = true
			a.EnforceEager = true
			continue
		}
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
		a.set[name] = true
	}
	if len(unknown) > 0 {
		return nil, &argError{msg: "unrecognized arguments: " + strings.Join(unknown, " ")}
	}
	if a.Model == "" {
		return nil, &argError{msg: "the following arguments are required: model_tag"}
	}
	if a.ServedName == "" {
		a.ServedName = a.Model
	}
	return a, nil
}

func (a *serveArgs) setFlag(name string, kind flagKind, value string) error {
	switch kind {
	case kindInt:
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return &argError{msg: fmt.Sprintf("argument %s: invalid int value: '%s'", name, value)}
		}
		switch name {
		case "--port":
			a.Port = int(n)
		case "--max-num-seqs":
			a.MaxNumSeqs = int(n)
		case "--max-model-len":
			a.MaxModelLen = int(n)
		case "--max-num-batched-tokens":
			a.MaxNumBatchedTokens = int(n)
		case "--kv-cache-memory-bytes":
			a.KVCacheMemoryBytes = n
		}
	case kindFloat:
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return &argError{msg: fmt.Sprintf("argument %s: invalid float value: '%s'", name, value)}
		}
		a.GPUMemUtil = f
	case kindString:
		switch name {
		case "--host":
			a.Host = value
		case "--api-key":
			a.APIKey = value
		case "--served-model-name":
			a.ServedName = value
		}
	}
	return nil
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
	}
	return nil
}

// nonDefaultArgs renders vLLM's `non-default args: {...}` dict. The guard
// always passes max_num_seqs and gpu_memory_utilization, and the guard's
// tests look for them, so they are always listed.
func (a *serveArgs) nonDefaultArgs() string {
	var parts []string
	add := func(k, v string) { parts = append(parts, "'"+k+"': "+v) }
	add("model_tag", pyStr(a.Model))
	if a.set["--host"] {
		add("host", pyStr(a.Host))
	}
	if a.set["--port"] {
		add("port", strconv.Itoa(a.Port))
	}
	add("model", pyStr(a.Model))
	if a.set["--max-model-len"] {
		add("max_model_len", strconv.Itoa(a.MaxModelLen))
	}
	if a.EnforceEager {
		add("enforce_eager", "True")
	}
	if a.set["--served-model-name"] {
		add("served_model_name", "["+pyStr(a.ServedName)+"]")
	}
	if a.set["--api-key"] {
		add("api_key", pyStr(a.APIKey))
	}
	add("gpu_memory_utilization", pyFloat(a.GPUMemUtil))
	if a.set["--kv-cache-memory-bytes"] {
		add("kv_cache_memory_bytes", strconv.FormatInt(a.KVCacheMemoryBytes, 10))
	}
	if a.set["--max-num-batched-tokens"] {
		add("max_num_batched_tokens", strconv.Itoa(a.MaxNumBatchedTokens))
	}
	add("max_num_seqs", strconv.Itoa(a.MaxNumSeqs))
	return "{" + strings.Join(parts, ", ") + "}"
}

// argv renders the arguments back, for the engine process's command line.
func (a *serveArgs) argv() []string {
	out := []string{a.Model,
		"--host=" + a.Host,
		"--port=" + strconv.Itoa(a.Port),
		"--gpu-memory-utilization=" + strconv.FormatFloat(a.GPUMemUtil, 'g', -1, 64),
		"--max-num-seqs=" + strconv.Itoa(a.MaxNumSeqs),
		"--max-model-len=" + strconv.Itoa(a.MaxModelLen),
		"--served-model-name=" + a.ServedName,
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
	if a.set["--api-key"] {
		out = append(out, "--api-key", a.APIKey)
	}
	return out
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
