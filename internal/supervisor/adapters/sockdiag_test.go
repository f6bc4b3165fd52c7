package adapters

import (
	"net"
	"testing"
)

// sock_diag's answer for a connection agrees with /proc/net/tcp's (the
// oracle VLLMOnly read before): the listener on the port and the socket
// that accepted the connection, with their inodes, for an IPv4 listener
// and for a dual-stack one that accepts IPv4 clients on v4-mapped sockets.
func TestSockDiagAgreesWithProcNetTCP(t *testing.T) {
	for _, c := range []struct{ network, listen, dial string }{
		{"tcp4", "127.0.0.1:0", "127.0.0.1"},
		{"tcp", "[::]:0", "127.0.0.1"},
	} {
		ln, err := net.Listen(c.network, c.listen)
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		conn, err := net.DialTCP("tcp", nil, &net.TCPAddr{IP: net.ParseIP(c.dial), Port: port})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		local, remote := conn.LocalAddr().(*net.TCPAddr), conn.RemoteAddr().(*net.TCPAddr)
		got, err := diagSockets(local, remote)
		if err != nil {
			t.Fatalf("%s: sock_diag: %v", c.listen, err)
		}
		pick := func(ls []Listener) (listener, accepted Listener) {
			for _, l := range ls {
				switch {
				case l.State == "0A" && l.Port == port:
					listener = l
				case l.State != "0A" && l.Port == port && l.Rport == local.Port && l.Rip.Equal(local.IP):
					accepted = l
				}
			}
			return
		}
		gl, ga := pick(got)
		wl, wa := pick(ReadSockets())
		if gl.Inode == 0 || gl.Inode != wl.Inode || !gl.Ip.Equal(wl.Ip) {
			t.Errorf("%s: the listener from sock_diag %+v, from /proc/net/tcp %+v", c.listen, gl, wl)
		}
		if ga.Inode == 0 || ga.Inode != wa.Inode || !ga.Ip.Equal(wa.Ip) || ga.Uid != wa.Uid {
			t.Errorf("%s: the accepted socket from sock_diag %+v, from /proc/net/tcp %+v", c.listen, ga, wa)
		}
		srv.Close()
		conn.Close()
		ln.Close()
	}
}

// The kernel's answers are read without trusting their length: a short
// one is an error, any other is a socket, never a panic.
func FuzzParseDiagMsg(f *testing.F) {
	f.Add(make([]byte, diagMsgLen))
	f.Add([]byte{2, 10, 0, 0})
	long := make([]byte, diagMsgLen+8)
	long[0], long[1] = 10, 1
	f.Add(long)
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := parseDiagMsg(b)
		if (err != nil) != (len(b) < diagMsgLen) {
			t.Fatalf("%d bytes: err %v", len(b), err)
		}
		if err == nil && (len(l.State) != 2 || l.Port > 65535 || l.Rport > 65535) {
			t.Fatalf("%d bytes: %+v", len(b), l)
		}
	})
}
