package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// bins are the real binaries the benchmark runs.
type bins struct{ guard, fakevllm, nvmlDir string }

// run is one scenario under one supervisor: its own port, GPU state
// folder and process tag.
type run struct {
	sc     Scenario
	sup    string
	s      Scale
	bins   bins
	scan   *scanner
	dir    string
	gpuDir string
	port   int
	tag    string
	t0     time.Time
	client *http.Client

	root     atomic.Int64 // baselines: the pid of the running main process, 0 when none
	guardPID atomic.Int64 // guard: its pid while it lives

	// startsecs overrides supervisord's startsecs (zero: its default 1 s,
	// never scaled below): the end-to-end test's start failure must fall
	// inside it however loaded the machine is.
	startsecs time.Duration

	mu  sync.Mutex
	rec record
}

const model = "Qwen/Qwen2.5-7B-Instruct"

func newRun(sc Scenario, sup string, s Scale, b bins, scan *scanner, scratch string) (*run, error) {
	dir := filepath.Join(scratch, sc.Name+"-"+sup)
	gpu := filepath.Join(dir, "gpu")
	if err := os.MkdirAll(filepath.Join(gpu, "procs"), 0o755); err != nil {
		return nil, fmt.Errorf("storm: create the run folder %s: %w", dir, err)
	}
	// One simulated 80 GiB H100 with 512 MiB reserved, as in the integration tests.
	if err := os.WriteFile(filepath.Join(gpu, "devices"),
		[]byte("GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3\n"), 0o644); err != nil {
		return nil, fmt.Errorf("storm: write the stand-in NVML devices file: %w", err)
	}
	r := &run{sc: sc, sup: sup, s: s, bins: b, scan: scan, dir: dir, gpuDir: gpu,
		tag:    fmt.Sprintf("%s-%s-%d", sc.Name, sup, time.Now().UnixNano()),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	r.rec.maxNumSeqs = baseMaxNumSeqs
	return r, nil
}

func (r *run) since() time.Duration { return time.Since(r.t0) }

func (r *run) note(f func(*record)) {
	r.mu.Lock()
	f(&r.rec)
	r.mu.Unlock()
}

func (r *run) snapshot() record {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.rec
	c.samples = append([]sample(nil), r.rec.samples...)
	return c
}

// setTerminal records that the supervisor stopped for good.
func (r *run) setTerminal(why string) {
	r.note(func(rec *record) {
		if rec.terminal == "" {
			rec.terminal, rec.terminalAt = why, r.since()
		}
	})
}

func (r *run) setPhase(p string) { r.note(func(rec *record) { rec.phase = p }) }

func (r *run) url(path string) string { return "http://127.0.0.1:" + strconv.Itoa(r.port) + path }

// get reports whether GET path answered 200..399 within timeout.
func (r *run) get(path string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url(path), nil)
	resp, err := r.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

// complete reports whether a completion of maxTokens tokens worked.
func (r *run) complete(maxTokens int, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	body := fmt.Sprintf(`{"model":%q,"prompt":"How is the GPU today?","max_tokens":%d}`, model, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url("/v1/completions"), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// metric reads one sample of the simulator's /metrics (0, false if unreachable).
func (r *run) metric(name string) (float64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url("/metrics"), nil)
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return metricValue(string(b), name)
}

// metricValue finds `name` or `name{…}` in Prometheus text and returns
// its value (the last field; label values here hold no spaces).
func metricValue(text, name string) (float64, bool) {
	for line := range strings.SplitSeq(text, "\n") {
		rest, found := strings.CutPrefix(line, name)
		if !found || (!strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{")) {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			return v, true
		}
	}
	return 0, false
}

// child is one launched `vllm serve` (the simulator) of a baseline.
type child struct {
	pid     int
	started time.Time
	done    chan struct{}
	code    int            // exit code, -1 after a signal
	sig     syscall.Signal // the fatal signal, 0 if it exited
}

func (c *child) status() string {
	if c.sig != 0 {
		return "signal " + c.sig.String()
	}
	return "code " + strconv.Itoa(c.code)
}

// launch starts the simulator the way a unit, a container or a program
// section would: in its own process group, with the run's profile and
// environment. Its output is scanned for OOM tracebacks and kept in the
// run folder.
func (r *run) launch() (*child, error) {
	argv := []string{r.bins.fakevllm, "serve", model, "--host", "127.0.0.1", "--port", strconv.Itoa(r.port),
		"--max-num-seqs", strconv.Itoa(baseMaxNumSeqs), "--gpu-memory-utilization", strconv.FormatFloat(baseUtil, 'f', -1, 64)}
	argv = append(argv, r.sc.Args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), tagVar+"="+r.tag)
	for k, v := range r.sc.simEnv(r.s, r.gpuDir, filepath.Join(r.dir, "fault-fired")) {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// What the new start finds held: every process of the run alive now
	// belongs to an earlier start (a failed start can be over before the
	// periodic check looks).
	if held := gpuBytes(r.gpuDir, r.left()); held > 0 {
		r.note(func(rec *record) { rec.heldAtStart = max(rec.heldAtStart, held) })
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("storm: pipe for vLLM's output: %w", err)
	}
	// *os.File outputs go to the child as is: cmd.Wait returns when the API
	// server exits, even while an orphaned EngineCore keeps the pipe open.
	cmd.Stdout, cmd.Stderr = pw, pw
	r.mu.Lock()
	n := len(r.rec.starts) + 1
	r.mu.Unlock()
	logf, _ := os.Create(filepath.Join(r.dir, fmt.Sprintf("vllm-%03d.log", n)))
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		if logf != nil {
			logf.Close()
		}
		return nil, fmt.Errorf("storm: start %s: %w", argv[0], err)
	}
	pw.Close()
	c := &child{pid: cmd.Process.Pid, started: time.Now(), done: make(chan struct{})}
	r.root.Store(int64(c.pid))
	r.note(func(rec *record) { rec.starts = append(rec.starts, r.since()) })
	go r.readOutput(pr, logf)
	go func() {
		_ = cmd.Wait()
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		c.code = cmd.ProcessState.ExitCode()
		if ws.Signaled() {
			c.sig = ws.Signal()
		}
		r.root.CompareAndSwap(int64(c.pid), 0)
		close(c.done)
	}()
	return c, nil
}

// readOutput counts one OOM per start: vLLM's root-cause lines for a GPU OOM.
func (r *run) readOutput(pr *os.File, logf *os.File) {
	defer pr.Close()
	if logf != nil {
		defer logf.Close()
	}
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	seen := false
	for sc.Scan() {
		line := sc.Bytes()
		if logf != nil {
			logf.Write(line)
			logf.Write([]byte{'\n'})
		}
		if !seen && isOOMLine(string(line)) {
			seen = true
			r.note(func(rec *record) { rec.ooms = append(rec.ooms, r.since()) })
		}
	}
}

func isOOMLine(s string) bool {
	return strings.Contains(s, "OutOfMemoryError") || strings.Contains(s, "CUDA out of memory") ||
		strings.Contains(s, "CUDA error: out of memory") || strings.Contains(s, "CUDA driver error: out of memory")
}

// waitExit waits for the child; false if the scenario ended first.
func waitExit(ctx context.Context, c *child) bool {
	select {
	case <-c.done:
		return true
	case <-ctx.Done():
		return false
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// left lists the run's live processes.
func (r *run) left() []proc { return r.scan.table(0).tagged(r.tag) }

// stopTagged is a cgroup or container stop: SIGTERM to every process of
// the run, SIGKILL to what is left after timeout. It returns when none is
// left (or after a bounded wait for the kernel to reap them).
func (r *run) stopTagged(timeout time.Duration) {
	ps := r.left()
	if len(ps) == 0 {
		return
	}
	signalAll(ps, syscall.SIGTERM)
	if r.waitGone(timeout) {
		return
	}
	killAll(r.left())
	r.waitGone(5 * time.Second)
}

// waitGone polls until no process of the run is alive.
func (r *run) waitGone(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if len(r.left()) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
