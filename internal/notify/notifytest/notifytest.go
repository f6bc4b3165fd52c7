// Package notifytest is a stand-in for systemd's notification socket in
// tests: it listens on a real unixgram socket, points NOTIFY_SOCKET at it,
// and hands back the datagrams the guard sent, in order. Integration tests
// pass Path() to a guard process in its environment.
package notifytest

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Socket is a listening notification socket.
type Socket struct {
	conn *net.UnixConn
	path string
}

// Listen opens a socket in a fresh temporary folder, sets NOTIFY_SOCKET to
// it for the rest of the test (so the test must not be parallel) and closes
// it when the test ends.
func Listen(t testing.TB) *Socket {
	t.Helper()
	s := Open(t)
	t.Setenv("NOTIFY_SOCKET", s.path)
	return s
}

// Open is Listen without NOTIFY_SOCKET: the test hands Path() to the
// process it starts, in that process's environment, and may run in
// parallel with others.
func Open(t testing.TB) *Socket {
	t.Helper()
	// os.MkdirTemp, not t.TempDir: a socket path must stay under 108 bytes
	// and t.TempDir embeds the test's name.
	dir, err := os.MkdirTemp("", "sdnotify-")
	if err != nil {
		t.Fatalf("notifytest: %v", err)
	}
	path := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("notifytest: listen on %s: %v", path, err)
	}
	t.Cleanup(func() {
		conn.Close()
		os.RemoveAll(dir)
	})
	return &Socket{conn: conn, path: path}
}

// Path is the socket's path, the value of NOTIFY_SOCKET.
func (s *Socket) Path() string { return s.path }

// Read returns the next datagram, or false when none came within timeout.
func (s *Socket) Read(timeout time.Duration) (string, bool) {
	buf := make([]byte, 64<<10)
	_ = s.conn.SetReadDeadline(time.Now().Add(timeout))
	n, err := s.conn.Read(buf)
	if err != nil { // the deadline passed, or the socket was closed
		return "", false
	}
	return string(buf[:n]), true
}

// Drain returns the datagrams already queued, without waiting for more.
func (s *Socket) Drain() []string {
	var out []string
	for {
		m, ok := s.Read(time.Millisecond)
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

// Await reads datagrams until one satisfies match and returns every one it
// read, the match last. It fails the test, listing what came, when none
// matches within timeout.
func (s *Socket) Await(t testing.TB, what string, match func(string) bool, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var seen []string
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("notifytest: no %s within %s; got %d datagrams:\n%s", what, timeout, len(seen), strings.Join(seen, "\n"))
		}
		m, ok := s.Read(left)
		if !ok {
			continue
		}
		seen = append(seen, m)
		if match(m) {
			return seen
		}
	}
}
