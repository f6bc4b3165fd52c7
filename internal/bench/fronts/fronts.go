// Package fronts is what the benchmarks' clients talk to, each over its
// own simulator: vLLM direct restarted as systemd would (Restarter),
// nginx in front of that (Nginx), or the guard's proxy (Guard). The
// admission and resume benchmarks share it; each says what it counts.
package fronts

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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/freeport"
	"github.com/vllm-guard/vllm-guard/internal/procmark"
)

// Bins are the programs a run starts.
type Bins struct{ Guard, Fakevllm, NvmlDir, Nginx string }

// DeviceLine is the device the simulator sees: 80 GiB, 512 MiB reserved.
const DeviceLine = "GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3"

// Env is one run: its folder, GPU state, vLLM's port and the tag of
// every simulator process of the run.
type Env struct {
	Bins   Bins
	Dir    string
	GPUDir string
	Tag    string // FAKEVLLM_TEST_ID of every simulator process of the run
	Port   int    // vLLM's
	SimEnv map[string]string
	// Args is the simulator's command line after the binary (vLLM
	// direct's); RestartDelay the pause before each restart.
	Args         []string
	RestartDelay time.Duration
}

// NewEnv makes the run's folder under scratch and its stand-in GPU, and
// picks vLLM's port.
func NewEnv(b Bins, scratch, name, tag string) (*Env, error) {
	dir := filepath.Join(scratch, name)
	gpuDir := filepath.Join(dir, "gpu")
	if err := os.MkdirAll(filepath.Join(gpuDir, "procs"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(gpuDir, "devices"), []byte(DeviceLine+"\n"), 0o644); err != nil {
		return nil, err
	}
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	return &Env{Bins: b, Dir: dir, GPUDir: gpuDir, Tag: tag, Port: port}, nil
}

// CleanEnv is this process's environment without the simulator's and the
// stand-in NVML's variables, plus extra.
func CleanEnv(extra map[string]string) []string {
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

// WaitHTTP waits until url answers 200, the process behind it exits
// (exited closed), or timeout passes.
func WaitHTTP(url string, exited <-chan struct{}, timeout time.Duration) error {
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

// Exit is one exit of the simulator under a Restarter.
type Exit struct {
	At      time.Time
	OOM     bool // the run printed torch's "CUDA out of memory" before it
	Stopped bool // the exit came after Stop: the bench's own
}

// Restarter runs the simulator and starts it again RestartDelay after
// each exit, always with the same command line: systemd's Restart=always.
type Restarter struct {
	E       *Env
	stopped chan struct{}
	done    chan struct{}

	mu           sync.Mutex
	exits        []Exit
	ready        int
	cur          *exec.Cmd
	firstReady   chan struct{}
	readyOnce    sync.Once
	startFailure error
}

// StartRestarter starts the simulator and waits for its /health.
func StartRestarter(ctx context.Context, e *Env) (*Restarter, error) {
	r := &Restarter{E: e, stopped: make(chan struct{}), done: make(chan struct{}), firstReady: make(chan struct{})}
	go r.loop()
	select {
	case <-r.firstReady:
	case <-ctx.Done():
		r.Stop()
		return nil, ctx.Err()
	case <-r.done:
		return nil, fmt.Errorf("the simulator did not start: %v", r.startFailure)
	case <-time.After(60 * time.Second):
		r.Stop()
		return nil, errors.New("the simulator was not ready within 60s")
	}
	if err := WaitHTTP(fmt.Sprintf("http://127.0.0.1:%d/health", e.Port), r.done, 30*time.Second); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

func (r *Restarter) loop() {
	defer close(r.done)
	for {
		err := r.once()
		if err != nil {
			r.mu.Lock()
			r.startFailure = err
			r.mu.Unlock()
			return
		}
		select {
		case <-r.stopped:
			return
		case <-time.After(r.E.RestartDelay):
		}
	}
}

// once runs the simulator to its exit (and its process group's).
func (r *Restarter) once() error {
	cmd := exec.Command(r.E.Bins.Fakevllm, r.E.Args...)
	cmd.Env = CleanEnv(Merge(r.E.SimEnv, map[string]string{"FAKENVML_STATE": r.E.GPUDir}))
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
		return fmt.Errorf("start %s: %w", r.E.Bins.Fakevllm, err)
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
				r.mu.Lock()
				r.ready++
				r.mu.Unlock()
				r.readyOnce.Do(func() { close(r.firstReady) })
			}
		}
		pr.Close()
		read <- saw
	}()
	cmd.Wait()
	at := time.Now()
	// The API process is gone: nothing of its group may outlive it.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	oom := <-read
	r.mu.Lock()
	r.cur = nil
	stopped := false
	select {
	case <-r.stopped:
		stopped = true
	default:
	}
	r.exits = append(r.exits, Exit{At: at, OOM: oom, Stopped: stopped})
	r.mu.Unlock()
	return nil
}

// Exits are the simulator's exits so far, oldest first.
func (r *Restarter) Exits() []Exit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Exit(nil), r.exits...)
}

// Readies counts the simulator's starts that reached ready.
func (r *Restarter) Readies() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready
}

// URL is vLLM's own.
func (r *Restarter) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", r.E.Port) }

// Stop ends the simulator: SIGTERM to its group, SIGKILL after 10 s.
func (r *Restarter) Stop() {
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

// Nginx is nginx in front of vLLM direct (a Restarter).
type Nginx struct {
	*Restarter
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// NginxConfig writes nginx's configuration into dir, proxying listen to
// upstream, and returns the command that runs it.
type NginxConfig func(nginx, dir, upstream, listen string) (*exec.Cmd, error)

// StartNginx starts vLLM direct, then nginx configured by write in front.
func StartNginx(ctx context.Context, e *Env, write NginxConfig) (*Nginx, error) {
	r, err := StartRestarter(ctx, e)
	if err != nil {
		return nil, err
	}
	port, err := freeport.Pick()
	if err != nil {
		r.Stop()
		return nil, err
	}
	dir := filepath.Join(e.Dir, "nginx")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.Stop()
		return nil, err
	}
	n := &Nginx{Restarter: r, addr: fmt.Sprintf("127.0.0.1:%d", port), exited: make(chan struct{})}
	n.cmd, err = write(e.Bins.Nginx, dir, fmt.Sprintf("127.0.0.1:%d", e.Port), n.addr)
	if err != nil {
		r.Stop()
		return nil, err
	}
	var out bytes.Buffer
	n.cmd.Stdout, n.cmd.Stderr = &out, &out
	if err := n.cmd.Start(); err != nil {
		r.Stop()
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	go func() { n.cmd.Wait(); close(n.exited) }()
	// nginx's own /health is vLLM's through it.
	if err := WaitHTTP("http://"+n.addr+"/health", n.exited, 20*time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		n.Stop()
		return nil, fmt.Errorf("nginx: %w\n%s%s", err, out.String(), log)
	}
	return n, nil
}

// URL is nginx's.
func (n *Nginx) URL() string { return "http://" + n.addr }

// Stop ends nginx (SIGTERM, SIGKILL after 10 s), then the simulator.
func (n *Nginx) Stop() {
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(10 * time.Second):
		n.cmd.Process.Kill()
		<-n.exited
	}
	n.Restarter.Stop()
}

// Guard is the guard supervising vLLM, its proxy in front.
type Guard struct {
	E      *Env
	Addr   string // the proxy's
	Sock   string // the control socket
	cmd    *exec.Cmd
	exited chan struct{}
	evDone chan struct{}
}

// StartGuard runs `vllm-guard run` with the configuration config writes
// for the proxy's address, and waits for vLLM's first ready. onEvent sees
// every event of the guard's stream, in order, on one goroutine.
func StartGuard(ctx context.Context, e *Env, config func(proxyAddr, sock string) string, onEvent func(events.Event)) (*Guard, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	g := &Guard{E: e, Addr: fmt.Sprintf("127.0.0.1:%d", port), Sock: filepath.Join(e.Dir, "guard.sock"),
		exited: make(chan struct{}), evDone: make(chan struct{})}
	cfg := filepath.Join(e.Dir, "vllm-guard.toml")
	if err := os.WriteFile(cfg, []byte(config(g.Addr, g.Sock)), 0o644); err != nil {
		return nil, err
	}
	g.cmd = exec.Command(e.Bins.Guard, "run", "--config", cfg, "--events", "/dev/fd/3")
	g.cmd.Env = CleanEnv(map[string]string{"FAKENVML_STATE": e.GPUDir, "LD_LIBRARY_PATH": e.Bins.NvmlDir})
	logf, err := os.Create(filepath.Join(e.Dir, "guard.log"))
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
		return nil, fmt.Errorf("start %s: %w", e.Bins.Guard, err)
	}
	evw.Close()
	logf.Close()
	go g.readEvents(evr, ready, onEvent)
	go func() { g.cmd.Wait(); <-g.evDone; close(g.exited) }()
	select {
	case <-ready:
	case <-g.exited:
		return nil, fmt.Errorf("the guard exited (code %d) before vLLM was ready; its log: %s", g.cmd.ProcessState.ExitCode(), filepath.Join(e.Dir, "guard.log"))
	case <-ctx.Done():
		g.Stop()
		return nil, ctx.Err()
	case <-time.After(60 * time.Second):
		g.Stop()
		return nil, fmt.Errorf("vLLM was not ready under the guard within 60s; its log: %s", filepath.Join(e.Dir, "guard.log"))
	}
	return g, nil
}

// readEvents follows the guard's event stream; ready is closed at the
// first ready.
func (g *Guard) readEvents(r io.ReadCloser, ready chan struct{}, onEvent func(events.Event)) {
	defer close(g.evDone)
	defer r.Close()
	var once sync.Once
	dec := json.NewDecoder(r)
	for {
		var ev events.Event
		if dec.Decode(&ev) != nil {
			return
		}
		onEvent(ev)
		if ev.Kind == events.KindReady {
			once.Do(func() { close(ready) })
		}
	}
}

// URL is the guard's proxy.
func (g *Guard) URL() string { return "http://" + g.Addr }

// Stop: SIGTERM (the guard stops vLLM and exits), SIGKILL after 20 s.
func (g *Guard) Stop() {
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(20 * time.Second):
		g.cmd.Process.Kill()
		<-g.exited
	}
}

// GuardConfig is the guard's configuration for the run: vLLM's command
// (the simulator, then args), port and environment, the caller's
// sections (profile, restart, proxy, …), the control socket sock, a
// state folder in the run's, and the JSON log the bench reads.
func (e *Env) GuardConfig(args []string, sock, sections string) string {
	var b strings.Builder
	cmd, _ := json.Marshal(append([]string{e.Bins.Fakevllm}, args...))
	fmt.Fprintf(&b, "[vllm]\ncommand = %s\nport = %d\nstop_timeout = \"3s\"\n\n[vllm.env]\n", cmd, e.Port)
	for k, v := range e.SimEnv {
		fmt.Fprintf(&b, "%s = %q\n", k, v)
	}
	b.WriteString("\n" + sections)
	fmt.Fprintf(&b, "\n[control]\nsocket = %q\nstate_dir = %q\n\n[log]\nformat = \"json\"\nlevel = \"info\"\n", sock, filepath.Join(e.Dir, "state"))
	return b.String()
}

// Merge is the maps' union, the later ones winning.
func Merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// KillTagged SIGKILLs every live process carrying the run's tag (a
// simulator that outlived its parent), and reports how many there were.
func KillTagged(tag string) int {
	n := 0
	for _, pid := range procmark.Live("FAKEVLLM_TEST_ID=" + tag) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}
