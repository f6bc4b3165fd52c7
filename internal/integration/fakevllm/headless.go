package main

import (
	"os"
	"os/signal"
	"syscall"
)

// runHeadless is a follower of a vLLM across hosts, as vLLM 0.32.0 runs
// `vllm serve … --nnodes N --node-rank R --master-addr H --headless`
// (docs/MULTINODE-FACTS: serve.py run_headless): it logs its start, loads
// its share of the weights, serves no HTTP, and never says it is ready
// (the head's readiness implies every rank loaded). SIGTERM or SIGINT
// ends it with exit 0 (serve.py turns them into SystemExit). The guard
// tests kill it to fake a follower's death.
func runHeadless(args *serveArgs, env *simEnv, out, errw *streamWriter) int {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	log := newLogger(env.Era, "", os.Getpid(), out, errw)
	log.info("serve.py:225", "Launching vLLM (v%s) headless multiproc executor, with head node address %s for torch.distributed process group.", versionOf(env.Era), args.MasterAddr)
	log.info("default_loader.py:502", "Loading weights took %.2f seconds", 0.01)
	<-sig
	return 0
}
