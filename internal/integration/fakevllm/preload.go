package main

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// `vllm preload` as vLLM 0.32.0 has it (entrypoints/cli/preload.py,
// model_executor/model_loader/weight_cache/daemon.py; docs/standby-facts.md):
//
//	fakevllm preload [--model M] [-tp N] [--weight-cache-socket-dir D]
//	    [--weight-cache-health-port P] [--weight-cache-health-host H]
//	    [--weight-cache-master-port P] [--load-format F] [--dtype T]
//	    [--max-model-len N] [--gpu-memory-utilization F] [--enforce-eager]
//
// The launcher (the process started) spawns one daemon per local rank
// (multiprocessing "spawn", named vllm-weight-cache-target-<rank>; here a
// re-execution "__wcdaemon"), in its process group. Each daemon loads its
// shard from disk (the shard bar; its weights published in the stand-in
// NVML under its own pid), binds its socket
// DIR/vllm_weight_cache_<md5 of the GPU UUID>.sock (DIR: the socket dir,
// else $TMPDIR/vllm_weight_cache_<uid>), holding DIR/….sock.lock, and
// serves engines on it. Once every rank serves, the launcher logs
// "===== Weight cache daemon READY: ... =====" and its /health (only with
// --weight-cache-health-port) answers 200; 503 before, and as soon as any
// daemon exited. A daemon that exits during startup: the launcher logs
// it, terminates the rest and exits. After that it waits for every daemon
// and exits with the largest exit code (Python's: a daemon killed by a
// signal has exit code -N, so SIGKILL of the only daemon makes the
// launcher exit 247). SIGTERM or SIGINT: it terminates the daemons.
//
// There is no model argument: --model (EngineArgs' default
// Qwen/Qwen3-0.6B when absent). --load-format ipc_cache is refused (the
// daemon loads from disk), and so is a platform without CUDA IPC (the CPU
// build, FAKEVLLM_DEVICE=cpu), before any daemon starts.

const daemonArg = "__wcdaemon"

type preloadArgs struct {
	Model        string
	TP           int
	SocketDir    string
	HealthPort   int // -1: none
	HealthHost   string
	LoadFormat   string
	passthrough  []string
	modelFlagSet bool
}

var preloadFlags = map[string]bool{ // true: takes a value
	"--model": true, "--tensor-parallel-size": true, "--weight-cache-socket-dir": true,
	"--weight-cache-health-port": true, "--weight-cache-health-host": true,
	"--weight-cache-master-port": true, "--weight-cache-draft-master-port": true,
	"--load-format": true, "--dtype": true, "--max-model-len": true, "--gpu-memory-utilization": true,
	"--enforce-eager": false, "--served-model-name": true,
	// More of EngineArgs' flags (preload takes them all): those that shape
	// the weights, as the guard passes them on from vLLM's command.
	"--pipeline-parallel-size": true, "--data-parallel-size": true, "--quantization": true, "--revision": true,
	"--code-revision": true, "--trust-remote-code": false, "--download-dir": true, "--hf-overrides": true,
	"--speculative-config": true, "--hf-token": true,
}

func parsePreloadArgs(argv []string) (*preloadArgs, error) {
	p := &preloadArgs{Model: "Qwen/Qwen3-0.6B", TP: 1, HealthPort: -1, HealthHost: "0.0.0.0"}
	for i := 0; i < len(argv); i++ {
		tok := argv[i]
		if tok == "-h" || tok == "--help" {
			return nil, errHelp
		}
		name, val, hasVal := strings.Cut(tok, "=")
		if name == "-tp" {
			name = "--tensor-parallel-size"
		}
		name = strings.ReplaceAll(name, "_", "-")
		takes, known := preloadFlags[name]
		if !known {
			return nil, &argError{msg: "unrecognized arguments: " + tok}
		}
		if takes && !hasVal {
			if i+1 >= len(argv) {
				return nil, &argError{msg: fmt.Sprintf("argument %s: expected one argument", name)}
			}
			i++
			val = argv[i]
		}
		var err error
		switch name {
		case "--model":
			p.Model, p.modelFlagSet = val, true
		case "--tensor-parallel-size":
			p.TP, err = strconv.Atoi(val)
			if err != nil || p.TP < 1 {
				return nil, &argError{msg: fmt.Sprintf("argument %s: invalid int value: '%s'", name, val)}
			}
		case "--weight-cache-socket-dir":
			p.SocketDir = val
		case "--weight-cache-health-port":
			p.HealthPort, err = strconv.Atoi(val)
			if err != nil {
				return nil, &argError{msg: fmt.Sprintf("argument %s: invalid int value: '%s'", name, val)}
			}
		case "--weight-cache-health-host":
			p.HealthHost = val
		case "--load-format":
			p.LoadFormat = val
		}
		if name != "--weight-cache-socket-dir" && name != "--weight-cache-health-port" && name != "--weight-cache-health-host" &&
			name != "--weight-cache-master-port" && name != "--weight-cache-draft-master-port" {
			p.passthrough = append(p.passthrough, name+"="+val)
		}
	}
	return p, nil
}

func runPreload(argv []string) int {
	stats := &writeStats{}
	out := &streamWriter{w: os.Stdout, stats: stats}
	errw := &streamWriter{w: os.Stderr, stats: stats}
	env, err := loadEnv(os.LookupEnv)
	if err != nil {
		errw.write([]byte(err.Error() + "\n"))
		return 2
	}
	p, err := parsePreloadArgs(argv)
	if err != nil {
		if err == errHelp {
			out.write([]byte("usage: vllm preload --model <model> [options]\n\nLaunch weight cache daemons (one per GPU) that keep post-quantized weights in GPU memory and serve them to engines over CUDA IPC.\n"))
			return 0
		}
		errw.write([]byte("usage: vllm preload --model <model> [options]\nvllm preload: error: " + err.Error() + "\n"))
		return 2
	}
	pid := os.Getpid()
	log := newLogger(env.Era, "MainProcess", pid, out, errw)
	trace := func(tail []frame, exc string) int {
		log.stderrLines(traceback("", append([]frame{
			{file: "/usr/local/bin/vllm", line: 10, fn: "<module>", code: "sys.exit(main())"},
			vf("vllm/entrypoints/cli/main.py", 120, "main", "args.dispatch_function(args)"),
		}, tail...), exc)...)
		return 1
	}
	if p.LoadFormat == "ipc_cache" {
		return trace([]frame{vf("vllm/entrypoints/cli/preload.py", 169, "cmd", "raise ValueError(")},
			"ValueError: The weight cache daemon itself must load from disk; use the default --load-format")
	}
	if env.Device == "cpu" {
		return trace([]frame{
			vf("vllm/entrypoints/cli/preload.py", 176, "cmd", "check_ipc_platform_support()"),
			vf("vllm/model_executor/model_loader/weight_cache/protocol.py", 85, "check_ipc_platform_support", "raise UnsupportedPlatformForIPCError("),
		}, "vllm.model_executor.model_loader.weight_cache.protocol.UnsupportedPlatformForIPCError: "+ipcCPURefusal)
	}
	exe, err := os.Executable()
	if err != nil {
		return trace(nil, "OSError: "+err.Error())
	}

	var ready atomic.Int32
	var exited atomic.Bool
	if p.HealthPort >= 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(p.HealthHost, strconv.Itoa(p.HealthPort)))
		if err != nil {
			return trace(nil, fmt.Sprintf("OSError: [Errno 98] error while attempting to bind on address (%s, %d): address already in use", pyStr(p.HealthHost), p.HealthPort))
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
				return
			}
			if int(ready.Load()) == p.TP && !exited.Load() {
				w.WriteHeader(http.StatusOK)
				return
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		})
		go http.Serve(ln, mux)
	}

	type daemon struct {
		cmd  *exec.Cmd
		done chan struct{}
		code int
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return trace(nil, "OSError: "+err.Error())
	}
	var ds []*daemon
	var mu sync.Mutex
	stopping := false
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	for rank := 0; rank < p.TP; rank++ {
		args := ([]string{"vllm-weight-cache-target-" + strconv.Itoa(rank), daemonArg,
			"--rank=" + strconv.Itoa(rank), "--tensor-parallel-size=" + strconv.Itoa(p.TP),
			"--model=" + p.Model, "--socket-dir=" + p.SocketDir})
		cmd := &exec.Cmd{Path: exe, Args: args, Env: os.Environ(), Stdout: os.Stdout, Stderr: os.Stderr, ExtraFiles: []*os.File{readyW}}
		if err := cmd.Start(); err != nil {
			return trace(nil, "OSError: "+err.Error())
		}
		d := &daemon{cmd: cmd, done: make(chan struct{})}
		ds = append(ds, d)
		go func() {
			err := cmd.Wait()
			d.code = pyExitCode(cmd.ProcessState, err)
			exited.Store(true)
			close(d.done)
		}()
	}
	readyW.Close()
	terminate := func() {
		mu.Lock()
		defer mu.Unlock()
		stopping = true
		for _, d := range ds {
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	go func() {
		for range sig {
			terminate()
		}
	}()
	readyCh := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(readyR)
		for sc.Scan() {
			if ready.Add(1) == int32(p.TP) {
				close(readyCh)
			}
		}
	}()
	waitAll := func() int {
		code := 0
		for i, d := range ds {
			<-d.done
			if i == 0 || d.code > code {
				code = d.code
			}
		}
		return code & 0xff
	}
	anyDone := make(chan struct{})
	for _, d := range ds {
		go func(d *daemon) {
			<-d.done
			select {
			case <-anyDone:
			default:
				mu.Lock()
				select {
				case <-anyDone:
				default:
					close(anyDone)
				}
				mu.Unlock()
			}
		}(d)
	}
	select {
	case <-readyCh:
	case <-anyDone:
		mu.Lock()
		wasStopping := stopping
		mu.Unlock()
		if !wasStopping {
			var codes []string
			for _, d := range ds {
				select {
				case <-d.done:
					codes = append(codes, strconv.Itoa(d.code))
				default:
				}
			}
			log.error("preload.py:305", "Weight cache daemon rank(s) exited during startup (exitcodes=[%s]); shutting down.", strings.Join(codes, ", "))
			terminate()
		}
		return waitAll()
	}
	where := p.SocketDir
	if where == "" {
		where = "the default socket dir"
	}
	log.info("preload.py:322", "===== Weight cache daemon READY: node 0/1 serving %d local rank(s) x 1 role(s) in %s =====", p.TP, where)
	return waitAll()
}

// pyExitCode is multiprocessing's exitcode: -N for a death by signal N.
func pyExitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		return 1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -int(ws.Signal())
	}
	return ps.ExitCode()
}

// runWeightCacheDaemon is one rank's daemon (daemon.py WeightCacheDaemon).
func runWeightCacheDaemon(argv []string) int {
	env, err := loadEnv(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var rank, tp int
	var model, sockDir string
	for _, a := range argv {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "--rank":
			rank, _ = strconv.Atoi(v)
		case "--tensor-parallel-size":
			tp, _ = strconv.Atoi(v)
		case "--model":
			model = v
		case "--socket-dir":
			sockDir = v
		}
	}
	tp = max(tp, 1)
	pid := os.Getpid()
	stats := &writeStats{}
	log := newLogger(env.Era, "vllm-weight-cache-target-"+strconv.Itoa(rank), pid,
		&streamWriter{w: os.Stdout, stats: stats}, &streamWriter{w: os.Stderr, stats: stats})
	fail := func(exc string) int {
		log.stderrLines(traceback("Process vllm-weight-cache-target-"+strconv.Itoa(rank)+":", append(append([]frame{}, engineProcFrames...),
			vf("vllm/model_executor/model_loader/weight_cache/daemon.py", 471, "_run_daemon", "daemon.serve_forever(")), exc)...)
		return 1
	}
	want := ""
	if rank < len(env.VisibleDevs) {
		want = env.VisibleDevs[rank]
	} else if env.VisibleSet {
		return fail("RuntimeError: CUDA error: invalid device ordinal")
	} else {
		want = strconv.Itoa(rank)
	}
	gpu, err := openGPUDevice(env, want)
	if err != nil {
		return fail("RuntimeError: " + err.Error())
	}
	held := env.Weights / int64(tp)
	var used atomic.Int64
	publish := func(b int64) {
		used.Store(b)
		_ = gpu.setUsage(pid, b)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sig
		// Python's default: the daemon dies of the signal, its socket file
		// left behind (the lock goes with the process).
		gpu.clearUsage(pid)
		signal.Reset(s.(syscall.Signal))
		_ = syscall.Kill(pid, s.(syscall.Signal))
	}()

	// Load from disk, as the engine does.
	if others := gpu.othersUsed(pid); gpu.dev.Reserved+others+held > gpu.dev.Total {
		return fail(fmt.Sprintf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is free.",
			torchSize(held), rank, torchSize(gpu.dev.Total), torchSize(max(0, gpu.dev.Total-gpu.dev.Reserved-others))))
	}
	publish(held)
	shards := max(1, min(int((held*int64(tp)+5*gib-1)/(5*gib)), 64))
	bar := log.shards(shards)
	runPhase(env.LoadWeights, shards, env.ProgressEvery, func(step int) {
		if step > 0 && step < shards {
			bar.step(step)
		}
	})
	bar.step(shards)
	bar.close(shards)
	log.info("daemon.py:283", "Weight cache target daemon rank %d loaded model (%s GiB allocated, %s GiB reserved)", rank, formatGiB(held), formatGiB(held))

	// Serve: the socket is bound only once the weights are in.
	path := weightCacheSocket(env, sockDir, gpu.dev.UUID)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fail("OSError: " + err.Error())
	}
	if sockDir == "" {
		_ = os.Chmod(filepath.Dir(path), 0o700)
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fail("OSError: " + err.Error())
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fail("vllm.model_executor.model_loader.weight_cache.protocol.WeightCacheUnavailableError: Another weight cache daemon already owns " + path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fail("OSError: " + err.Error())
	}
	_ = os.Chmod(path, 0o600)
	log.info("daemon.py:366", "Weight cache target daemon rank %d serving on %s", rank, path)
	readyPipe := os.NewFile(3, "ready")
	readyPipe.WriteString(formatMsg("ready", "rank", rank))
	readyPipe.Close()

	key := ipcKey(model, tp, rank)
	var released, sent atomic.Bool
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0
			}
			continue
		}
		func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				log.warn("daemon.py:379", "Client disconnected mid-request")
				return
			}
			m, err := parseMsg(line)
			if err != nil {
				return
			}
			switch m.Kind {
			case "get_memory":
				c.Write([]byte(formatMsg("ok", "memory_bytes", used.Load(), "pid", pid)))
			case "get_state":
				got := strings.TrimSpace(strings.TrimPrefix(line, "get_state"))
				if got != key {
					fields := mismatchedFields(key, got)
					log.warn("daemon.py:455", "WeightCacheKey mismatch on fields: %s", pyList(fields))
					c.Write([]byte(formatMsg("mismatch", "fields", strings.Join(fields, ","))))
					return
				}
				if released.Load() {
					c.Write([]byte(formatMsg("error", "message", "Weights_were_released")))
					return
				}
				c.Write([]byte(formatMsg("ok", "tensors", ipcTensors, "pid", pid, "gpu_uuid", gpu.dev.UUID)))
				if sent.CompareAndSwap(false, true) {
					log.info("daemon.py:475", "Weight cache target daemon rank %d sent %d tensors (+%d aliases) to engine", rank, ipcTensors, 1)
				}
			case "release":
				released.Store(true)
				publish(0)
				log.info("daemon.py:485", "Weight cache target daemon rank %d released cached weights", rank)
				c.Write([]byte("ok\n"))
			default:
				c.Write([]byte(formatMsg("error", "message", "Unknown_command")))
			}
		}()
	}
}

// mismatchedFields names the WeightCacheKey fields that differ.
func mismatchedFields(want, got string) []string {
	parse := func(s string) map[string]string {
		m := map[string]string{}
		for _, kv := range strings.Fields(s) {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		return m
	}
	w, g := parse(want), parse(got)
	var out []string
	for _, k := range []string{"checkpoint", "tp_size", "tp_rank"} {
		if w[k] != g[k] {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		out = []string{"checkpoint"}
	}
	return out
}

// formatGiB is vLLM's format_gib: round(b / GiB, 2), as Python prints it.
func formatGiB(b int64) string {
	s := strconv.FormatFloat(math.Round(float64(b)/float64(gib)*100)/100, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
