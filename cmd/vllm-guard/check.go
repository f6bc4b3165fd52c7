package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/redact"
	"github.com/vllm-guard/vllm-guard/internal/supervisor"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("check", "check [--config FILE | --instance NAME] [-- EXTRA_VLLM_ARGS...]", stderr)
	cf := addConfigFlags(fs, "")
	if code, ok := parse(fs, args, stdout); !ok {
		return code
	}
	instance, path, ok := cf.resolve(stderr)
	if !ok {
		return exitcode.Usage
	}
	cfg, err := config.LoadFor(path, instance)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return exitcode.Config
	}
	vargs, err := cfg.VLLMArgs(fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return exitcode.Config
	}
	if err := cfg.CheckStateDir(); err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return exitcode.Config
	}
	preload, extra, err := checkWeights(cfg, vargs, fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return exitcode.Config
	}
	if cfg.Group.Enabled {
		// The command run adds: the group's multi-node flags.
		flags, err := vargs.GroupFlags(cfg.Group.VLLM())
		if err != nil {
			fmt.Fprintf(stderr, "%v\n", &config.Error{File: path, Key: "[vllm] command", Msg: err.Error(), Err: err})
			return exitcode.Config
		}
		extra = append(append([]string(nil), extra...), flags...)
	}
	fmt.Fprintf(stdout, "# %s: OK\n", path)
	for _, w := range instanceWarnings(instance, cfg) {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	fmt.Fprintf(stdout, "# effective settings (defaults included)\n\n")
	if err := cfg.WriteEffective(stdout); err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return exitcode.Failed
	}
	writeVLLM(stdout, cfg, vargs, extra)
	writeWeights(stdout, vargs, preload)
	rungs := policy.LadderKV(cfg.Policy().Profile, vargs.KVCacheMemoryBytes)
	fmt.Fprintf(stdout, "\n# degrade ladder: each OOM steps one rung down\n")
	if vargs.KVCacheMemoryBytes > 0 {
		fmt.Fprintf(stdout, "# --kv-cache-memory-bytes sizes the KV cache, so the bytes step with the utilization ratio (floored to a MiB)\n")
		fmt.Fprintf(stdout, "%-5s %-13s %-23s %s\n", "rung", "max_num_seqs", "gpu_memory_utilization", "kv_cache_memory_bytes")
		for _, r := range rungs {
			fmt.Fprintf(stdout, "%-5d %-13d %-23.2f %d (%.2f GiB)\n", r.Index, r.MaxNumSeqs, r.GPUMemoryUtilization, r.KVCacheMemoryBytes, float64(r.KVCacheMemoryBytes)/(1<<30))
		}
	} else {
		fmt.Fprintf(stdout, "%-5s %-13s %s\n", "rung", "max_num_seqs", "gpu_memory_utilization")
		for _, r := range rungs {
			fmt.Fprintf(stdout, "%-5d %-13d %.2f\n", r.Index, r.MaxNumSeqs, r.GPUMemoryUtilization)
		}
	}
	writeThresholds(stdout, cfg, vargs)
	writeStop(stdout, cfg, vargs)
	writeLearned(stdout, cfg, vargs)
	return exitcode.OK
}

// The stop bounds of the shipped examples (examples/vllm-guard.service,
// examples/kubernetes/deployment.yaml): check warns when vLLM's stop would
// take longer than they allow.
const (
	exampleTimeoutStopSec   = 90 * time.Second
	exampleGracePeriodInK8s = 60 * time.Second
)

// writeStop prints how vLLM is stopped and how long it may take.
func writeStop(w io.Writer, cfg *config.Config, args *vllmargs.Args) {
	drain := args.ShutdownTimeout
	eff := supervisor.EffectiveStopTimeout(cfg.VLLM.StopTimeout.Duration, drain)
	fmt.Fprintf(w, "\n# stopping: SIGTERM to vLLM's API server (it drains, then stops its engine), SIGKILL of its whole tree after the effective stop timeout\n")
	fmt.Fprintf(w, "effective stop timeout: %ds", int(eff.Seconds()))
	if drain > 0 {
		fmt.Fprintf(w, " (the longer of vLLM's --shutdown-timeout %ds + 10s and stop_timeout %s)\n", int(drain.Seconds()), cfg.VLLM.StopTimeout.Duration)
	} else {
		fmt.Fprintf(w, " (stop_timeout; vLLM's --shutdown-timeout is 0: it aborts requests in flight at once)\n")
	}
	if eff+5*time.Second > exampleTimeoutStopSec {
		fmt.Fprintf(w, "warning: the example systemd unit's TimeoutStopSec=%s is not above %s: raise it, or systemd kills vLLM mid-drain\n",
			exampleTimeoutStopSec, eff)
	}
	if eff+5*time.Second > exampleGracePeriodInK8s {
		fmt.Fprintf(w, "warning: the example Kubernetes terminationGracePeriodSeconds (%d) is not above %s: raise it, or the kubelet kills vLLM mid-drain\n",
			int(exampleGracePeriodInK8s.Seconds()), eff)
	}
}

// writeVLLM prints what the guard reads of vLLM's command line: the served
// names, the command it will run (secrets masked), the readiness probe.
func writeVLLM(w io.Writer, cfg *config.Config, args *vllmargs.Args, extra []string) {
	argv, _ := launch.BuildArgv(cfg.VLLM.Command, extra, policy.LadderKV(cfg.Policy().Profile, args.KVCacheMemoryBytes)[0], cfg.VLLM.Host, cfg.VLLM.Port)
	fmt.Fprintf(w, "\n# vLLM\n")
	names := cfg.ServedModelNames(args)
	from := "--served-model-name, else the model, in vLLM's command line"
	if cfg.VLLM.ServedModelName != "" {
		from = "[vllm] served_model_name"
	}
	fmt.Fprintf(w, "served names:   %s (from %s)\n", strings.Join(quoted(names), ", "), from)
	// vLLM's secret flags by vLLM's reading, then whatever else looks like
	// a key (a URL's credentials, a token's shape).
	fmt.Fprintf(w, "command line:   %s\n", strings.Join(shellQuote(redact.Args(args.Masked(argv))), " "))
	if args.ConfigFile != "" {
		fmt.Fprintf(w, "config file:    %s (its keys come before the command line's flags)\n", args.ConfigFile)
	}
	key := "none (vLLM's /v1 is open)"
	if len(args.APIKeys) > 0 {
		key = fmt.Sprintf("%d key(s), sent by every probe as a Bearer token; shown as %s", len(args.APIKeys), vllmargs.Mask)
	}
	fmt.Fprintf(w, "API key:        %s\n", key)
	fmt.Fprintf(w, "readiness:      %s\n", probeWords(cfg.Readiness.Probe, args))
	if args.Task != "" {
		fmt.Fprintf(w, "warning: --task %s: vllm serve no longer takes --task (it exits 2, \"unrecognized arguments\"); write --runner pooling and --convert %s (or nothing: vLLM detects the task)\n", args.Task, args.Task)
	}
	if args.ShutdownTimeout > 0 {
		fmt.Fprintf(w, "shutdown:       --shutdown-timeout %ds (vLLM drains requests in flight for up to this long)\n", int(args.ShutdownTimeout.Seconds()))
	}
	if args.TensorParallelSize > 1 {
		fmt.Fprintf(w, "tensor parallel: %d GPUs\n", args.TensorParallelSize)
	}
}

// probeWords says which readiness probe the guard will use.
func probeWords(level string, args *vllmargs.Args) string {
	switch level {
	case "health":
		return "health: GET /health answers 200"
	case "models":
		return "models: GET /v1/models lists a served name"
	case "completion":
		return "completion: a 1-token POST /v1/completions"
	}
	task := args.Convert
	if task == "" {
		task = args.Task
	}
	if task == "" {
		task = args.Runner
	}
	switch {
	case task == "generate":
		return "auto: a 1-token POST /v1/completions (--runner generate)"
	case vllmargs.Pooling(task):
		return fmt.Sprintf("auto: a 1-input request to the endpoint of task %q (from --convert/--runner; vLLM's Supported tasks line decides at startup)", task)
	}
	return "auto: a 1-token POST /v1/completions for a generating model, or a 1-input request to the endpoint of a pooling model's task (the task from vLLM's Supported tasks line at startup, or a 404 on completions)"
}

// writeThresholds prints the memory thresholds on rung 0.
func writeThresholds(w io.Writer, cfg *config.Config, args *vllmargs.Args) {
	u := cfg.Profile.GPUMemoryUtilization
	warn, crit := cfg.GPU.Thresholds(u)
	budget := fmt.Sprintf("utilization %.2f of each GPU", u)
	fixed := cfg.GPU.WarnFraction > 0 || cfg.GPU.CriticalFraction > 0
	if args.KVCacheMemoryBytes > 0 && !fixed {
		fmt.Fprintf(w, "\n# GPU memory alerts: vLLM's budget is what it holds once loaded (weights + --kv-cache-memory-bytes + the rest), learned at each start\n")
		fmt.Fprintf(w, "gpu_memory_warn at budget + %g of total, gpu_memory_critical at budget + %g (at most 99.5 %%)\n", cfg.GPU.WarnOverBudget, cfg.GPU.CriticalOverBudget)
		return
	}
	fmt.Fprintf(w, "\n# GPU memory alerts: vLLM's budget is %s\n", budget)
	if fixed {
		fmt.Fprintf(w, "gpu_memory_warn at %.1f %%, gpu_memory_critical at %.1f %% of total (fixed warn_fraction/critical_fraction where set)\n", warn*100, crit*100)
		return
	}
	fmt.Fprintf(w, "gpu_memory_warn at %.1f %%, gpu_memory_critical at %.1f %% of total on rung 0 (budget + warn_over_budget %g, + critical_over_budget %g)\n",
		warn*100, crit*100, cfg.GPU.WarnOverBudget, cfg.GPU.CriticalOverBudget)
}

func quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// shellQuote quotes the words a shell would split.
func shellQuote(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

// writeLearned prints what a guard that ran with this config saved: the
// rung in force and the cost model. check only reads; it writes nothing.
func writeLearned(w io.Writer, cfg *config.Config, args *vllmargs.Args) {
	path := filepath.Join(cfg.Control.StateDir, "state.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(w, "\n# no saved state in %s: a guard starts on rung 0\n", path)
		return
	}
	var st policy.State
	if err := json.Unmarshal(raw, &st); err != nil {
		fmt.Fprintf(w, "\n# %s does not decode (%v): a guard moves it aside and starts on rung 0\n", path, err)
		return
	}
	p := policy.New(cfg.Policy(), st, nil)
	p.SetKVCacheBytes(args.KVCacheMemoryBytes)
	r := p.Current()
	kv := ""
	if r.KVCacheMemoryBytes > 0 {
		kv = fmt.Sprintf(", kv_cache_memory_bytes %d", r.KVCacheMemoryBytes)
	}
	fmt.Fprintf(w, "\n# saved state (%s)\nrung in force: %d (max_num_seqs %d, gpu_memory_utilization %.2f%s)\ncost model: %s\n",
		path, r.Index, r.MaxNumSeqs, r.GPUMemoryUtilization, kv, p.Cost().Describe(r.GPUMemoryUtilization, cfg.Profile.Headroom))
}
