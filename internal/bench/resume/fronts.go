package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/benchnginx"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/procmark"
)

// front is what the clients talk to: vLLM itself restarted as systemd
// would, nginx with its retry in front of that, or the guard's proxy.
type front interface {
	url() string
	// deaths are the times vLLM's process was seen to exit, oldest first.
	deaths() []time.Time
	// readies counts vLLM's starts that reached ready.
	readies() int
	stop()
}

// runEnv is one (scenario, front): its folder, GPU state, port and tag.
type runEnv struct {
	b      bins
	dir    string
	gpuDir string
	tag    string
	port   int
	simEnv map[string]string
}

// The device the simulator sees (the admission bench's): 80 GiB, 512 MiB
// reserved.
const (
	deviceLine = "GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3"
	model      = "test-model"
	maxNumSeqs = 256
	util       = 0.9
)

func newRunEnv(b bins, scratch, name string, sim map[string]string) (*runEnv, error) {
	dir := filepath.Join(scratch, name)
	gpuDir := filepath.Join(dir, "gpu")
	if err := os.MkdirAll(filepath.Join(gpuDir, "procs"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(gpuDir, "devices"), []byte(deviceLine+"\n"), 0o644); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	tag := fmt.Sprintf("benchresume-%d-%s", os.Getpid(), name)
	env := map[string]string{
		"FAKEVLLM_TEST_ID":        tag,
		"FAKEVLLM_ERA":            "v1",
		"FAKEVLLM_TOKEN_INTERVAL": tokenInterval.String(),
		"FAKEVLLM_LOAD_WEIGHTS":   loadWeights.String(),
		"FAKEVLLM_TICK":           "20ms",
		"FAKEVLLM_ORPHAN_TTL":     "30s",
	}
	for k, v := range sim {
		env[k] = strings.ReplaceAll(v, "$DIR", dir)
	}
	return &runEnv{b: b, dir: dir, gpuDir: gpuDir, tag: tag, port: port, simEnv: env}, nil
}

// vllmArgs is the command line of vLLM direct: the guard's first rung's.
func (e *runEnv) vllmArgs() []string {
	return append([]string{"serve", model, "--max-num-seqs", fmt.Sprint(maxNumSeqs), "--gpu-memory-utilization", fmt.Sprint(util),
		"--host", "127.0.0.1", "--port", strconv.Itoa(e.port)}, simArgs()...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// cleanEnv is this process's environment without the simulator's and the
// stand-in NVML's variables, plus extra.
func cleanEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "FAKEVLLM_") || strings.HasPrefix(kv, "FAKENVML_") || strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// waitHTTP waits until url answers 200, exited closes, or timeout passes.
func waitHTTP(url string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer 200 after %s (last: %v)", url, timeout, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("the process behind %s exited before it answered", url)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// restarter runs the simulator and starts it again restartDelay after
// each exit, with the same command line: systemd's Restart=always.
type restarter struct {
	e       *runEnv
	stopped chan struct{}
	done    chan struct{}

	mu           sync.Mutex
	exitTimes    []time.Time
	ready        int
	cur          *exec.Cmd
	firstReady   chan struct{}
	readyOnce    sync.Once
	startFailure error
}

func startRestarter(ctx context.Context, e *runEnv) (*restarter, error) {
	r := &restarter{e: e, stopped: make(chan struct{}), done: make(chan struct{}), firstReady: make(chan struct{})}
	go r.loop()
	select {
	case <-r.firstReady:
	case <-ctx.Done():
		r.stop()
		return nil, ctx.Err()
	case <-r.done:
		return nil, fmt.Errorf("the simulator did not start: %v", r.startFailure)
	case <-time.After(60 * time.Second):
		r.stop()
		return nil, errors.New("the simulator was not ready within 60s")
	}
	if err := waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/health", e.port), r.done, 30*time.Second); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

func (r *restarter) loop() {
	defer close(r.done)
	for {
		err := r.once()
		r.mu.Lock()
		if err != nil {
			r.startFailure = err
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		select {
		case <-r.stopped:
			return
		case <-time.After(restartDelay):
		}
	}
}

// once runs the simulator to its exit (and its process group's).
func (r *restarter) once() error {
	cmd := exec.Command(r.e.b.fakevllm, r.e.vllmArgs()...)
	cmd.Env = cleanEnv(merge(r.e.simEnv, map[string]string{"FAKENVML_STATE": r.e.gpuDir}))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	r.mu.Lock()
	select {
	case <-r.stopped:
		r.mu.Unlock()
		pr.Close()
		pw.Close()
		return nil
	default:
	}
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		pr.Close()
		pw.Close()
		return fmt.Errorf("start %s: %w", r.e.b.fakevllm, err)
	}
	r.cur = cmd
	r.mu.Unlock()
	pw.Close()
	read := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Application startup complete.") {
				r.mu.Lock()
				r.ready++
				r.mu.Unlock()
				r.readyOnce.Do(func() { close(r.firstReady) })
			}
		}
		pr.Close()
		close(read)
	}()
	cmd.Wait()
	at := time.Now()
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-read
	r.mu.Lock()
	r.cur = nil
	select {
	case <-r.stopped: // the bench's own stop is no death
	default:
		r.exitTimes = append(r.exitTimes, at)
	}
	r.mu.Unlock()
	return nil
}

func (r *restarter) deaths() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.exitTimes...)
}

func (r *restarter) readies() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready
}

// stop ends the simulator: SIGTERM to its group, SIGKILL after 10 s.
func (r *restarter) stop() {
	r.mu.Lock()
	select {
	case <-r.stopped:
	default:
		close(r.stopped)
	}
	cur := r.cur
	r.mu.Unlock()
	if cur != nil {
		syscall.Kill(-cur.Process.Pid, syscall.SIGTERM)
	}
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.mu.Lock()
		if r.cur != nil {
			syscall.Kill(-r.cur.Process.Pid, syscall.SIGKILL)
		}
		r.mu.Unlock()
		<-r.done
	}
}

// direct: the clients talk to vLLM itself.
type direct struct{ *restarter }

func (d direct) url() string { return fmt.Sprintf("http://127.0.0.1:%d", d.e.port) }

func startDirect(ctx context.Context, e *runEnv) (front, error) {
	r, err := startRestarter(ctx, e)
	if err != nil {
		return nil, err
	}
	return direct{r}, nil
}

// nginxFront: nginx in front of vLLM direct, with its retry: a request
// whose connection to vLLM fails, times out or gets 502/503 before any
// of the answer went to the client is tried again (proxy_next_upstream);
// max_fails=0 keeps the one upstream eligible after a failure.
type nginxFront struct {
	*restarter
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

func startNginx(ctx context.Context, e *runEnv) (front, error) {
	r, err := startRestarter(ctx, e)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		r.stop()
		return nil, err
	}
	dir := filepath.Join(e.dir, "nginx")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.stop()
		return nil, err
	}
	n := &nginxFront{restarter: r, addr: fmt.Sprintf("127.0.0.1:%d", port), exited: make(chan struct{})}
	n.cmd, err = benchnginx.WriteWith(e.b.nginx, dir, fmt.Sprintf("127.0.0.1:%d", e.port), n.addr, 0,
		"max_fails=0", "proxy_next_upstream error timeout http_502 http_503;")
	if err != nil {
		r.stop()
		return nil, err
	}
	var out bytes.Buffer
	n.cmd.Stdout, n.cmd.Stderr = &out, &out
	if err := n.cmd.Start(); err != nil {
		r.stop()
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	go func() { n.cmd.Wait(); close(n.exited) }()
	if err := waitHTTP("http://"+n.addr+"/health", n.exited, 20*time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		n.stop()
		return nil, fmt.Errorf("nginx: %w\n%s%s", err, out.String(), log)
	}
	return n, nil
}

func (n *nginxFront) url() string { return "http://" + n.addr }
func (n *nginxFront) stop() {
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(10 * time.Second):
		n.cmd.Process.Kill()
		<-n.exited
	}
	n.restarter.stop()
}

// guardFront: the guard supervises vLLM and the clients talk to its proxy.
type guardFront struct {
	e      *runEnv
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
	evDone chan struct{}

	mu        sync.Mutex
	exitTimes []time.Time
	ready     int
}

func guardConfig(e *runEnv, proxyAddr string, resume bool) string {
	var b strings.Builder
	cmd, _ := json.Marshal(append([]string{e.b.fakevllm, "serve", model}, simArgs()...))
	fmt.Fprintf(&b, "[vllm]\ncommand = %s\nport = %d\nstop_timeout = \"3s\"\n\n[vllm.env]\n", cmd, e.port)
	for k, v := range e.simEnv {
		fmt.Fprintf(&b, "%s = %q\n", k, v)
	}
	fmt.Fprintf(&b, `
[profile]
max_num_seqs = %d
gpu_memory_utilization = %g

[restart]
initial_delay = %q

[proxy]
listen = %q
queue_size = 1024
resume = %v

[control]
socket = %q
state_dir = %q

[log]
format = "json"
level = "info"
`, maxNumSeqs, util, restartDelay.String(), proxyAddr, resume, filepath.Join(e.dir, "guard.sock"), filepath.Join(e.dir, "state"))
	return b.String()
}

func startGuard(ctx context.Context, e *runEnv, resume bool) (front, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	g := &guardFront{e: e, addr: fmt.Sprintf("127.0.0.1:%d", port), exited: make(chan struct{}), evDone: make(chan struct{})}
	cfg := filepath.Join(e.dir, "vllm-guard.toml")
	if err := os.WriteFile(cfg, []byte(guardConfig(e, g.addr, resume)), 0o644); err != nil {
		return nil, err
	}
	g.cmd = exec.Command(e.b.guard, "run", "--config", cfg, "--events", "/dev/fd/3")
	g.cmd.Env = cleanEnv(map[string]string{"FAKENVML_STATE": e.gpuDir, "LD_LIBRARY_PATH": e.b.nvmlDir})
	logf, err := os.Create(filepath.Join(e.dir, "guard.log"))
	if err != nil {
		return nil, err
	}
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	evr, evw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	g.cmd.ExtraFiles = []*os.File{evw}
	ready := make(chan struct{})
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		evr.Close()
		evw.Close()
		return nil, fmt.Errorf("start %s: %w", e.b.guard, err)
	}
	evw.Close()
	logf.Close()
	go g.readEvents(evr, ready)
	go func() { g.cmd.Wait(); <-g.evDone; close(g.exited) }()
	select {
	case <-ready:
	case <-g.exited:
		return nil, fmt.Errorf("the guard exited (code %d) before vLLM was ready; its log: %s", g.cmd.ProcessState.ExitCode(), filepath.Join(e.dir, "guard.log"))
	case <-ctx.Done():
		g.stop()
		return nil, ctx.Err()
	case <-time.After(60 * time.Second):
		g.stop()
		return nil, fmt.Errorf("vLLM was not ready under the guard within 60s; its log: %s", filepath.Join(e.dir, "guard.log"))
	}
	return g, nil
}

// readEvents follows the guard's event stream: vLLM's readies and exits.
func (g *guardFront) readEvents(r io.ReadCloser, ready chan struct{}) {
	defer close(g.evDone)
	defer r.Close()
	var once sync.Once
	dec := json.NewDecoder(r)
	for {
		var ev events.Event
		if dec.Decode(&ev) != nil {
			return
		}
		at := time.Now()
		g.mu.Lock()
		switch ev.Kind {
		case events.KindReady:
			g.ready++
			once.Do(func() { close(ready) })
		case events.KindExited:
			if ev.Failure != nil && !ev.Failure.Time.IsZero() {
				at = ev.Failure.Time
			}
			g.exitTimes = append(g.exitTimes, at)
		}
		g.mu.Unlock()
	}
}

func (g *guardFront) url() string { return "http://" + g.addr }

func (g *guardFront) deaths() []time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]time.Time(nil), g.exitTimes...)
}

func (g *guardFront) readies() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ready
}

// stop: SIGTERM (the guard stops vLLM and exits), SIGKILL after 20 s.
func (g *guardFront) stop() {
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(20 * time.Second):
		g.cmd.Process.Kill()
		<-g.exited
	}
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// killTagged SIGKILLs every live process carrying the run's tag (a
// simulator that outlived its parent), and reports how many there were.
func killTagged(tag string) int {
	n := 0
	for _, pid := range procmark.Live("FAKEVLLM_TEST_ID=" + tag) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}
