package supervisor

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
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
	if !clashes("127.0.0.1", ls[0].ip) || clashes("127.0.0.1", ls[1].ip) || !clashes("::1", ls[1].ip) {
		t.Error("clashes misjudges a wildcard or a specific IPv6 address")
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
			if l.port < 0 || l.port > 65535 || (len(l.ip) != 4 && len(l.ip) != 16) {
				t.Fatalf("listener %+v from %q", l, b)
			}
		}
	})
}
