package adapters

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
		if got := PortHolder(host, port); !strings.HasPrefix(got, want) || !strings.Contains(got, "listening on 127.0.0.1:"+strconv.Itoa(port)) {
			t.Errorf("portHolder(%q, %d) = %q, want it to start %q", host, port, got, want)
		}
	}
	if got := PortHolder("127.0.0.2", port); got != "" {
		t.Errorf("portHolder(127.0.0.2) = %q: a listener on 127.0.0.1 does not stop that bind", got)
	}
	ln.Close()
	if got := PortHolder("127.0.0.1", port); got != "" {
		t.Errorf("portHolder after close = %q", got)
	}
}

func TestParseListeners(t *testing.T) {
	tcp := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 0 1 0000000000000000 20 4 30 10 -1
`)
	ls := ParseListeners(tcp)
	if len(ls) != 1 || !ls[0].Ip.Equal(net.IPv4(127, 0, 0, 1)) || ls[0].Port != 8000 || ls[0].Uid != 1000 || ls[0].Inode != 12345 {
		t.Fatalf("listeners %+v", ls)
	}
	tcp6 := []byte(`  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 778 1 0000000000000000 100 0 0 10 0
`)
	ls = ParseListeners(tcp6)
	if len(ls) != 2 || !ls[0].Ip.IsUnspecified() || ls[0].Port != 8000 || !ls[1].Ip.Equal(net.IPv6loopback) || ls[1].Port != 8001 {
		t.Fatalf("tcp6 listeners %+v", ls)
	}
	l4 := Listener{Ip: net.IPv4zero.To4(), Port: 8000, Inode: 1}
	l6 := Listener{Ip: net.IPv6unspecified, Port: 8000, Inode: 2}
	lo := Listener{Ip: net.IPv4(127, 0, 0, 1).To4(), Port: 8000, Inode: 3}
	lo6 := Listener{Ip: net.IPv6loopback, Port: 8000, Inode: 4}
	dst := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000}
	for _, c := range []struct {
		Ls   []Listener
		Dst  *net.TCPAddr
		Want []uint64
	}{
		{[]Listener{l4, l6, lo}, dst, []uint64{3}}, // the address itself first
		{[]Listener{l6, l4}, dst, []uint64{1}},     // then IPv4's wildcard: a [::] beside it is V6ONLY
		{[]Listener{l6}, dst, []uint64{2}},         // then a dual-stack [::]
		{[]Listener{lo6, l4}, &net.TCPAddr{IP: net.IPv6loopback, Port: 8000}, []uint64{4}},
		{[]Listener{l4}, &net.TCPAddr{IP: net.IPv6loopback, Port: 8000}, nil}, // IPv4 takes no IPv6
		{[]Listener{l4}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8001}, nil},
	} {
		var got []uint64
		for _, l := range Takers(c.Ls, c.Dst) {
			got = append(got, l.Inode)
		}
		if !slices.Equal(got, c.Want) {
			t.Errorf("takers(%v, %s) = %v, want %v", c.Ls, c.Dst, got, c.Want)
		}
	}
}

// listenV6Only listens on [::]:port with IPV6_V6ONLY=1, as nginx's
// "listen [::]:8000 ipv6only=on" does.
func ListenV6Only(t *testing.T, port int) net.Listener {
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
	port := testkit.FreePort(t)
	ln := ListenV6Only(t, port)
	defer ln.Close()
	for _, host := range []string{"127.0.0.1", "0.0.0.0", ""} {
		if got := PortHolder(host, port); got != "" {
			t.Errorf("portHolder(%q) = %q: an IPV6_V6ONLY listener on [::] does not stop an IPv4 bind", host, got)
		}
	}
	want := "pid " + strconv.Itoa(os.Getpid()) + " ("
	if got := PortHolder("::", port); !strings.HasPrefix(got, want) {
		t.Errorf("portHolder(::) = %q, want it to start %q", got, want)
	}
}

// A bound socket that does not listen yet (vLLM binds before it loads and
// listens only after) holds the port too; the holder is said to be one.
func TestPortHolderSeesABoundSocket(t *testing.T) {
	port := testkit.FreePort(t)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if got := PortHolder("127.0.0.1", port); !strings.Contains(got, "does not listen yet") {
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
		dial := VLLMOnly(d.DialContext, func() []int { return tree })
		if c, err := dial(context.Background(), "tcp", addr); err == nil {
			c.Close()
			t.Fatalf("tree %v: connected to a listener outside it", tree)
		} else if nv := (*NotVLLMs)(nil); !errors.As(err, &nv) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
			t.Fatalf("tree %v: error %v, want one naming the holder", tree, err)
		}
	}
	ours := VLLMOnly(d.DialContext, func() []int { return []int{os.Getpid()} })
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
	vllm := Listener{Ip: lo, Port: 8000, Inode: 10, State: "0A", Rip: net.IPv4zero.To4()}
	other := Listener{Ip: lo, Port: 8000, Inode: 20, State: "0A", Rip: net.IPv4zero.To4()}
	accepted := func(inode uint64) Listener {
		return Listener{Ip: lo, Port: 8000, Inode: inode, State: "01", Rip: lo, Rport: 40000}
	}
	ours := func(inode uint64) bool { return inode == 10 || inode == 11 }
	for _, c := range []struct {
		Name  string
		Socks []Listener
		OK    bool
	}{
		{"vLLM's listener, not accepted yet", []Listener{vllm, accepted(0)}, true},
		{"vLLM's listener, accepted by vLLM", []Listener{vllm, accepted(11)}, true},
		{"another's listener", []Listener{other, accepted(0)}, false},
		{"vLLM's listener, accepted by another", []Listener{vllm, accepted(21)}, false},
		{"no listener", []Listener{accepted(11)}, false},
	} {
		if err := JudgeConn(c.Socks, local, remote, ours); (err == nil) != c.OK {
			t.Errorf("%s: %v", c.Name, err)
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
		for _, l := range ParseListeners(b) {
			if l.Port < 0 || l.Port > 65535 || (len(l.Ip) != 4 && len(l.Ip) != 16) || l.State != "0A" || (len(l.Rip) != 4 && len(l.Rip) != 16) {
				t.Fatalf("listener %+v from %q", l, b)
			}
		}
	})
}
