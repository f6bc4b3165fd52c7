package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/vllm-guard/vllm-guard/internal/freeport"
	"github.com/vllm-guard/vllm-guard/internal/procmark"
)

// front is what the clients talk to: vLLM itself, nginx in front of it,
// or the guard's proxy. Each run has its own, over its own simulator.
type front interface {
	// url is where the clients send their requests.
	url() string
	// vllmExits are vLLM's exits so far, and how many were out of memory.
	vllmExits() (exits, ooms int)
	// admitted is the guard's proxy now (ok false for other fronts).
	admitted() (a proxyStatus, ok bool)
	// confident: the guard's cost model bounds the proxy by memory
	// (always false for other fronts).
	confident() bool
	stop()
}

// run is one (front, shape): its scratch folder, GPU state, ports and tag.
type runEnv struct {
	b       bins
	dir     string
	gpuDir  string
	tag     string // FAKEVLLM_TEST_ID of every simulator process of the run
	port    int    // vLLM's
	sample  time.Duration
	simEnv  map[string]string
	vllmCmd []string // serve MODEL and the flags the guard's rung would give
}

// The scene: the integration tests' admission scene (integration/admission_test.go).
const (
	deviceLine = "GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3"
	model      = "test-model"
	maxNumSeqs = 256
	util       = 0.8
)

func newRunEnv(b bins, scratch, name string, sample time.Duration) (*runEnv, error) {
	dir := filepath.Join(scratch, name)
	gpuDir := filepath.Join(dir, "gpu")
	if err := os.MkdirAll(filepath.Join(gpuDir, "procs"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(gpuDir, "devices"), []byte(deviceLine+"\n"), 0o644); err != nil {
		return nil, err
	}
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	tag := fmt.Sprintf("benchadm-%d-%s", os.Getpid(), name)
	return &runEnv{b: b, dir: dir, gpuDir: gpuDir, tag: tag, port: port, sample: sample,
		simEnv: map[string]string{
			"FAKEVLLM_TEST_ID":        tag,
			"FAKEVLLM_ERA":            "v1-ansi",
			"FAKEVLLM_SEQ_COST_MIB":   strconv.Itoa(seqMiB),
			"FAKEVLLM_TOKEN_COST_KIB": strconv.Itoa(tokenKiB),
			"FAKEVLLM_TOKEN_INTERVAL": tokenInterval.String(),
			"FAKEVLLM_TICK":           "20ms",
			"FAKEVLLM_ORPHAN_TTL":     "30s",
		},
	}, nil
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

// waitHTTP waits until url answers 200, the process behind it exits
// (exited closed), or timeout passes.
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

// restarter runs the simulator and restarts it 100 ms after each exit (as
// systemd's Restart=always with its default RestartSec does), always with
// the same command line. An exit counts as out of memory when the run
// printed torch's "CUDA out of memory" before it.
type restarter struct {
	e       *runEnv
	stopped chan struct{}
	done    chan struct{}

	mu           sync.Mutex
	exits, ooms  int
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
		oom, err := r.once()
		r.mu.Lock()
		if err != nil {
			r.startFailure = err
			r.mu.Unlock()
			return
		}
		r.exits++
		if oom {
			r.ooms++
		}
		r.mu.Unlock()
		select {
		case <-r.stopped:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// once runs the simulator to its exit (and its process group's), and
// reports whether it ran out of memory.
func (r *restarter) once() (oom bool, err error) {
	args := append([]string{"serve"}, r.e.vllmCmd...)
	args = append(args, "--host", "127.0.0.1", "--port", strconv.Itoa(r.e.port))
	cmd := exec.Command(r.e.b.fakevllm, args...)
	cmd.Env = cleanEnv(merge(r.e.simEnv, map[string]string{"FAKENVML_STATE": r.e.gpuDir}))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		return false, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	r.mu.Lock()
	select {
	case <-r.stopped:
		r.mu.Unlock()
		pr.Close()
		pw.Close()
		return false, nil
	default:
	}
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		pr.Close()
		pw.Close()
		return false, fmt.Errorf("start %s: %w", r.e.b.fakevllm, err)
	}
	r.cur = cmd
	r.mu.Unlock()
	pw.Close()
	read := make(chan bool)
	go func() {
		saw := false
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			saw = saw || strings.Contains(line, "torch.OutOfMemoryError: CUDA out of memory")
			if strings.Contains(line, "Application startup complete.") {
				r.readyOnce.Do(func() { close(r.firstReady) })
			}
		}
		pr.Close()
		read <- saw
	}()
	cmd.Wait()
	// The API process is gone: nothing of its group may outlive it.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	oom = <-read
	r.mu.Lock()
	r.cur = nil
	r.mu.Unlock()
	return oom, nil
}

func (r *restarter) vllmExits() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exits, r.ooms
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

func (d direct) url() string                   { return fmt.Sprintf("http://127.0.0.1:%d", d.e.port) }
func (d direct) admitted() (proxyStatus, bool) { return proxyStatus{}, false }
func (d direct) confident() bool               { return false }
func startDirect(ctx context.Context, e *runEnv) (front, error) {
	r, err := startRestarter(ctx, e)
	if err != nil {
		return nil, err
	}
	return direct{r}, nil
}

// nginxFront: nginx with limit_conn at max_num_seqs in front of vLLM
// (one zone for the whole server: at most max_num_seqs requests proxied
// at once, the rest get nginx's default limit_conn_status, 503).
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
	port, err := freeport.Pick()
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
	n.cmd, err = benchnginx.Write(e.b.nginx, dir, fmt.Sprintf("127.0.0.1:%d", e.port), n.addr, maxNumSeqs)
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
	// nginx's own /health is vLLM's through it.
	if err := waitHTTP("http://"+n.addr+"/health", n.exited, 20*time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		n.stop()
		return nil, fmt.Errorf("nginx: %w\n%s%s", err, out.String(), log)
	}
	return n, nil
}

func (n *nginxFront) url() string                   { return "http://" + n.addr }
func (n *nginxFront) admitted() (proxyStatus, bool) { return proxyStatus{}, false }
func (n *nginxFront) confident() bool               { return false }
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

// guardFront: the guard supervises vLLM and clients talk to its proxy.
type guardFront struct {
	e      *runEnv
	addr   string
	sock   string
	cmd    *exec.Cmd
	exited chan struct{}
	evDone chan struct{}

	mu          sync.Mutex
	exits       int
	ooms        int
	isConfident bool
}

// guardConfig is the integration tests' admission scene, with the guard's
// default GPU sampling interval unless -sample-interval says otherwise.
func guardConfig(e *runEnv, proxyAddr string) string {
	var b strings.Builder
	cmd, _ := json.Marshal(append([]string{e.b.fakevllm, "serve"}, model))
	fmt.Fprintf(&b, "[vllm]\ncommand = %s\nport = %d\nstop_timeout = \"3s\"\n\n[vllm.env]\n", cmd, e.port)
	for k, v := range e.simEnv {
		fmt.Fprintf(&b, "%s = %q\n", k, v)
	}
	fmt.Fprintf(&b, `
[profile]
max_num_seqs = %d
max_num_seqs_factor = 0.9
gpu_memory_utilization = %g
min_gpu_memory_utilization = %g
headroom = 0.005

[restart]
initial_delay = "200ms"

[gpu]
sample_interval = %q

[proxy]
listen = %q
queue_size = 1024
queue_timeout = "30s"

[control]
socket = %q
state_dir = %q

[log]
format = "json"
level = "info"
`, maxNumSeqs, util, util, e.sample.String(), proxyAddr, filepath.Join(e.dir, "guard.sock"), filepath.Join(e.dir, "state"))
	return b.String()
}

func startGuard(ctx context.Context, e *runEnv) (front, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	g := &guardFront{e: e, addr: fmt.Sprintf("127.0.0.1:%d", port), sock: filepath.Join(e.dir, "guard.sock"),
		exited: make(chan struct{}), evDone: make(chan struct{})}
	cfg := filepath.Join(e.dir, "vllm-guard.toml")
	if err := os.WriteFile(cfg, []byte(guardConfig(e, g.addr)), 0o644); err != nil {
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

// readEvents follows the guard's event stream: vLLM's exits, their causes,
// the cost model's confidence; ready is closed at the first ready.
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
		g.mu.Lock()
		switch ev.Kind {
		case events.KindReady:
			once.Do(func() { close(ready) })
		case events.KindExited:
			g.exits++
			if ev.Failure != nil && ev.Failure.Verdict.Cause == "oom" {
				g.ooms++
			}
		case events.KindAdmission:
			g.isConfident = ev.Admission.Confident && ev.Admission.Bound == "memory"
		}
		g.mu.Unlock()
	}
}

func (g *guardFront) url() string { return "http://" + g.addr }

func (g *guardFront) vllmExits() (int, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.exits, g.ooms
}

func (g *guardFront) confident() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.isConfident
}

// proxyStatus is the proxy part of `vllm-guard status --json`.
type proxyStatus struct {
	Limit    int    `json:"limit"`
	Inflight int    `json:"inflight"`
	Queued   int    `json:"queued"`
	Bound    string `json:"bound"`
	Why      string `json:"bound_reason"`
}

func (g *guardFront) admitted() (proxyStatus, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, g.e.b.guard, "status", "--json", "--socket", g.sock).Output()
	if len(out) == 0 {
		return proxyStatus{}, false
	}
	var st struct {
		Proxy *proxyStatus `json:"proxy"`
	}
	if json.Unmarshal(out, &st) != nil || st.Proxy == nil {
		return proxyStatus{}, false
	}
	_ = err // status exits 1 while vLLM is not ready; the document is still there
	return *st.Proxy, true
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
