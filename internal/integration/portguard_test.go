package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Issue 41 items 2 and 3, through the running guard over the simulator:
// the guard's probes (and its API key) reach vLLM's own listener only,
// and a port held by another process is waited out at a restart, not a
// configuration error.

// portWait sets [vllm] port_wait for the scene.
func portWait(s *scene, d string) {
	edit := s.editConfig
	s.editConfig = func(text string) string {
		if edit != nil {
			text = edit(text)
		}
		return strings.Replace(text, "stop_timeout = \"3s\"\n", "stop_timeout = \"3s\"\nport_wait = \""+d+"\"\n", 1)
	}
}

// squatter is a listener of another process on vLLM's port (this test
// process stands for user nobody's): it answers every request as a
// ready vLLM would, and records what it was sent.
type squatter struct {
	ln   net.Listener
	srv  *http.Server
	mu   sync.Mutex
	reqs []string // "METHOD PATH Authorization"
}

func listenSquatter(t testing.TB, network, addr string) *squatter {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("the squatter cannot listen on %s: %v", addr, err)
	}
	return serveSquatter(t, ln)
}

func serveSquatter(t testing.TB, ln net.Listener) *squatter {
	q := &squatter{ln: ln}
	q.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q.mu.Lock()
		q.reqs = append(q.reqs, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		q.mu.Unlock()
		if r.URL.Path == "/v1/models" {
			json.NewEncoder(w).Encode(map[string]any{"data": []map[string]string{{"id": "test-model"}}})
		}
	})}
	go q.srv.Serve(ln)
	t.Cleanup(q.close)
	return q
}

func (q *squatter) close() { q.srv.Close() }

func (q *squatter) requests() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]string(nil), q.reqs...)
}

// withKey: vLLM serves with an API key the guard must send to /v1.
func withKey(s *scene, key string) {
	s.command = fmt.Sprintf("[%q, \"serve\", \"test-model\", \"--api-key\", %q]", bins.fakevllm, key)
}

// Item 2: a listener started on vLLM's port after the launch, while vLLM
// loads (bound, not listening yet), gets no probe and never the key; the
// guard says whose listener it is; once it is gone and vLLM listens, the
// guard sends vLLM its key and is ready.
func TestSquatterOnVLLMsPortNeverGetsTheKey(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	const key = "sk-squatted-41"
	withKey(s, key)
	gate := filepath.Join(s.dir, "listen-gate")
	s.env["FAKEVLLM_LISTEN_GATE"] = gate // vLLM stays bound, not listening, until the test opens the gate
	s.start()
	s.WaitLog("vLLM's startup line (its port bound, not listening)", 1, 60*time.Second, msgContains("Application startup complete."))
	q := listenSquatter(t, "tcp4", "127.0.0.1:"+strconv.Itoa(s.port))
	pid := strconv.Itoa(os.Getpid())
	notVLLMs := func(e events.Event) bool {
		return e.Kind == events.KindProbeFailed && e.Probe != nil && strings.Contains(e.Probe.Error, "is not vLLM's: pid "+pid)
	}
	s.Until("a probe refused the squatter's listener, or the squatter was asked", 30*time.Second, func() bool {
		return len(q.requests()) > 0 || s.CountEvents(notVLLMs) > 0
	})
	// The guard's probes keep coming while the squatter listens: a few
	// more of them, each refused before a byte is sent.
	n := s.CountEvents(notVLLMs)
	s.Until("more probes", 30*time.Second, func() bool { return len(q.requests()) > 0 || s.CountEvents(notVLLMs) >= n+3 })
	for _, r := range q.requests() {
		if strings.Contains(r, key) || strings.Contains(r, "Bearer") {
			t.Fatalf("the squatter received the API key: %q (all: %q)", r, q.requests())
		}
	}
	if got := q.requests(); len(got) != 0 {
		t.Fatalf("the squatter was probed: %q", got)
	}
	if n := s.CountEvents(isReady); n != 0 {
		t.Fatalf("%d ready events while the squatter held the port", n)
	}
	q.close()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("ready on vLLM's own listener, with its key", 1, 60*time.Second, isReady)
	if got := q.requests(); len(got) != 0 {
		t.Fatalf("the squatter was probed: %q", got)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

var waitedRE = regexp.MustCompile(`waiting (\d+)s for it to be free`)

// waitHeldFor waits until the guard's status has said for at least secs
// seconds that pid holds vLLM's port (its own count), still backing off.
func waitHeldFor(s *scene, pid string, secs int) {
	s.t.Helper()
	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	s.Until(fmt.Sprintf("the status naming the holder for %ds", secs), 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, err := c.Status(ctx)
		if err != nil {
			return false
		}
		m := waitedRE.FindStringSubmatch(d.Guard.Reason)
		if m == nil || !strings.Contains(d.Guard.Reason, "pid "+pid) || d.Guard.State != "backoff" {
			return false
		}
		n, _ := strconv.Atoi(m[1])
		return n >= secs
	})
}

// Item 3: a process that grabs vLLM's port during the backoff after a
// crash delays the restart, past port_wait (this is a restart, not two
// instances on one port), and status names it; once it lets go the guard
// starts vLLM and serves again. No exit 78.
func TestPortGrabbedDuringBackoffDelaysTheRestart(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	portWait(s, "1s")
	s.extra = "\n[restart]\ninitial_delay = \"2s\"\n"
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)
	if err := syscall.Kill(ready.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("the backoff after the crash", 1, 30*time.Second, inState("backoff"))
	q := listenSquatter(t, "tcp4", "127.0.0.1:"+strconv.Itoa(s.port))
	pid := strconv.Itoa(os.Getpid())
	held := s.WaitEvent("the wait for the port", 1, 30*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindState && strings.Contains(e.Reason, "is held by pid "+pid)
	})
	if !strings.Contains(held.Reason, "as long as it takes") {
		t.Errorf("the wait at a restart: %q", held.Reason)
	}
	// The status names the holder, for longer than port_wait, and vLLM
	// is not launched meanwhile.
	waitHeldFor(s, pid, 3)
	if n := s.CountEvents(isStarting); n != 1 {
		t.Fatalf("%d launches while the port was held, want only the first", n)
	}
	q.close()
	s.WaitEvent("the restart once the port is free", 2, 30*time.Second, isStarting)
	s.WaitEvent("ready again", 2, 60*time.Second, isReady)
	if n := s.CountEvents(isExited); n != 1 {
		t.Errorf("%d failures, want the one crash", n)
	}
	select {
	case <-s.Exited():
		t.Fatalf("the guard exited %d", s.Code())
	default:
	}
	if got := q.requests(); len(got) != 0 {
		t.Errorf("the squatter was probed: %q", got)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// Item 3: a listener on [::]:port with IPV6_V6ONLY=1 takes no IPv4
// connection and does not stop vLLM's bind on 127.0.0.1: it is no clash.
// The guard starts vLLM at once and is ready; the listener is never asked.
func TestIPv6OnlyListenerIsNoClashForVLLMOnIPv4(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 1) }); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp6", net.JoinHostPort("::", strconv.Itoa(s.port)))
	if err != nil {
		t.Fatalf("listen on [::]:%d with IPV6_V6ONLY: %v", s.port, err)
	}
	q := serveSquatter(t, ln)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	if n := s.CountEvents(inState("backoff")) + s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d backoff states or failures: the IPv6-only listener was taken for a clash", n)
	}
	if got := q.requests(); len(got) != 0 {
		t.Fatalf("the IPv6-only listener was probed: %q", got)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// Item 3: a port held for good at the guard's first start (another
// instance's vLLM on the same port) is waited for port_wait, the status
// naming the holder, and then the guard exits 78 naming it, vLLM never
// launched; the holder is untouched.
func TestPortHeldAtTheFirstStartExits78AfterPortWait(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	portWait(s, "2s")
	other := startSim(t, s.port, nil)
	s.start()
	pid := "pid " + strconv.Itoa(other.cmd.Process.Pid)
	held := s.WaitEvent("the wait for the port", 1, 30*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindState && e.State == "backoff" && strings.Contains(e.Reason, "is held by "+pid)
	})
	if !strings.Contains(held.Reason, "port_wait 2s") || !strings.Contains(held.Reason, "exit 78") {
		t.Errorf("the wait at the first start: %q", held.Reason)
	}
	if code := s.WaitExit(60 * time.Second); code != 78 {
		t.Fatalf("exit %d, want 78", code)
	}
	ex := s.WaitEvent("exit", 1, time.Second, exitedWith("config_error"))
	if text := verdictText(ex); !strings.Contains(text, pid) || !strings.Contains(text, "port_wait 2s") {
		t.Errorf("the verdict does not name the holder (%s) and the wait:\n%s", pid, text)
	}
	if n := s.CountEvents(isReady); n != 0 {
		t.Fatalf("%d ready events", n)
	}
	if left := s.ours(); len(left) != 0 {
		t.Errorf("this guard's vLLM processes: %v", describe(left))
	}
	if !other.alive() {
		t.Fatal("the other vLLM was stopped")
	}
	testkit.WaitFor(t, "the other vLLM answering", 10*time.Second, func() bool {
		resp, err := http.Get(other.url() + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// Item 3: a process that takes vLLM's port while a restart's vLLM imports
// (after the guard's trial bind, before vLLM's own bind) makes that vLLM
// die of "Address already in use": at a restart that is waited out, the
// status naming the holder, not a configuration error; vLLM starts again
// once the port is free.
func TestPortTakenWhileARestartImportsIsWaitedOut(t *testing.T) {
	t.Parallel()
	s, q := squatWhileARestartImports(t)
	pid := strconv.Itoa(os.Getpid())
	ex := s.WaitEvent("vLLM's death on the taken port", 2, 30*time.Second, isExited)
	if d := ex.Failure.Decision; d.Action != "restart" || !strings.Contains(d.Reason, "held by pid "+pid) {
		t.Fatalf("the decision after the taken port: %+v", d)
	}
	waitHeldFor(s, pid, 3)
	if n := s.CountEvents(isStarting); n != 2 {
		t.Fatalf("%d launches while the port was held, want 2", n)
	}
	q.close()
	s.WaitEvent("the start once the port is free", 3, 30*time.Second, isStarting)
	s.WaitEvent("ready again", 2, 60*time.Second, isReady)
	select {
	case <-s.Exited():
		t.Fatalf("the guard exited %d", s.Code())
	default:
	}
	if got := q.requests(); len(got) != 0 {
		t.Errorf("the squatter was probed: %q", got)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// A process holds vLLM's port only while a restart's vLLM binds it and lets
// go at once: vLLM's own "[Errno 98]" refusal is all that is left when the
// guard looks. At a restart the port served before: the guard waits for it
// and serves again, never exit 78 (issue 41: a brief grab by any local user
// stopped the service for good).
func TestPortGrabbedOnlyWhileARestartBindsIsWaitedOut(t *testing.T) {
	t.Parallel()
	s, q := squatWhileARestartImports(t)
	s.WaitLog("vLLM's bind refusal", 1, 30*time.Second, msgContains("[Errno 98]"))
	q.close() // gone before the guard looks
	ex := s.WaitEvent("vLLM's death on the port it could not bind", 2, 30*time.Second, isExited)
	if d := ex.Failure.Decision; d.Action != "restart" {
		t.Fatalf("the decision after the refused bind: %+v (cause %s)", d, ex.Failure.Verdict.Cause)
	}
	s.WaitEvent("ready again", 1, 60*time.Second, after(ex, isReady))
	select {
	case <-s.Exited():
		t.Fatalf("the guard exited %d", s.Code())
	default:
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// squatWhileARestartImports: a guard that was ready, its vLLM SIGKILLed,
// and the restart's vLLM held in its "imports" (FAKEVLLM_BIND_GATE) until
// a squatter holds its port; then vLLM binds, and fails.
func squatWhileARestartImports(t *testing.T) (*scene, *squatter) {
	t.Helper()
	s := quick(newScene(t))
	portWait(s, "1s")
	gate := filepath.Join(s.dir, "bind-gate")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.env["FAKEVLLM_BIND_GATE"] = gate // while it is missing, vLLM "imports" and has not bound
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(ready.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("the restart (its port tried free)", 2, 30*time.Second, isStarting)
	q := listenSquatter(t, "tcp4", "127.0.0.1:"+strconv.Itoa(s.port))
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return s, q
}
