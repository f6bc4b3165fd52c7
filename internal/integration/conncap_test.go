package integration

// Issue 32 item 1: every listener of the running guard caps its
// connections. Seen from outside, as an attacker with a connection loop
// sees it: the control port (its cap once fell off, serving the raw
// listener), the control socket and the proxy.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/connlimit"
	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// openFDs is how many descriptors pid has open.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// keptConn is a keep-alive connection that asked once and was answered.
type keptConn struct {
	c   net.Conn
	r   *bufio.Reader
	src string // the client address it came from
}

// ask sends one GET on k and returns the answer's status; an error when
// the guard closed the connection (evicted, or refused at accept).
func (k *keptConn) ask(host, path string) (int, error) {
	// A bound against a hang, never reached by a guard that answers.
	_ = k.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// capCheck is one listener under a connection loop.
type capCheck struct {
	name       string
	dial       func(src string) (net.Conn, error)
	sources    []string // client addresses, in turn; the first takes half of the connections
	host, path string   // what each connection asks (an answer of 200)
	cap, per   int      // the listener's caps: open connections, and from one source
}

// flood opens n connections one after another, each asking once and kept
// alive, then asks again on each: the guard keeps at most c.cap of them
// (and c.per from one source) and closed the others, evicted or refused.
// It returns the connections still held, to be closed by the caller.
func (c capCheck) flood(t *testing.T, n int) []*keptConn {
	t.Helper()
	var all []*keptConn
	for i := range n {
		src := c.sources[0]
		if i%2 == 1 && len(c.sources) > 1 {
			src = c.sources[1+(i/2)%(len(c.sources)-1)]
		}
		nc, err := c.dial(src)
		if err != nil {
			t.Fatalf("%s: connection %d from %s: %v", c.name, i, src, err)
		}
		k := &keptConn{c: nc, r: bufio.NewReader(nc), src: src}
		all = append(all, k)
		// 200, or 503 "too many open connections" when no place was free.
		if code, err := k.ask(c.host, c.path); err == nil && code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Fatalf("%s: connection %d: %d", c.name, i, code)
		}
	}
	var held []*keptConn
	bySrc := map[string]int{}
	for _, k := range all {
		if code, err := k.ask(c.host, c.path); err == nil && code == http.StatusOK {
			held = append(held, k)
			bySrc[k.src]++
			continue
		}
		k.c.Close()
	}
	if len(held) > c.cap || len(held) == 0 {
		t.Errorf("%s: %d of %d keep-alive connections still served; want 1 to %d (the cap)", c.name, len(held), n, c.cap)
	}
	for src, m := range bySrc {
		if m > c.per {
			t.Errorf("%s: %d connections from %s still served; want at most %d", c.name, m, src, c.per)
		}
	}
	return held
}

// More connections than each listener's cap, from one client address and
// from several, against the running guard: each listener keeps at most its
// cap, evicting the oldest idle connection or refusing; the guard's
// descriptors stay bounded; /livez and `status` still answer; and vLLM,
// killed while the connections are held, is restarted and its incident
// recorded. The guard runs under LimitNOFILE=300, so that its caps are
// small (control: 18, 4 from one address) and the test's connections few.
func TestEveryListenerCapsItsConnections(t *testing.T) {
	t.Parallel()
	const nofile = 300
	_, ctlCap := connlimit.Caps(nofile, 0)
	const proxyCap, proxyPer = 12, 4
	if pc, _ := connlimit.Caps(nofile, proxyCap); pc != proxyCap {
		t.Fatalf("the proxy's cap under LimitNOFILE=%d is %d, below %d: choose a smaller one", nofile, pc, proxyCap)
	}
	s := quick(newScene(t))
	s.nofile = nofile
	s.httpListen = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	proxyAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	s.extra = fmt.Sprintf("\n[restart]\ninitial_delay = \"100ms\"\n\n[proxy]\nlisten = %q\nmax_connections = %d\nmax_connections_per_client = %d\n",
		proxyAddr, proxyCap, proxyPer)
	s.start()
	ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)
	guard := s.Cmd.Process.Pid
	base := openFDs(t, guard)

	tcp := func(addr string) func(string) (net.Conn, error) {
		return func(src string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
			return d.Dial("tcp", addr)
		}
	}
	sources := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"}
	checks := []capCheck{
		{name: "[control] http_listen", dial: tcp(s.httpListen), sources: sources, host: "localhost", path: "/livez",
			cap: ctlCap, per: max(ctlCap/4, 2)},
		{name: "the control socket", dial: func(string) (net.Conn, error) { return net.Dial("unix", s.socket()) },
			sources: []string{"local"}, host: "guard", path: "/status", cap: ctlCap, per: ctlCap},
		{name: "[proxy] listen", dial: tcp(proxyAddr), sources: sources, host: "localhost", path: "/health",
			cap: proxyCap, per: proxyPer},
	}
	var held []*keptConn
	defer func() {
		for _, k := range held {
			k.c.Close()
		}
	}()
	for _, c := range checks {
		held = append(held, c.flood(t, c.cap+50)...)
	}
	// Each held connection is one descriptor, a proxied one perhaps two
	// (its connection to vLLM); 16 for what the guard opens meanwhile.
	bound := base + 2*ctlCap + 2*proxyCap + 16
	if n := openFDs(t, guard); n > bound {
		t.Errorf("the guard holds %d descriptors with the connections open (%d before them); want at most %d", n, base, bound)
	}

	// vLLM dies while every listener is full.
	if err := syscall.Kill(ready.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.WaitEvent("vLLM's death", 1, 30*time.Second, isExited)
	probe := func(when string) {
		t.Helper()
		cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
		resp, err := cl.Get("http://" + s.httpListen + "/livez")
		if err != nil {
			t.Fatalf("/livez %s: %v", when, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/livez %s: %d %q; want 200", when, resp.StatusCode, body)
		}
		sc := control.NewClient(s.socket())
		defer sc.CloseIdleConnections()
		if _, err := sc.Status(t.Context()); err != nil {
			t.Fatalf("status on the socket %s: %v", when, err)
		}
	}
	probe("after vLLM died, every listener full")
	s.WaitEvent("ready after the restart", 2, 60*time.Second, isReady)
	probe("after the restart")
	if n := openFDs(t, guard); n > bound {
		t.Errorf("the guard holds %d descriptors after the restart (%d before the connections); want at most %d", n, base, bound)
	}
	rec := s.WaitEvent("the death's incident record", 1, 30*time.Second, kind(events.KindIncident))
	if _, err := os.Stat(rec.Reason); err != nil || !strings.HasPrefix(rec.Reason, filepath.Join(s.dir, "state", "incidents")) {
		t.Errorf("the incident of vLLM's death was not recorded: %q (%v)", rec.Reason, err)
	}
	if s.CountLogs(msgContains("too many open files")) > 0 {
		t.Error("the guard ran out of descriptors")
	}
	for _, k := range held {
		k.c.Close()
	}
	held = nil
	s.stopCleanly(30*time.Second, 5*time.Second)
}
