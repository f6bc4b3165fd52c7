package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/redact"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
	"github.com/vllm-guard/vllm-guard/internal/weightcache"
)

// checkWeights reads [weights] as `run` does: the weight cache daemon's
// command (nil: none) and vLLM's extra arguments with what the guard adds
// for it. A command the daemon's cannot be derived from is a
// configuration error.
func checkWeights(cfg *config.Config, args *vllmargs.Args, extra []string) ([]string, []string, error) {
	preload, add, err := weightcache.Command(cfg.Weights.Cache, args)
	if err != nil {
		return nil, nil, &config.Error{File: cfg.Path, Key: "[weights] cache", Msg: err.Error(), Err: err}
	}
	return preload, append(append([]string(nil), extra...), add...), nil
}

// writeWeights prints the weight cache daemon the guard runs, if any.
func writeWeights(w io.Writer, args *vllmargs.Args, preload []string) {
	fmt.Fprintf(w, "\n# weight cache daemon ([weights])\n")
	if preload == nil {
		fmt.Fprintf(w, "none (vLLM reads its weights from the disk at every start; [weights] cache = \"daemon\" or --load-format ipc_cache runs one)\n")
		return
	}
	fmt.Fprintf(w, "command line:   %s --weight-cache-health-port PORT --weight-cache-health-host 127.0.0.1\n", strings.Join(shellQuote(redact.Args(args.Masked(preload))), " "))
	fmt.Fprintf(w, "started before vLLM, stopped after it; a restart of vLLM maps its weights instead of reading the disk\n")
}
