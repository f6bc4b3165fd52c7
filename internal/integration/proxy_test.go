package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/drill"
	"github.com/vllm-guard/vllm-guard/internal/proxy"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Until `vllm-guard run` wires the proxy in, these tests put an in-process
// proxy in front of a simulator they start themselves; the Upstream is
// the test playing the supervisor.

// sim is one simulator process, started directly (no guard).
type sim struct {
	t      testing.TB
	cmd    *exec.Cmd
	port   int
	out    *syncBuffer
	exited chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startSim runs `fakevllm serve test-model` on port with extra flags and
// FAKEVLLM_* variables, and waits until it answers /health.
func startSim(t testing.TB, port int, env map[string]string, flags ...string) *sim {
	t.Helper()
	s, err := launchSim(t, port, env, flags...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// launchSim is startSim for any goroutine: it returns the error.
func launchSim(t testing.TB, port int, env map[string]string, flags ...string) (*sim, error) {
	id := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())
	args := append([]string{"serve", "test-model", "--host", "127.0.0.1", "--port", fmt.Sprint(port)}, flags...)
	s := &sim{t: t, port: port, out: &syncBuffer{}, exited: make(chan struct{}), cmd: exec.Command(bins.fakevllm, args...)}
	s.cmd.Env = append(os.Environ(), "FAKEVLLM_TEST_ID="+id, "FAKEVLLM_ERA=v1")
	for k, v := range env {
		s.cmd.Env = append(s.cmd.Env, k+"="+v)
	}
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the simulator: %w", err)
	}
	go func() { s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		if t.Failed() {
			out := s.out.String()
			t.Logf("simulator on port %d, output tail:\n%s", port, out[max(0, len(out)-3000):])
		}
	})
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	var exited bool
	ready := testkit.PollEvery(30*time.Second, 20*time.Millisecond, func() bool {
		resp, err := client.Get(s.url() + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		select {
		case <-s.exited:
			exited = true
			return true
		default:
			return false
		}
	})
	switch {
	case exited:
		return nil, fmt.Errorf("simulator exited before ready:\n%s", s.out.String())
	case !ready:
		return nil, fmt.Errorf("simulator not ready within 30s:\n%s", s.out.String())
	}
	return s, nil
}

func (s *sim) url() string { return fmt.Sprintf("http://127.0.0.1:%d", s.port) }

func (s *sim) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// supervisorStandIn is the Upstream: what the supervisor would say.
type supervisorStandIn struct {
	mu    sync.Mutex
	url   string
	ready bool
	seqs  int
}

func (u *supervisorStandIn) Target() (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.url, u.ready
}
func (u *supervisorStandIn) MaxNumSeqs() int { u.mu.Lock(); defer u.mu.Unlock(); return u.seqs }
func (u *supervisorStandIn) Pressure() bool  { return false }
func (u *supervisorStandIn) setReady(r bool) { u.mu.Lock(); u.ready = r; u.mu.Unlock() }

// startProxy serves a proxy over up on a loopback port until the test ends.
func startProxy(t *testing.T, up proxy.Upstream, cfg config.Proxy) (*proxy.Proxy, string) {
	t.Helper()
	p := proxy.New(cfg, up, nil, zaptest.NewLogger(t))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy Serve: %v", err)
		}
	})
	return p, "http://" + l.Addr().String()
}

func runDrill(t *testing.T, o drill.Options) *drill.Report {
	t.Helper()
	rep, err := drill.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	drill.WriteTable(&b, rep)
	t.Logf("drill against %s:\n%s", o.URL, b.String())
	return rep
}

// The memory arithmetic of the OOM scenario (integration/fakevllm
// memory.go, sched.go; private 80 GiB device, 512 MiB reserved, default
// utilization 0.9): the engine holds budget = 0.9 × 80 GiB = 73 728 MiB,
// plus running × SEQ_COST, plus the prompt tokens of every admitted
// request, running or waiting, × TOKEN_COST; it dies when reserved + that
// exceeds 81 920 MiB, i.e. when running × SEQ_COST + prompts × TOKEN_COST
// > 7 680 MiB. With SEQ_COST 40 MiB, TOKEN_COST 64 KiB and 2 000-token
// prompts (125 MiB each), max_num_seqs 32:
//   - through the proxy (limit 32: nothing waits inside vLLM):
//     32 × 40 + 32 × 125 = 5 280 MiB ≤ 7 680 — no OOM;
//   - directly at concurrency 128 (4 × 32): 1 280 + 128 × 125 = 17 280 MiB;
//     it dies as soon as 52 requests are admitted (1 280 + 52 × 125 = 7 780).
var oomEnv = map[string]string{"FAKEVLLM_SEQ_COST_MIB": "40", "FAKEVLLM_TOKEN_COST_KIB": "64"}

const oomSeqs = 32

func oomDrill(url string) drill.Options {
	return drill.Options{URL: url, Model: "test-model", Concurrency: 4 * oomSeqs, PromptTokens: 2000, MaxTokens: 32,
		Duration: 2 * time.Second, Timeout: 30 * time.Second, Interval: time.Second}
}

func TestDrillDirectOOMsButThroughTheProxyPasses(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		s := startSim(t, testkit.FreePort(t), oomEnv, "--max-num-seqs", fmt.Sprint(oomSeqs))
		rep := runDrill(t, oomDrill(s.url()))
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			t.Fatal("the simulator survived 128 long prompts at once: no OOM")
		}
		if !strings.Contains(s.out.String(), "torch.OutOfMemoryError: CUDA out of memory") {
			t.Fatal("the simulator exited without an OOM traceback")
		}
		failed := rep.Outcomes[drill.OutcomeConnError] + rep.Outcomes[drill.Outcome5xx] + rep.Outcomes[drill.OutcomeStreamCut]
		if rep.Verdict != drill.VerdictFail || failed == 0 || rep.OOMs != nil {
			t.Fatalf("drill verdict %s with %d failed requests (OOMs %v): want FAIL on the errors, OOMs unknown", rep.Verdict, failed, rep.OOMs)
		}
	})
	t.Run("through the proxy", func(t *testing.T) {
		s := startSim(t, testkit.FreePort(t), oomEnv, "--max-num-seqs", fmt.Sprint(oomSeqs))
		up := &supervisorStandIn{url: s.url(), ready: true, seqs: oomSeqs}
		p, url := startProxy(t, up, config.Default().Proxy)
		rep := runDrill(t, oomDrill(url))
		if !s.alive() || strings.Contains(s.out.String(), "OutOfMemoryError") {
			t.Fatal("vLLM ran out of memory behind the proxy")
		}
		if rep.Verdict != drill.VerdictPass || rep.Outcomes[drill.OutcomeOK] == 0 {
			t.Fatalf("verdict %s %v, outcomes %v: want PASS", rep.Verdict, rep.Reasons, rep.Outcomes)
		}
		st := p.Stats()
		if !rep.Admission || rep.Queued == 0 || !st.Engaged {
			t.Fatalf("admission engaged %v, %d queued, proxy stats %+v: want queueing instead of an OOM", rep.Admission, rep.Queued, st)
		}
		if st.Inflight != 0 || st.Queued != 0 {
			t.Fatalf("after the drill: %+v", st)
		}
	})
}

func TestProxyRestartUnderLoadIsAPause(t *testing.T) {
	port := testkit.FreePort(t)
	first := startSim(t, port, nil, "--max-num-seqs", "8")
	up := &supervisorStandIn{url: first.url(), ready: true, seqs: 8}
	cfg := config.Default().Proxy
	cfg.QueueTimeout = config.Duration{Duration: 20 * time.Second}
	p, url := startProxy(t, up, cfg)

	restarted := make(chan error, 1)
	go func() {
		// Under load for a while, then a restart as the supervisor does
		// it: not ready, SIGTERM, a new vLLM on the same port, ready.
		if !testkit.Poll(time.Minute, func() bool { return p.Stats().Admitted >= 100 }) {
			restarted <- fmt.Errorf("100 requests not admitted within a minute (%d)", p.Stats().Admitted)
			return
		}
		up.setReady(false)
		p.Notify()
		first.cmd.Process.Signal(syscall.SIGTERM)
		<-first.exited
		_, err := launchSim(t, port, nil, "--max-num-seqs", "8")
		up.setReady(true)
		p.Notify()
		restarted <- err
	}()
	rep := runDrill(t, drill.Options{URL: url, Model: "test-model", Concurrency: 16, PromptTokens: 100, MaxTokens: 16,
		Duration: 4 * time.Second, Timeout: 30 * time.Second, Interval: time.Second})
	if err := <-restarted; err != nil {
		t.Fatalf("restart: %v", err)
	}
	for _, oc := range drill.Outcomes {
		switch oc {
		case drill.OutcomeOK, drill.Outcome503, drill.Outcome429:
		default:
			if n := rep.Outcomes[oc]; n > 0 {
				t.Errorf("%d requests ended %s (%s): clients must see only 200, 503 or 429", n, oc, rep.Examples[oc])
			}
		}
	}
	if rep.Outcomes[drill.OutcomeOK] < 100 {
		t.Errorf("only %d requests succeeded", rep.Outcomes[drill.OutcomeOK])
	}
	if rep.Queued == 0 {
		t.Error("no request waited through the restart")
	}
}
