// Package connlimit caps the open connections of the guard's listeners
// (the proxy, [control] http_listen and the control socket) so that clients cannot take the
// file descriptors that supervising vLLM needs: pipes for its output, the
// keeper, the control socket, state files. A connection over the cap is
// answered with a short 503 and closed as soon as it is accepted: it never
// holds a descriptor for longer than one non-blocking write.
package connlimit

import (
	"container/list"
	"net"
	"net/http"
	"net/netip"
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

// Listener is a net.Listener with at most Max connections open at once,
// and at most PerSource from one client address.
//
// Connections the HTTP server is not working on (accepted with no request
// read yet, or kept alive between requests: ConnState New or Idle) do not
// hold their place: a new connection over a cap takes the place of the
// oldest such one, which is closed. Only connections with a request in
// progress count against a newcomer, so idle keep-alive connections (and
// requests whose headers never finish) cannot shut anyone out, and
// /livez cannot be starved by them (issue 24: 64 idle connections made the
// control port answer 503 for a minute). Set ConnState as the
// http.Server's ConnState hook.
type Listener struct {
	net.Listener
	max, perSource int
	refused        atomic.Uint64
	evicted        atomic.Uint64

	mu       sync.Mutex
	open     int
	bySource map[netip.Prefix]int
	waiting  list.List // of *conn not working on a request, oldest first

	// wait: past the cap Accept waits for a place instead of refusing,
	// and only idle connections give theirs (NewWaiting).
	wait   bool
	cond   sync.Cond // with mu: a place freed, a connection went idle, or Close
	closed bool
}

// New caps l at max open connections (at least 1), none per source.
func New(l net.Listener, limit int) *Listener { return NewPerSource(l, limit, 0) }

// NewPerSource caps l at limit open connections and at perSource from one
// client address (an IPv6 /64 counts as one); perSource <= 0 or above
// limit: only limit applies.
func NewPerSource(l net.Listener, limit, perSource int) *Listener {
	limit = max(limit, 1)
	if perSource <= 0 || perSource > limit {
		perSource = limit
	}
	ln := &Listener{Listener: l, max: limit, perSource: perSource, bySource: map[netip.Prefix]int{}}
	ln.waiting.Init()
	ln.cond.L = &ln.mu
	return ln
}

// NewWaiting caps l at limit open connections for clients that would
// rather wait than be refused (the control socket: its owner's and group's
// scripts, 200 `status` at once must all be answered). Past the cap Accept
// waits for a place: the newcomers wait in the kernel's backlog, holding no
// descriptor of the guard's. A connection idle between requests gives its
// place to a newcomer; one still sending its headers does not (the
// server's header timeout ends it).
func NewWaiting(l net.Listener, limit int) *Listener {
	ln := NewPerSource(l, limit, 0)
	ln.wait = true
	return ln
}

// Close closes the listener and wakes an Accept waiting for a place.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

// Max is the cap.
func (l *Listener) Max() int { return l.max }

// PerSource is the cap for one client address.
func (l *Listener) PerSource() int { return l.perSource }

// Open is the number of connections open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Refused is the number of connections closed at accept because a cap was
// reached with every connection under it working on a request.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Evicted is the number of idle connections closed to make room.
func (l *Listener) Evicted() uint64 { return l.evicted.Load() }

// source is the client's address as the per-source cap counts it.
func source(a net.Addr) netip.Prefix {
	if a == nil {
		return netip.Prefix{} // a unix socket's peer: one source
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}
	}
	ip := ap.Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64 // one host's privacy addresses share its /64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// Accept returns the next connection within the caps, closing the oldest
// idle connection (of the same source, when that cap is the one reached)
// to make room; a connection that finds none to replace is answered 503
// and closed here, and Accept goes on waiting.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		nc := &conn{Conn: c, l: l, src: source(c.RemoteAddr())}
		var victims []*conn
		ok := true
		l.mu.Lock()
		// A waiting listener holds the newcomer (one descriptor over the
		// cap at most) until a place frees or an idle connection can give
		// its own; those behind it wait in the kernel's backlog.
		for l.wait && !l.closed && l.open >= l.max && l.oldestWaitingLocked(netip.Prefix{}, false) == nil {
			l.cond.Wait()
		}
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return nil, net.ErrClosed
		}
		if l.bySource[nc.src] >= l.perSource {
			if v := l.oldestWaitingLocked(nc.src, true); v != nil {
				l.dropLocked(v)
				victims = append(victims, v)
			} else {
				ok = false
			}
		}
		if ok && l.open >= l.max {
			if v := l.oldestWaitingLocked(netip.Prefix{}, false); v != nil {
				l.dropLocked(v)
				victims = append(victims, v)
			} else {
				ok = false
			}
		}
		if ok {
			l.open++
			l.bySource[nc.src]++
			// Waiting (replaceable) once the server says so: with no
			// ConnState hook every connection holds its place.
		}
		l.mu.Unlock()
		for _, v := range victims {
			l.evicted.Add(1)
			_ = v.Conn.Close() // the server's read fails; it forgets the connection
		}
		if ok {
			return nc, nil
		}
		l.refused.Add(1)
		// A fresh socket's send buffer is empty: the write does not
		// block; the deadline is a guard against the impossible.
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write(refusal)
		_ = c.Close()
	}
}

// oldestWaitingLocked is the connection that has waited longest with no
// request in progress, of src when bySrc.
func (l *Listener) oldestWaitingLocked(src netip.Prefix, bySrc bool) *conn {
	for e := l.waiting.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*conn); !bySrc || c.src == src {
			return c
		}
	}
	return nil
}

// dropLocked gives c's place back (once).
func (l *Listener) dropLocked(c *conn) {
	if c.released {
		return
	}
	c.released = true
	l.open--
	l.cond.Broadcast()
	if l.bySource[c.src]--; l.bySource[c.src] <= 0 {
		delete(l.bySource, c.src)
	}
	if c.elem != nil {
		l.waiting.Remove(c.elem)
		c.elem = nil
	}
}

// ConnState is the http.Server's ConnState hook: it tells the listener
// which connections have a request in progress. The server reports a
// connection Active once a request's headers are read, so one still
// sending its headers counts as waiting too (and its place can be taken).
func (l *Listener) ConnState(nc net.Conn, s http.ConnState) {
	c, ok := nc.(*conn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.released {
		return
	}
	if c.elem != nil {
		l.waiting.Remove(c.elem)
		c.elem = nil
	}
	switch {
	case s == http.StateIdle, s == http.StateNew && !l.wait:
		c.elem = l.waiting.PushBack(c)
		l.cond.Broadcast()
	}
}

// conn gives its place back once, on the first Close.
type conn struct {
	net.Conn
	l        *Listener
	src      netip.Prefix
	elem     *list.Element // in l.waiting while no request is in progress
	released bool          // guarded by l.mu
}

// NetConn is the accepted connection itself (for its socket options: the
// control socket reads its peer's credentials from it).
func (c *conn) NetConn() net.Conn { return c.Conn }

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.dropLocked(c)
	c.l.mu.Unlock()
	return err
}
