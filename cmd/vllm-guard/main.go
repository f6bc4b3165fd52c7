// Command vllm-guard supervises vLLM: see `vllm-guard --help`.
package main

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/drill"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
)

const usage = `vllm-guard keeps vLLM serving: it launches vLLM, says ready only when the model
answers, watches GPU memory, and restarts it after a failure on a lighter profile.

Usage:
  vllm-guard run [--config FILE] [--init] [-- EXTRA_VLLM_ARGS...]   supervise vLLM (the main job)
  vllm-guard check [--config FILE]            validate the config, print the settings and the ladder
  vllm-guard status [--json] [--watch]        state of a running guard (exit 0 ready, 1 not, 3 no guard)
  vllm-guard status --all                     one line per guard on this host
  vllm-guard incidents [--json] [-n N]         the incident records, newest first
  vllm-guard restart                           restart vLLM now, on the current rung
  vllm-guard profile reset                     back to rung 0 at the next start
  vllm-guard diagnose [--log FILE|-] [--json] classify a vLLM log offline: cause, evidence, facts, advice
  vllm-guard drill --url URL --model NAME ...   the failure drill: a burst, alerts' lead time, verdict
  vllm-guard gpus [--json]                    what NVML sees: devices, memory, processes (no guard needed)
  vllm-guard version                          version, revision, Go version (also --version)
  vllm-guard completion bash|zsh              a shell completion script
  vllm-guard help [COMMAND]                   this text, or a command's (also COMMAND --help)

Several guards on one host: --instance NAME (or $VLLM_GUARD_INSTANCE) on every
command that reads the config or the socket makes the defaults
/etc/vllm-guard/NAME.toml, /run/vllm-guard/NAME.sock and /var/lib/vllm-guard/NAME.
--config defaults to the instance's file, else $VLLM_GUARD_CONFIG, then
./vllm-guard.toml, then /etc/vllm-guard/vllm-guard.toml; --socket and the
config's keys win over the instance's defaults.

Exit codes:
  0   done; status: vLLM is ready; run: stopped on request
  1   failed; status: a guard answers, vLLM is not ready; run: gave up (crash loop) or a fatal error
  2   usage: an unknown command or flag, a bad argument
  3   no guard answers on the control socket (status, restart, profile reset)
  69  GPU fault (run): the GPU needs a reset (nvidia-smi -r -i N) or the node a drain and reboot
  78  configuration error (run, check): fix the config; systemd's RestartPreventExitStatus=78
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == proctree.KeeperArg {
		os.Exit(proctree.RunKeeper(os.Args[2:]))
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
		return cmdRun(rest, stdout, stderr)
	case "check":
		return cmdCheck(rest, stdout, stderr)
	case "status":
		return control.StatusCommand(rest, stdout, stderr)
	case "incidents":
		return control.IncidentsCommand(rest, stdout, stderr)
	case "restart":
		return control.ActionCommand("restart", rest, stdout, stderr)
	case "profile":
		return cmdProfile(rest, stdout, stderr)
	case "diagnose":
		return cmdDiagnose(rest, os.Stdin, stdout, stderr)
	case "drill":
		return drill.Command(rest, stdout, stderr)
	case "gpus":
		return cmdGPUs(rest, stdout, stderr)
	case "version", "--version", "-version", "-v":
		fs := newFlags("version", "version", stderr)
		if code, ok := parse(fs, rest, stdout); !ok {
			return code
		}
		return cmdVersion(stdout)
	case "completion":
		return cmdCompletion(rest, stdout, stderr)
	case "-h", "--help", "-help", "help":
		if cmd == "help" && len(rest) > 0 && !slices.Contains([]string{"-h", "--help", "-help", "help"}, rest[0]) {
			// `vllm-guard help status` is `vllm-guard status --help`.
			sub := append(append([]string{}, rest...), "--help")
			if !isCommand(rest[0]) {
				fmt.Fprintf(stderr, "vllm-guard help: unknown command %q\n\n%s", rest[0], usage)
				return exitcode.Usage
			}
			return dispatch(sub, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return exitcode.OK
	default:
		fmt.Fprintf(stderr, "vllm-guard: unknown command %q\n\n%s", cmd, usage)
		return exitcode.Usage
	}
}

const profileUsage = `Usage: vllm-guard profile reset [--instance NAME | --socket PATH | --config FILE]

  reset   ask the running guard to return to rung 0 at vLLM's next restart
          (vllm-guard profile reset --help for its flags)
`

// cmdProfile is `vllm-guard profile`: one subcommand, reset.
func cmdProfile(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) > 0 && args[0] == "reset":
		return control.ActionCommand("profile reset", args[1:], stdout, stderr)
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help"):
		fmt.Fprint(stdout, profileUsage)
		return exitcode.OK
	default:
		fmt.Fprint(stderr, profileUsage)
		return exitcode.Usage
	}
}
