package integration

// Issue 41 items 4 and 5, and trusted_proxies: what clients hold at the
// guard's doors (the control port, the proxy) cannot shut out the probes
// or other clients. As an attacker sees it: the running guard, connections
// from many loopback addresses, each flood synchronised on the guard
// having read what it was sent (the kernel's socket tables), never on
// time.

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/connlimit"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// tcpEntry is one socket of /proc/net/tcp.
type tcpEntry struct {
	state  int // 1: established
	tx, rx int // bytes in its send queue (not yet acknowledged) and receive queue (not yet read)
	inode  string
}

// tcpTable reads /proc/net/tcp, keyed by "local>remote" (ip:port each).
func tcpTable(t *testing.T) map[string]tcpEntry {
	t.Helper()
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	addr := func(h string) string {
		ip, port, _ := strings.Cut(h, ":")
		b, _ := hex.DecodeString(ip)
		p, _ := strconv.ParseUint(port, 16, 16)
		if len(b) != 4 {
			return ""
		}
		return fmt.Sprintf("%d.%d.%d.%d:%d", b[3], b[2], b[1], b[0], p)
	}
	out := map[string]tcpEntry{}
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		st, _ := strconv.ParseInt(f[3], 16, 32)
		txs, rxs, _ := strings.Cut(f[4], ":")
		tx, _ := strconv.ParseInt(txs, 16, 64)
		rx, _ := strconv.ParseInt(rxs, 16, 64)
		out[addr(f[1])+">"+addr(f[2])] = tcpEntry{state: int(st), tx: int(tx), rx: int(rx), inode: f[9]}
	}
	return out
}

// guardSockets is the inodes of the sockets pid holds.
func guardSockets(t *testing.T, pid int) map[string]bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			out[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	return out
}

// consumed reports whether the guard (pid) has read everything c sent:
// c's bytes are delivered (its send queue is empty) and the guard's end
// is accepted and has nothing left to read; or the guard has closed its
// end.
func consumed(t *testing.T, pid int, c net.Conn) bool {
	tab, socks := tcpTable(t), guardSockets(t, pid)
	cl := tab[c.LocalAddr().String()+">"+c.RemoteAddr().String()]
	srv, ok := tab[c.RemoteAddr().String()+">"+c.LocalAddr().String()]
	if !ok || srv.state != 1 || !socks[srv.inode] {
		return !ok || srv.state != 1 // gone, or closed by the guard (accepted, then let go)
	}
	return cl.tx == 0 && srv.rx == 0
}

// sendRead writes each part on c in turn and, after each, waits until the
// guard has read it (or closed the connection). The last part is read
// only once the guard works on the request: by the server's reading of the
// body, after the request's headers made it active.
func sendRead(t *testing.T, pid int, c net.Conn, parts ...string) {
	t.Helper()
	for i, p := range parts {
		if _, err := io.WriteString(c, p); err != nil {
			return // the guard closed it: nothing held
		}
		testkit.WaitFor(t, fmt.Sprintf("the guard reading part %d from %s", i+1, c.LocalAddr()), 30*time.Second,
			func() bool { return consumed(t, pid, c) })
	}
}

// from opens a TCP connection to addr from the loopback address src.
func from(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("connecting from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// askOnce sends raw on a new connection from src and reads the answer.
func askOnce(t *testing.T, src, addr, raw string) (int, string) {
	t.Helper()
	c := from(t, src, addr)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // against a hang; the guard answers at once
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("request from %s: %v", src, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("answer to %s: %v", src, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

func getClose(path string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
}

const completion = `{"model":"test-model","prompt":"hi","max_tokens":2}`

func post(xff string) string {
	h := "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\n"
	if xff != "" {
		h += "X-Forwarded-For: " + xff + "\r\n"
	}
	return h + fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(completion), completion)
}

// slowPost is an inference request whose body is announced long and sent
// a byte at a time: its headers with the body's first byte, then one more.
func slowPost(xff string) []string {
	h := "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
	if xff != "" {
		h += "X-Forwarded-For: " + xff + "\r\n"
	}
	return []string{h + "Content-Length: 100000\r\n\r\n{", `"`}
}

// Every place of the control port held, by any means, from more addresses
// than its per-address share allows: /livez and /readyz still answer 200.
// Slow bodies (issue 41: `GET /livez` with Content-Length: 100000 and one
// byte held every place for the 10 s read timeout, and /livez answered
// 503), headers never finished, idle keep-alive connections. And the
// proxy: two addresses sending bodies a byte at a time, as many as the
// proxy has places, do not shut a third client out (issue 41: they did,
// with the default share of half the places).
func TestProbesAndClientsAnsweredWhateverOthersHold(t *testing.T) {
	t.Parallel()
	const nofile, proxyCap = 300, 24
	_, ctlCap := connlimit.Caps(nofile, 0)
	if pc, _ := connlimit.Caps(nofile, proxyCap); pc != proxyCap {
		t.Fatalf("the proxy's cap under LimitNOFILE=%d is %d, below %d", nofile, pc, proxyCap)
	}
	s := quick(newScene(t))
	s.nofile = nofile
	s.httpListen = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	proxyAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	// max_connections_per_client is left to its default.
	s.extra = fmt.Sprintf("\n[proxy]\nlisten = %q\nmax_connections = %d\n", proxyAddr, proxyCap)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	pid := s.Cmd.Process.Pid
	per := max(ctlCap/4, 2)
	src := func(i int) string { return fmt.Sprintf("127.0.0.%d", 10+i/per) } // per connections from each
	probes := func(t *testing.T, when string) {
		t.Helper()
		for _, path := range []string{"/livez", "/readyz"} {
			for _, who := range []string{"127.0.0.200", src(0)} {
				if code, body := askOnce(t, who, s.httpListen, getClose(path)); code != http.StatusOK {
					t.Errorf("%s from %s with %s: %d %q; want 200", path, who, when, code, body)
				}
			}
		}
	}

	t.Run("slow bodies", func(t *testing.T) {
		for i := range ctlCap {
			c := from(t, src(i), s.httpListen)
			sendRead(t, pid, c, "GET /livez HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\nx", "x")
		}
		probes(t, fmt.Sprintf("%d slow bodies sent", ctlCap))
	})
	t.Run("headers never finished", func(t *testing.T) {
		for i := range ctlCap {
			c := from(t, src(i), s.httpListen)
			sendRead(t, pid, c, "GET /livez HTTP/1.1\r\n", "Host: loc")
		}
		probes(t, fmt.Sprintf("%d connections sending their headers", ctlCap))
	})
	t.Run("idle connections", func(t *testing.T) {
		for i := range ctlCap {
			c := from(t, src(i), s.httpListen)
			io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close() // kept alive, idle from now on
			}
		}
		probes(t, fmt.Sprintf("%d idle connections", ctlCap))
	})
	t.Run("proxy: two addresses trickling bodies", func(t *testing.T) {
		for i := range proxyCap {
			c := from(t, fmt.Sprintf("127.0.0.%d", 30+i%2), proxyAddr)
			sendRead(t, pid, c, slowPost("")...)
		}
		if code, body := askOnce(t, "127.0.0.40", proxyAddr, post("")); code != http.StatusOK {
			t.Errorf("a third client while two addresses trickle %d bodies: %d %q; want 200", proxyCap, code, body)
		}
	})
	s.stopCleanly(30*time.Second, 5*time.Second)
}

// Behind a load balancer in trusted_proxies, each client it forwards gets
// its own share of max_connections_per_client: one client at its share is
// told 429, another behind the same balancer is served (before, the
// balancer's own address was the one client, and its connections past the
// share were refused at accept whoever they came from). A trusted_proxies
// entry that trusts everyone is warned about, by `check` and in the log.
func TestTrustedProxyClientsEachGetAShare(t *testing.T) {
	t.Parallel()
	const balancer = "127.0.0.9"
	s := quick(newScene(t))
	proxyAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	// "::/0" trusts every IPv6 client (none here: the clients are IPv4
	// loopback addresses), and is warned about.
	s.extra = fmt.Sprintf("\n[proxy]\nlisten = %q\nmax_connections = 64\nmax_connections_per_client = 2\ntrusted_proxies = [%q, \"::/0\"]\n",
		proxyAddr, balancer)
	s.start()
	s.WaitEvent("ready", 1, 60*time.Second, isReady)
	pid := s.Cmd.Process.Pid

	// Client A, behind the balancer, has its two requests in progress.
	var slow []net.Conn
	for range 2 {
		c := from(t, balancer, proxyAddr)
		sendRead(t, pid, c, slowPost("203.0.113.7")...)
		slow = append(slow, c)
	}
	if code, body := askOnce(t, balancer, proxyAddr, post("203.0.113.7")); code != http.StatusTooManyRequests || !strings.Contains(body, "max_connections_per_client") {
		t.Errorf("client A's third request: %d %q; want 429 naming max_connections_per_client", code, body)
	}
	// A spoofed hop left of A's address changes nothing: the balancer
	// names the client on the right.
	if code, body := askOnce(t, balancer, proxyAddr, post("198.51.100.1, 203.0.113.7")); code != http.StatusTooManyRequests {
		t.Errorf("client A's request with a made-up hop before it: %d %q; want 429", code, body)
	}
	if code, body := askOnce(t, balancer, proxyAddr, post("203.0.113.8")); code != http.StatusOK {
		t.Errorf("client B behind the same balancer: %d %q; want 200", code, body)
	}

	for _, c := range slow {
		c.Close() // client A gives up: the guard's stop waits for no body
	}

	everyone := func(l map[string]any) bool {
		m, _ := l["msg"].(string)
		return l["level"] == "warn" && strings.Contains(m, `"::/0" trusts every address`)
	}
	cfg := filepath.Join(s.dir, "vllm-guard.toml")
	if out := guardCLI(t, "check", "--config", cfg); !strings.Contains(out, `warning: [proxy] trusted_proxies: "::/0" trusts every address`) {
		t.Errorf("check with trusted_proxies ::/0 says no warning:\n%s", out)
	}
	v4 := filepath.Join(t.TempDir(), "vllm-guard.toml")
	if err := os.WriteFile(v4, []byte("[proxy]\nlisten = \"127.0.0.1:0\"\ntrusted_proxies = [\"0.0.0.0/0\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := guardCLI(t, "check", "--config", v4); !strings.Contains(out, `warning: [proxy] trusted_proxies: "0.0.0.0/0" trusts every address`) {
		t.Errorf("check with trusted_proxies 0.0.0.0/0 says no warning:\n%s", out)
	}
	s.WaitLog("the warning about trusted_proxies ::/0", 1, 30*time.Second, everyone)
	s.stopCleanly(30*time.Second, 5*time.Second)
}
