package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// The tests build the simulator into a temporary folder.
func TestMain(m *testing.M) { testkit.MainWithCleanup(m, testbin.Cleanup) }

// fast makes every phase short so that a whole start takes ~100 ms.
var fast = map[string]string{
	"FAKEVLLM_LOAD_WEIGHTS": "20ms",
	"FAKEVLLM_COMPILE":      "10ms",
	"FAKEVLLM_KV_PROFILE":   "10ms",
	"FAKEVLLM_GRAPHS":       "10ms",
	"FAKEVLLM_SERVER":       "10ms",
	"FAKEVLLM_ORPHAN_TTL":   "60s",
}

func simBin(t *testing.T) string {
	t.Helper()
	p, err := testbin.FakeVLLM()
	if err != nil {
		t.Fatalf("build fakevllm: %v", err)
	}
	return p
}

type outLine struct {
	stream string // "stdout" | "stderr"
	raw    string
	text   string // ANSI stripped
}

// simProc is one running simulator, its output collected line by line
// (split on \n and \r, as the guard reads it).
type simProc struct {
	t       *testing.T
	cmd     *exec.Cmd
	mu      sync.Mutex
	lines   []outLine
	wake    chan struct{}
	readers sync.WaitGroup
	// outputDone closes when both pipes hit EOF: the API and the engine
	// (which may outlive it as an orphan) are gone.
	outputDone chan struct{}
	exited     chan struct{}
	state      *os.ProcessState
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

// startSim runs `fakevllm serve ARGS` in its own process group with env
// on top of a clean environment (no inherited FAKEVLLM_*/FAKENVML_*).
// Cleanup kills the whole group and waits for the output readers.
func startSim(t *testing.T, env map[string]string, args ...string) *simProc {
	t.Helper()
	return startSub(t, env, "serve", args...)
}

// startSub runs `fakevllm SUB ARGS` as startSim runs serve.
func startSub(t *testing.T, env map[string]string, sub string, args ...string) *simProc {
	t.Helper()
	cmd := exec.Command(simBin(t), append([]string{sub}, args...)...)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "FAKEVLLM_") || strings.HasPrefix(kv, "FAKENVML_") || strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if err := cmd.Start(); err != nil {
		t.Fatalf("start fakevllm: %v", err)
	}
	outW.Close()
	errW.Close()
	p := &simProc{t: t, cmd: cmd, wake: make(chan struct{}), exited: make(chan struct{}), outputDone: make(chan struct{})}
	p.readers.Add(2)
	go p.read("stdout", outR)
	go p.read("stderr", errR)
	go func() { p.readers.Wait(); close(p.outputDone) }()
	go func() {
		cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(p.exited)
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
		<-p.outputDone
		if t.Failed() {
			t.Logf("simulator output:\n%s", p.dump())
		}
	})
	return p
}

func (p *simProc) read(stream string, r io.ReadCloser) {
	defer p.readers.Done()
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	sc.Split(vllmlog.ScanLines)
	for sc.Scan() {
		raw := sc.Text()
		if raw == "" {
			continue
		}
		p.mu.Lock()
		p.lines = append(p.lines, outLine{stream: stream, raw: raw, text: vllmlog.StripANSI(raw)})
		close(p.wake)
		p.wake = make(chan struct{})
		p.mu.Unlock()
	}
}

// waitLine waits for a line containing substr and returns its index and
// the line.
func (p *simProc) waitLine(substr string, timeout time.Duration) (int, outLine) {
	p.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := 0
	for {
		p.mu.Lock()
		for ; seen < len(p.lines); seen++ {
			if strings.Contains(p.lines[seen].text, substr) {
				l := p.lines[seen]
				p.mu.Unlock()
				return seen, l
			}
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-p.outputDone:
			// Every writer is gone: one last look, then give up.
			p.mu.Lock()
			n := len(p.lines)
			p.mu.Unlock()
			if seen < n {
				continue
			}
			p.t.Fatalf("output ended (exit %v) without a line with %q", p.exitState(), substr)
		case <-deadline.C:
			p.t.Fatalf("no line with %q within %v", substr, timeout)
		}
	}
}

func (p *simProc) exitState() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// waitExit waits for the API process to exit and for its output to end.
func (p *simProc) waitExit(timeout time.Duration) *os.ProcessState {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.t.Fatalf("simulator still running after %v", timeout)
	}
	return p.exitState()
}

// waitOutputEnd waits until every writer of the pipes (API, engine) is gone.
func (p *simProc) waitOutputEnd(timeout time.Duration) {
	p.t.Helper()
	select {
	case <-p.outputDone:
	case <-time.After(timeout):
		p.t.Fatalf("output still open after %v", timeout)
	}
}

func (p *simProc) snapshot() []outLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]outLine(nil), p.lines...)
}

func (p *simProc) dump() string {
	var b strings.Builder
	for _, l := range p.snapshot() {
		fmt.Fprintf(&b, "[%s] %s\n", l.stream, l.text)
	}
	return b.String()
}

func (p *simProc) has(substr string) bool {
	for _, l := range p.snapshot() {
		if strings.Contains(l.text, substr) {
			return true
		}
	}
	return false
}

func (p *simProc) signal(sig syscall.Signal) {
	p.cmd.Process.Signal(sig)
}

// startReady starts the simulator on a free port (--port 0, so no other
// test can take the port first) and returns it once /health answers 200.
func startReady(t *testing.T, env map[string]string, args ...string) (*simProc, string) {
	t.Helper()
	p := startSim(t, env, append(args, "--host", "127.0.0.1", "--port", "0")...)
	_, l := p.waitLine(" on http://127.0.0.1:", 20*time.Second)
	port, err := strconv.Atoi(l.text[strings.LastIndex(l.text, ":")+1:])
	if err != nil {
		t.Fatalf("no port in %q", l.text)
	}
	return p, p.readyURL(port)
}

// readyURL waits for "Application startup complete." and returns the
// base URL once /health answers (listen follows that line).
func (p *simProc) readyURL(port int) string {
	p.t.Helper()
	p.waitLine("Application startup complete.", 20*time.Second)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := httpClient().Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return url
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("/health on %s not 200 after startup complete: %v", url, err)
		}
		select {
		case <-p.exited:
			p.t.Fatalf("simulator exited before /health answered")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
}

// pidFromPrefix reads N out of "(EngineCore_0 pid=N)".
func pidFromPrefix(t *testing.T, line, proc string) int {
	t.Helper()
	var pid int
	i := strings.Index(line, "("+proc+" pid=")
	if i < 0 {
		t.Fatalf("no %s prefix in %q", proc, line)
	}
	if _, err := fmt.Sscanf(line[i:], "("+proc+" pid=%d)", &pid); err != nil {
		t.Fatalf("parse pid in %q: %v", line, err)
	}
	return pid
}
