// Command vllm-guard supervises vLLM: see `vllm-guard --help`.
package main

import (
	"fmt"
	"github.com/vllm-guard/vllm-guard/exitcode"
	"io"
	"os"

	"github.com/vllm-guard/vllm-guard/control"
	"github.com/vllm-guard/vllm-guard/drill"
	"github.com/vllm-guard/vllm-guard/supervisor"
)

const usage = `vllm-guard keeps vLLM serving: it launches vLLM, says ready only when the model
answers, watches GPU memory, and restarts it after a failure on a lighter profile.

Usage:
  vllm-guard run [--config FILE] [--init] [-- EXTRA_VLLM_ARGS...]   supervise vLLM (the main job)
  vllm-guard check [--config FILE]            validate the config, print the settings and the ladder
  vllm-guard status [--socket PATH] [--json] [--watch]   state of a running guard (exit 0 ready, 1 not, 2 no guard)
  vllm-guard incidents [--json] [-n N]         the incident records, newest first
  vllm-guard restart                           restart vLLM now, on the current rung
  vllm-guard profile reset                     back to rung 0 at the next start
  vllm-guard diagnose [--log FILE|-] [--json] classify a vLLM log offline: cause, evidence, facts, advice
  vllm-guard drill --url URL --model NAME ...   the failure drill: a burst, alerts' lead time, verdict
  vllm-guard gpus [--json]                    what NVML sees: devices, memory, processes (no guard needed)
  vllm-guard version                          version, commit, Go version

Every command has --help. --config defaults to $VLLM_GUARD_CONFIG, then
./vllm-guard.toml, then /etc/vllm-guard/vllm-guard.toml.
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == supervisor.KeeperArg {
		os.Exit(supervisor.RunKeeper(os.Args[2:]))
	}
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitcode.Usage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(rest, stderr)
	case "check":
		return cmdCheck(rest, stdout, stderr)
	case "status":
		return control.StatusCommand(rest, stdout, stderr)
	case "incidents":
		return control.IncidentsCommand(rest, stdout, stderr)
	case "restart":
		return control.ActionCommand("restart", rest, stdout, stderr)
	case "profile":
		if len(rest) == 0 || rest[0] != "reset" {
			fmt.Fprintln(stderr, "vllm-guard: usage: vllm-guard profile reset [--socket PATH]")
			return exitcode.Usage
		}
		return control.ActionCommand("profile reset", rest[1:], stdout, stderr)
	case "diagnose":
		return cmdDiagnose(rest, os.Stdin, stdout, stderr)
	case "drill":
		return drill.Command(rest, stdout, stderr)
	case "gpus":
		return cmdGPUs(rest, stdout, stderr)
	case "version":
		fs := newFlags("version", "version", stderr)
		if code, ok := parse(fs, rest); !ok {
			return code
		}
		return cmdVersion(stdout)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitcode.OK
	default:
		fmt.Fprintf(stderr, "vllm-guard: unknown command %q\n\n%s", cmd, usage)
		return exitcode.Usage
	}
}
