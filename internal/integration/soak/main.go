// Command soak is `make soak`: the real guard (race build) supervises the
// vLLM simulator through many scripted failures of mixed kinds while a
// client load runs, then checks the guard for leaks and its records for
// consistency. It owns nothing but this check; it prints the end-of-run
// figures and exits 1 when a goal is missed (2 when it could not run).
//
// Failures are driven from here, one at a time, each once vLLM is ready:
// SIGKILL or SIGSEGV of the API server, SIGKILL of EngineCore, an OOM
// caused by one huge prompt, and SIGSTOP of the API server (a hang that
// liveness must catch). Goals:
//   - zero vLLM processes left after the guard's exit 0;
//   - goroutines and open fds of the guard at the end ≤ at the start;
//   - RSS growth ≤ 10 % (start: after -warmup failures, so the heap and
//     the race detector's shadow memory have reached their working size);
//   - one exit event and one incident record per injected failure;
//   - every launch after a failure on the rung that failure's decision chose;
//   - then -restarts planned restarts (vllm-guard restart) while clients go
//     through the guard's proxy: vLLM drains (--shutdown-timeout), new
//     requests wait in the proxy's queue, and no client sees an error.
//
// The goroutine, fd and RSS figures come from the guard's own /metrics
// (the Prometheus Go and process collectors).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/freeport"
	"github.com/vllm-guard/vllm-guard/internal/testbin"
)

func main() {
	failures := flag.Int("failures", 200, "scripted failures to inject")
	warmup := flag.Int("warmup", 10, "failures before the start figures are taken")
	clients := flag.Int("clients", 4, "concurrent client load loops")
	restarts := flag.Int("restarts", 20, "planned restarts under client load through the proxy, after the failures")
	seed := flag.Uint64("seed", 1, "seed of the failure mix")
	plain := flag.Bool("plain", false, "soak the shipped build instead of the race build")
	limit := flag.Duration("timeout", 20*time.Minute, "give up after this long")
	flag.Parse()
	if *warmup >= *failures {
		fmt.Fprintln(os.Stderr, "soak: -warmup must be below -failures")
		os.Exit(2)
	}
	code := func() int {
		defer testbin.Cleanup()
		r, err := run(*failures, *warmup, *clients, *restarts, *seed, *plain, *limit)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			fmt.Fprintln(os.Stderr, "verdict: could not run")
			return 2
		}
		return r.print(os.Stdout)
	}()
	os.Exit(code)
}

// guard is the running vllm-guard, its event stream (run --events on a
// pipe) and its JSON log (kept for the post-mortem).
type guard struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	logs   []map[string]any
	evs    []events.Event
	notify chan struct{}
	evDone chan struct{}
	exited chan struct{}
	code   int
}

func isKind(k events.Kind) func(events.Event) bool {
	return func(e events.Event) bool { return e.Kind == k }
}

func (g *guard) countEvents(match func(events.Event) bool) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, e := range g.evs {
		if match(e) {
			n++
		}
	}
	return n
}

// waitEvent returns the n-th event that matches, or an error after timeout.
func (g *guard) waitEvent(what string, n int, timeout time.Duration, match func(events.Event) bool) (events.Event, error) {
	deadline := time.After(timeout)
	for {
		g.mu.Lock()
		seen := 0
		for _, e := range g.evs {
			if match(e) {
				if seen++; seen == n {
					g.mu.Unlock()
					return e, nil
				}
			}
		}
		g.mu.Unlock()
		select {
		case <-g.notify:
		case <-g.exited:
			if g.countEvents(match) >= n {
				continue
			}
			return events.Event{}, fmt.Errorf("the guard exited (code %d) before %s #%d", g.code, what, n)
		case <-deadline:
			return events.Event{}, fmt.Errorf("no %s #%d within %s", what, n, timeout)
		}
	}
}

func run(failures, warmup, clients, restarts int, seed uint64, plain bool, limit time.Duration) (_ *report, err error) {
	t0 := time.Now()
	guardBin, err := testbin.Guard()
	if plain {
		guardBin, err = testbin.GuardPlain()
	}
	if err != nil {
		return nil, err
	}
	fakevllm, err := testbin.FakeVLLM()
	if err != nil {
		return nil, err
	}
	nvmlDir, err := testbin.FakeNVML()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "vllm-guard-soak-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	gpuDir := filepath.Join(dir, "gpu")
	if err := os.MkdirAll(filepath.Join(gpuDir, "procs"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(gpuDir, "devices"), []byte("GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3\n"), 0o644); err != nil {
		return nil, err
	}
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	httpPort, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	proxyPort, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	testID := fmt.Sprintf("soak-%d", time.Now().UnixNano())
	stateDir := filepath.Join(dir, "state")
	// A prompt token costs 1 MiB: one 30000-token prompt needs 30 GiB, more
	// than any rung leaves free, while the load's short prompts cost little.
	cfg := fmt.Sprintf(`[vllm]
command = [%q, "serve", "soak-model", "--max-model-len", "32768", "--shutdown-timeout", "5"]
port = %d
stop_timeout = "1s"
[vllm.env]
FAKEVLLM_TEST_ID = %q
FAKEVLLM_LOAD_WEIGHTS = "80ms"
FAKEVLLM_COMPILE = "20ms"
FAKEVLLM_KV_PROFILE = "10ms"
FAKEVLLM_GRAPHS = "20ms"
FAKEVLLM_SERVER = "10ms"
FAKEVLLM_TOKEN_COST_KIB = "1024"
FAKEVLLM_ORPHAN_TTL = "30s"
[readiness]
poll_interval = "50ms"
stall_timeout = "20s"
[liveness]
interval = "200ms"
timeout = "1s"
failures = 2
[gpu]
sample_interval = "100ms"
release_timeout = "10s"
[restart]
initial_delay = "50ms"
max_delay = "200ms"
jitter = 0.0
give_up_after = 1000000
[control]
socket = %q
http_listen = "127.0.0.1:%d"
state_dir = %q
[proxy]
listen = "127.0.0.1:%d"
queue_timeout = "60s"
[log]
format = "json"
level = "info"
`, fakevllm, port, testID, filepath.Join(dir, "guard.sock"), httpPort, stateDir, proxyPort)
	cfgPath := filepath.Join(dir, "vllm-guard.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}

	g := &guard{notify: make(chan struct{}, 1), evDone: make(chan struct{}), exited: make(chan struct{})}
	g.cmd = exec.Command(guardBin, "run", "--config", cfgPath, "--events", "/dev/fd/3")
	g.cmd.Env = append(os.Environ(), "FAKENVML_STATE="+gpuDir, "LD_LIBRARY_PATH="+nvmlDir)
	evr, evw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	g.cmd.ExtraFiles = []*os.File{evw}
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	evw.Close()
	go func() {
		defer close(g.evDone)
		defer evr.Close()
		dec := json.NewDecoder(evr)
		for {
			var e events.Event
			if dec.Decode(&e) != nil {
				return
			}
			g.mu.Lock()
			g.evs = append(g.evs, e)
			g.mu.Unlock()
			select {
			case g.notify <- struct{}{}:
			default:
			}
		}
	}()
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil || m["logger"] == "vllm" {
				continue // vLLM's own lines: not needed, and the bulk of the log
			}
			g.mu.Lock()
			g.logs = append(g.logs, m)
			g.mu.Unlock()
			select {
			case g.notify <- struct{}{}:
			default:
			}
		}
		g.cmd.Wait()
		g.code = g.cmd.ProcessState.ExitCode()
		<-g.evDone // the guard flushed and closed its event stream at exit
		close(g.exited)
	}()
	defer func() {
		if err != nil { // what the guard said last, for the post-mortem
			g.mu.Lock()
			for _, m := range g.logs[max(0, len(g.logs)-30):] {
				b, _ := json.Marshal(m)
				fmt.Fprintf(os.Stderr, "  guard: %s\n", b)
			}
			for _, e := range g.evs[max(0, len(g.evs)-30):] {
				b, _ := json.Marshal(e)
				fmt.Fprintf(os.Stderr, "  event: %s\n", b)
			}
			g.mu.Unlock()
		}
		select {
		case <-g.exited:
		default:
			g.cmd.Process.Kill()
			<-g.exited
		}
		for _, p := range ours(testID) {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	stopLoad := make(chan struct{})
	var completions, clientErrs atomic.Int64
	var loadWG sync.WaitGroup
	vllmURL := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", port)
	for range clients {
		loadWG.Add(1)
		go func() {
			defer loadWG.Done()
			hc := &http.Client{Timeout: 2 * time.Second}
			body := `{"model":"soak-model","prompt":"soak load","max_tokens":4}`
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				resp, err := hc.Post(vllmURL, "application/json", strings.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err == nil && resp.StatusCode == 200 {
					completions.Add(1)
					continue
				}
				clientErrs.Add(1)
				select { // vLLM is restarting: do not spin
				case <-stopLoad:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	defer func() { close(stopLoad); loadWG.Wait() }()

	r := &report{failures: failures, warmup: warmup, kinds: map[string]int{}, causes: map[string]int{}}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort)
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	kinds := []string{"sigkill", "sigkill", "segv", "segv", "engine_kill", "engine_kill", "oom", "sigstop"}
	for i := 1; i <= failures; i++ {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("out of time after %d failures", i-1)
		}
		if _, err := g.waitEvent("ready", i, 60*time.Second, isKind(events.KindReady)); err != nil {
			return nil, fmt.Errorf("before failure %d: %w", i, err)
		}
		if i == warmup+1 {
			if r.start, err = sample(metricsURL); err != nil {
				return nil, err
			}
			r.start.fdKinds = fdKinds(g.cmd.Process.Pid)
		}
		kind := kinds[rng.IntN(len(kinds))]
		r.kinds[kind]++
		if err := inject(kind, testID, port); err != nil {
			return nil, fmt.Errorf("failure %d (%s): %w", i, kind, err)
		}
		f, err := g.waitEvent("exit", i, 30*time.Second, isKind(events.KindExited))
		if err != nil {
			return nil, fmt.Errorf("failure %d (%s): %w", i, kind, err)
		}
		r.causes[kind+"→"+string(f.Failure.Verdict.Cause)]++
		if i%20 == 0 {
			fmt.Fprintf(os.Stderr, "soak: %d/%d failures (%s)\n", i, failures, time.Since(t0).Round(time.Second))
		}
	}
	if _, err := g.waitEvent("ready", failures+1, 60*time.Second, isKind(events.KindReady)); err != nil {
		return nil, fmt.Errorf("after the last failure: %w", err)
	}
	if _, err := g.waitEvent("incident records", failures, 10*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindIncident && !strings.HasPrefix(e.Reason, "not written")
	}); err != nil {
		return nil, err
	}
	if r.end, err = sample(metricsURL); err != nil {
		return nil, err
	}
	r.end.fdKinds = fdKinds(g.cmd.Process.Pid)
	r.completions, r.clientEr = completions.Load(), clientErrs.Load()
	// Planned restarts under client load through the proxy: a pause, never
	// an error. After the leak figures: the clients' kept-alive connections
	// are not the guard's leak.
	if restarts > 0 {
		stopProxyLoad := make(chan struct{})
		var proxyWG sync.WaitGroup
		var proxyOK, proxyErr atomic.Int64
		proxyURL := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", proxyPort)
		for range clients {
			proxyWG.Go(func() {
				hc := &http.Client{Timeout: 90 * time.Second}
				body := `{"model":"soak-model","prompt":"planned restart load","max_tokens":8}`
				for {
					select {
					case <-stopProxyLoad:
						return
					default:
					}
					resp, err := hc.Post(proxyURL, "application/json", strings.NewReader(body))
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					if err == nil && resp.StatusCode == 200 {
						proxyOK.Add(1)
						continue
					}
					proxyErr.Add(1)
					if err != nil {
						fmt.Fprintf(os.Stderr, "soak: a client through the proxy: %v\n", err)
					} else {
						fmt.Fprintf(os.Stderr, "soak: a client through the proxy: HTTP %d\n", resp.StatusCode)
					}
				}
			})
		}
		readies := failures + 1
		for j := 1; j <= restarts; j++ {
			if out, err := exec.Command(guardBin, "restart", "--socket", filepath.Join(dir, "guard.sock")).CombinedOutput(); err != nil {
				close(stopProxyLoad)
				proxyWG.Wait()
				return nil, fmt.Errorf("planned restart %d: %v: %s", j, err, out)
			}
			if _, err := g.waitEvent("ready after a planned restart", readies+j, 60*time.Second, isKind(events.KindReady)); err != nil {
				close(stopProxyLoad)
				proxyWG.Wait()
				return nil, fmt.Errorf("planned restart %d: %w", j, err)
			}
		}
		close(stopProxyLoad)
		proxyWG.Wait()
		r.restarts, r.restartOK, r.restartErr = restarts, proxyOK.Load(), proxyErr.Load()
	}

	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
		r.exitCode = g.code
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("the guard did not exit within 30 s of SIGTERM")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := ours(testID)
		if len(left) == 0 || time.Now().After(deadline) {
			for _, p := range left {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				r.orphans = append(r.orphans, fmt.Sprintf("%d:%s", p, bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	r.failed = g.countEvents(isKind(events.KindExited))
	r.incidents = g.countEvents(func(e events.Event) bool {
		return e.Kind == events.KindIncident && !strings.HasPrefix(e.Reason, "not written")
	})
	files, _ := os.ReadDir(filepath.Join(stateDir, "incidents"))
	for _, f := range files {
		if strings.HasSuffix(f.Name(), ".json") {
			r.incidentFiles++
		}
	}
	r.rungMismatches = rungMismatches(g)
	r.elapsed = time.Since(t0)
	return r, nil
}
