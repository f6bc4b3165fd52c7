package supervisor

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// A listener of this test process on vLLM's port is found and named by
// pid and command; one on another address of the same port is not in the
// way of a specific bind.
func TestPortHolderNamesTheListener(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	want := "pid " + strconv.Itoa(os.Getpid()) + " ("
	for _, host := range []string{"127.0.0.1", "0.0.0.0", "", "::", "localhost"} {
		if got := portHolder(host, port); !strings.HasPrefix(got, want) || !strings.Contains(got, "listening on 127.0.0.1:"+strconv.Itoa(port)) {
			t.Errorf("portHolder(%q, %d) = %q, want it to start %q", host, port, got, want)
		}
	}
	if got := portHolder("127.0.0.2", port); got != "" {
		t.Errorf("portHolder(127.0.0.2) = %q: a listener on 127.0.0.1 does not stop that bind", got)
	}
	ln.Close()
	if got := portHolder("127.0.0.1", port); got != "" {
		t.Errorf("portHolder after close = %q", got)
	}
}

func TestParseListeners(t *testing.T) {
	tcp := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 0 1 0000000000000000 20 4 30 10 -1
`)
	ls := parseListeners(tcp)
	if len(ls) != 1 || !ls[0].ip.Equal(net.IPv4(127, 0, 0, 1)) || ls[0].port != 8000 || ls[0].uid != 1000 || ls[0].inode != 12345 {
		t.Fatalf("listeners %+v", ls)
	}
	tcp6 := []byte(`  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 778 1 0000000000000000 100 0 0 10 0
`)
	ls = parseListeners(tcp6)
	if len(ls) != 2 || !ls[0].ip.IsUnspecified() || ls[0].port != 8000 || !ls[1].ip.Equal(net.IPv6loopback) || ls[1].port != 8001 {
		t.Fatalf("tcp6 listeners %+v", ls)
	}
	l4 := listener{ip: net.IPv4zero.To4(), port: 8000, inode: 1}
	l6 := listener{ip: net.IPv6unspecified, port: 8000, inode: 2}
	lo := listener{ip: net.IPv4(127, 0, 0, 1).To4(), port: 8000, inode: 3}
	lo6 := listener{ip: net.IPv6loopback, port: 8000, inode: 4}
	dst := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000}
	for _, c := range []struct {
		ls   []listener
		dst  *net.TCPAddr
		want []uint64
	}{
		{[]listener{l4, l6, lo}, dst, []uint64{3}}, // the address itself first
		{[]listener{l6, l4}, dst, []uint64{1}},     // then IPv4's wildcard: a [::] beside it is V6ONLY
		{[]listener{l6}, dst, []uint64{2}},         // then a dual-stack [::]
		{[]listener{lo6, l4}, &net.TCPAddr{IP: net.IPv6loopback, Port: 8000}, []uint64{4}},
		{[]listener{l4}, &net.TCPAddr{IP: net.IPv6loopback, Port: 8000}, nil}, // IPv4 takes no IPv6
		{[]listener{l4}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8001}, nil},
	} {
		var got []uint64
		for _, l := range takers(c.ls, c.dst) {
			got = append(got, l.inode)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("takers(%v, %s) = %v, want %v", c.ls, c.dst, got, c.want)
		}
	}
}

// listenV6Only listens on [::]:port with IPV6_V6ONLY=1, as nginx's
// "listen [::]:8000 ipv6only=on" does.
func listenV6Only(t *testing.T, port int) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 1) }); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp6", net.JoinHostPort("::", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("listen on [::]:%d with IPV6_V6ONLY: %v", port, err)
	}
	return ln
}

// Issue 41 item 3: a listener on [::]:port with IPV6_V6ONLY=1 is not in
// the way of vLLM's bind on 127.0.0.1 (or 0.0.0.0): the trial bind
// works, so the port is free; a bind on [::] itself meets it.
func TestPortHolderIgnoresAnIPv6OnlyListener(t *testing.T) {
	port := freePortT(t)
	ln := listenV6Only(t, port)
	defer ln.Close()
	for _, host := range []string{"127.0.0.1", "0.0.0.0", ""} {
		if got := portHolder(host, port); got != "" {
			t.Errorf("portHolder(%q) = %q: an IPV6_V6ONLY listener on [::] does not stop an IPv4 bind", host, got)
		}
	}
	want := "pid " + strconv.Itoa(os.Getpid()) + " ("
	if got := portHolder("::", port); !strings.HasPrefix(got, want) {
		t.Errorf("portHolder(::) = %q, want it to start %q", got, want)
	}
}

func freePortT(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// A bound socket that does not listen yet (vLLM binds before it loads and
// listens only after) holds the port too; the holder is said to be one.
func TestPortHolderSeesABoundSocket(t *testing.T) {
	port := freePortT(t)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if got := portHolder("127.0.0.1", port); !strings.Contains(got, "does not listen yet") {
		t.Errorf("portHolder = %q, want the bound socket", got)
	}
}

// vllmOnly keeps a connection only to a listener of the tree it is given:
// the test process's own listener is reached with its pid as the tree;
// with another tree, or none, the connection is closed before a byte is
// sent, with an error naming the holder.
func TestVLLMOnlyReachesTheTreesListenerOnly(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var got atomic.Int64 // bytes the listener received
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				n, _ := io.Copy(io.Discard, c)
				got.Add(n)
				c.Close()
			}()
		}
	}()
	d := &net.Dialer{Timeout: time.Second}
	addr := ln.Addr().String()
	for _, tree := range [][]int{{1}, nil} {
		dial := vllmOnly(d.DialContext, func() []int { return tree })
		if c, err := dial(context.Background(), "tcp", addr); err == nil {
			c.Close()
			t.Fatalf("tree %v: connected to a listener outside it", tree)
		} else if nv := (*notVLLMs)(nil); !errors.As(err, &nv) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
			t.Fatalf("tree %v: error %v, want one naming the holder", tree, err)
		}
	}
	ours := vllmOnly(d.DialContext, func() []int { return []int{os.Getpid()} })
	c, err := ours(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatalf("the tree's own listener: %v", err)
	}
	c.Write([]byte("ping"))
	c.Close()
	testkit.WaitFor(t, "the tree's own bytes", 5*time.Second, func() bool { return got.Load() == 4 })
}

// judgeConn: the listeners that may take the connection must be the
// tree's, and so must the process that accepted it, if one did: a
// listener that accepted it and closed, replaced by vLLM's since, is
// caught by its accepted end.
func TestJudgeConn(t *testing.T) {
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000}
	lo := net.IPv4(127, 0, 0, 1).To4()
	vllm := listener{ip: lo, port: 8000, inode: 10, state: "0A", rip: net.IPv4zero.To4()}
	other := listener{ip: lo, port: 8000, inode: 20, state: "0A", rip: net.IPv4zero.To4()}
	accepted := func(inode uint64) listener {
		return listener{ip: lo, port: 8000, inode: inode, state: "01", rip: lo, rport: 40000}
	}
	ours := func(inode uint64) bool { return inode == 10 || inode == 11 }
	for _, c := range []struct {
		name  string
		socks []listener
		ok    bool
	}{
		{"vLLM's listener, not accepted yet", []listener{vllm, accepted(0)}, true},
		{"vLLM's listener, accepted by vLLM", []listener{vllm, accepted(11)}, true},
		{"another's listener", []listener{other, accepted(0)}, false},
		{"vLLM's listener, accepted by another", []listener{vllm, accepted(21)}, false},
		{"no listener", []listener{accepted(11)}, false},
	} {
		if err := judgeConn(c.socks, local, remote, ours); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// FuzzParseListeners: any text (a truncated or future /proc/net/tcp) is
// read without a panic, and what it yields is a listener on a real port.
func FuzzParseListeners(f *testing.F) {
	f.Add([]byte("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 100 0 0 10 0\n"))
	f.Add([]byte("h\n 0: 00000000000000000000000001000000:1F41 0:0 0A 0 0 0 0 0 778\n"))
	f.Add([]byte("h\n 0: ZZ:1F41 0:0 0A 0 0 0 0 0 1\n 1: 0100007F: x 0A a b c d e f\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, l := range parseListeners(b) {
			if l.port < 0 || l.port > 65535 || (len(l.ip) != 4 && len(l.ip) != 16) || l.state != "0A" || (len(l.rip) != 4 && len(l.rip) != 16) {
				t.Fatalf("listener %+v from %q", l, b)
			}
		}
	})
}
