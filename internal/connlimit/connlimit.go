// Package connlimit caps the open connections of the guard's TCP listeners
// (the proxy and [control] http_listen) so that clients cannot take the
// file descriptors that supervising vLLM needs: pipes for its output, the
// keeper, the control socket, state files. A connection over the cap is
// answered with a short 503 and closed as soon as it is accepted: it never
// holds a descriptor for longer than one non-blocking write.
package connlimit

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Descriptor budget. Reserve is kept for supervision (vLLM's stdout and
// stderr pipes, the keeper's report pipe, the control socket and its
// clients, NVML, state and incident files, the log): 256, or half of a
// smaller limit. Of the rest, the control HTTP listener gets an eighth, at
// least 4 and at most ControlMax (probes and scrapes are few and short),
// and the proxy gets half of what remains, because each of its client
// connections may hold a connection to vLLM as well.
const (
	Reserve    = 256
	ControlMax = 64
)

// Caps returns the connection caps of the proxy (at most proxyMax, the
// configured [proxy] max_connections) and of the control HTTP listener for
// a process whose descriptor limit is nofile.
func Caps(nofile uint64, proxyMax int) (proxy, control int) {
	reserve := min(uint64(Reserve), nofile/2)
	rest := nofile - reserve
	control = int(min(max(rest/8, 4), ControlMax))
	avail := uint64(0)
	if rest > uint64(control) {
		avail = (rest - uint64(control)) / 2
	}
	proxy = int(min(uint64(max(proxyMax, 1)), max(avail, 1)))
	return proxy, control
}

// NoFile is the process's descriptor limit (RLIMIT_NOFILE, soft; Go raises
// it to the hard limit at start). It falls back to 1024 if unreadable.
func NoFile() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return rl.Cur
}

// refusal is written to a connection over the cap.
var refusal = func() []byte {
	const body = "vllm-guard: too many open connections; retry shortly\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n" +
		"Retry-After: 1\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// Listener is a net.Listener with at most Max connections open at once.
type Listener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused atomic.Uint64
}

// New caps l at max open connections (at least 1).
func New(l net.Listener, limit int) *Listener {
	return &Listener{Listener: l, max: int64(max(limit, 1))}
}

// Max is the cap.
func (l *Listener) Max() int { return int(l.max) }

// Open is the number of connections open now.
func (l *Listener) Open() int { return int(l.open.Load()) }

// Refused is the number of connections closed at accept because the cap
// was reached.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Accept returns the next connection under the cap; those over it are
// answered 503 and closed here, and Accept goes on waiting.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			// A fresh socket's send buffer is empty: the write does not
			// block; the deadline is a guard against the impossible.
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = c.Write(refusal)
			_ = c.Close()
			continue
		}
		return &conn{Conn: c, l: l}, nil
	}
}

// conn gives its place back once, on the first Close.
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
