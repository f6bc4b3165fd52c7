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
// tests kill it to fake a follower's death. The fault oom_on_start: its
// worker runs out of GPU memory once loaded; the headless executor's
// monitor logs the worker's death and the follower exits 0
// (multiproc_executor.py:315-321, run_headless returns).
func runHeadless(args *serveArgs, env *simEnv, f faults, out, errw *streamWriter) int {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	log := newLogger(env.Era, "", os.Getpid(), out, errw)
	log.info("serve.py:225", "Launching vLLM (v%s) headless multiproc executor, with head node address %s for torch.distributed process group.", versionOf(env.Era), args.MasterAddr)
	worker := newLogger(env.Era, "Worker_TP1", os.Getpid()+1, out, errw)
	worker.info("default_loader.py:502", "Loading weights took %.2f seconds", 0.01)
	if f.has(fOOMOnStart) {
		env.fired()
		worker.error("multiproc_executor.py:863", "WorkerProc hit an exception.")
		worker.stderrLines("Traceback (most recent call last):",
			`  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 858, in worker_busy_loop`,
			"    output = func(*args, **kwargs)",
			"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.")
		log.error("multiproc_executor.py:315", "Worker proc VllmWorker-1 died unexpectedly (exit code: 1), shutting down executor.")
		return 0
	}
	<-sig
	return 0
}
