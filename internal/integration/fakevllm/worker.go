package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Tensor parallelism: with --tensor-parallel-size N > 1 the EngineCore
// spawns N worker processes (vLLM's multiproc executor), titled
// VLLM::Worker_TP{n} (argv[0]), one per device: rank n uses entry n of
// CUDA_VISIBLE_DEVICES (index n when unset). Each worker publishes its
// share of the memory in the stand-in NVML state under its own pid. The
// engine tells it how much on the worker's stdin ("mem used=B"); that
// pipe is also vLLM's death pipe: when it closes (the EngineCore died,
// however it died) the worker frees its memory and exits. SIGTERM makes a
// worker exit at once (vLLM's workers raise SystemExit), which the
// engine sees as "Worker proc ... died unexpectedly" and dies of.

const workerArg = "__worker"

func workerTitle(rank int) string { return fmt.Sprintf("VLLM::Worker_TP%d", rank) }

// tpWorker is the engine's handle on one worker process.
type tpWorker struct {
	rank int
	gpu  *gpuView
	cmd  *exec.Cmd
	inMu sync.Mutex
	in   io.WriteCloser
	done chan struct{}
}

func (w *tpWorker) pid() int { return w.cmd.Process.Pid }

func (w *tpWorker) send(line string) {
	w.inMu.Lock()
	defer w.inMu.Unlock()
	io.WriteString(w.in, line)
}

// startWorkers starts one worker per rank; a failure to open a rank's
// device is vLLM's world-size error.
func (e *engine) startWorkers() error {
	n := e.args.TensorParallel
	if e.args.NNodes > 1 {
		n /= e.args.NNodes // --nnodes: this node runs its share of the ranks (the others run --headless)
	}
	available := len(e.env.VisibleDevs)
	if !e.env.VisibleSet {
		available = n
		if e.env.StateDir != "" {
			if data, err := os.ReadFile(e.env.StateDir + "/devices"); err == nil {
				if devs, err := parseDevices(data); err == nil {
					available = len(devs)
				}
			}
		}
	}
	if n > available {
		return fmt.Errorf("ValueError: World size (%d) is larger than the number of available GPUs (%d) in this node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n- multiprocessing, set '--nnodes' appropriately.", n, available)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	for rank := 0; rank < n; rank++ {
		want := strconv.Itoa(rank)
		if e.env.VisibleSet {
			want = e.env.VisibleDevs[rank]
		}
		gpu, err := openGPUDevice(e.env, want)
		if err != nil {
			return fmt.Errorf("RuntimeError: CUDA error: invalid device ordinal (rank %d, device %q)", rank, want)
		}
		cmd := &exec.Cmd{
			Path:   exe,
			Args:   []string{workerTitle(rank), workerArg, strconv.Itoa(rank), want},
			Env:    append(os.Environ(), worldSizeEnv+"="+strconv.Itoa(n)),
			Stdout: os.Stdout,
			Stderr: os.Stderr,
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		w := &tpWorker{rank: rank, gpu: gpu, cmd: cmd, in: in, done: make(chan struct{})}
		e.workersMu.Lock()
		e.workers = append(e.workers, w)
		e.workersMu.Unlock()
		go func() {
			cmd.Wait()
			close(w.done)
			e.workerGone(w)
		}()
	}
	return nil
}

// workerGone: a worker exited. Unless the engine is exiting itself, the
// executor fails and the engine dies with it.
func (e *engine) workerGone(w *tpWorker) {
	if e.exiting.Load() {
		return
	}
	e.log.error(e.src("multiproc_executor.py:153", "multiproc_worker_utils.py:123"), "Worker proc VllmWorker-%d died unexpectedly, shutting down executor.", w.rank)
	if e.loaded.Load() {
		e.log.stderrLines(engineRuntimeTrace(e.env.Era, fmt.Sprintf("RuntimeError: Worker failed with error 'Worker proc VllmWorker-%d died unexpectedly', please check the stack trace above for the root cause", w.rank))...)
	}
	e.send(formatMsg("dead", "reason", "worker"))
	e.exit(1)
}

// stopWorkers closes every death pipe and waits a moment for the
// workers to free their memory, as the executor's shutdown does.
func (e *engine) stopWorkers() {
	e.workersMu.Lock()
	workers := append([]*tpWorker(nil), e.workers...)
	e.workersMu.Unlock()
	for _, w := range workers {
		w.inMu.Lock()
		w.in.Close()
		w.inMu.Unlock()
	}
	deadline := time.After(5 * time.Second)
	for _, w := range workers {
		select {
		case <-w.done:
		case <-deadline:
			return
		}
	}
}

// runWorker is one VLLM::Worker_TP{n} process: `__worker RANK DEVICE`.
func runWorker(argv []string) int {
	if len(argv) != 2 {
		fmt.Fprintln(os.Stderr, "fakevllm worker: want RANK DEVICE")
		return 2
	}
	rank, err := strconv.Atoi(argv[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakevllm worker: bad rank", argv[0])
		return 2
	}
	env, err := loadEnv(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	gpu, err := openGPUDevice(env, argv[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakevllm worker:", err)
		return 1
	}
	pid := os.Getpid()
	stats := &writeStats{}
	proc := fmt.Sprintf("Worker_TP%d", rank)
	if env.Era == eraV0 {
		proc = "VllmWorkerProcess"
	}
	log := newLogger(env.Era, proc, pid, &streamWriter{w: os.Stdout, stats: stats}, &streamWriter{w: os.Stderr, stats: stats})
	var mu sync.Mutex
	exit := func(code int) {
		mu.Lock() // the first caller exits; others wait for the end
		gpu.clearUsage(pid)
		os.Exit(code)
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM)
	signal.Ignore(syscall.SIGINT) // the API process owns Ctrl-C
	go func() {
		<-sig
		exit(1) // SystemExit in the worker's busy loop
	}()
	log.info("parallel_state.py:1165", "rank %d in world size %s is assigned as DP rank 0, PP rank 0, TP rank %d, EP rank %d", rank, os.Getenv(worldSizeEnv), rank, rank)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		m, err := parseMsg(sc.Text())
		if err != nil || m.Kind != "mem" {
			continue
		}
		if n, err := m.int("used"); err == nil {
			gpu.setUsage(pid, n)
		}
	}
	// Death pipe closed: the EngineCore is gone.
	exit(0)
	return 0
}

// worldSizeEnv passes the world size to the workers, for their first line.
const worldSizeEnv = "FAKEVLLM_WORLD_SIZE"
