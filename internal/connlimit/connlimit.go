// Package connlimit caps the open connections of the guard's listeners
// (the proxy, [control] http_listen and the control socket) so that clients cannot take the
// file descriptors that supervising vLLM needs: pipes for its output, the
// keeper, the control socket, state files. A connection over the cap is
// answered with a short 503 and closed as soon as it is accepted: it never
// holds a descriptor for longer than one non-blocking write.
package connlimit

import (
	"container/list"
	"context"
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

// refusal is written to a connection over the cap; refusalPerSource to
// one over its address's share.
var (
	refusal          = answer503("vllm-guard: too many open connections; retry shortly\n")
	refusalPerSource = answer503("vllm-guard: too many connections from your address with a request in progress; retry shortly\n")
)

func answer503(body string) []byte {
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n" +
		"Retry-After: 1\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

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
// control port answer 503 for a minute). A handler may say that its
// request is still receiving its body (Reading): until the body is read
// (Working) the connection gives its place like one sending its headers,
// so slow bodies cannot shut anyone out either (issue 41). Set ConnState
// as the http.Server's ConnState hook and ConnContext as its ConnContext.
//
// A listener with a reserve (SetReserve) does not refuse a newcomer that
// finds every place working: it accepts it into the reserve, a few places
// of their own that the handler keeps for requests answered at once
// (Reserved tells it which connections those are: the control port serves
// only /livez and /readyz on them), so that whatever other clients hold,
// a probe is answered.
type Listener struct {
	net.Listener
	max, perSource int
	refused        atomic.Uint64
	evicted        atomic.Uint64

	mu          sync.Mutex
	open        int
	bySource    map[netip.Prefix]int
	waiting     list.List // of *conn not working on a request, oldest first
	reserve     int       // places of the reserve (SetReserve)
	reserveOpen int       // connections open in it
	exempt      []netip.Prefix

	// wait: past the cap Accept waits for a place instead of refusing,
	// and only idle connections give theirs (NewWaiting).
	wait   bool
	cond   sync.Cond // with mu: a place freed, a connection went idle, or Close
	closed bool
}

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

// SetReserve gives the listener n places beyond its cap for connections
// that find every place working, whatever their address (see Listener).
// Call it before Accept; a waiting listener (NewWaiting) has none.
func (l *Listener) SetReserve(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.wait {
		l.reserve = max(n, 0)
	}
}

// Exempt lifts the per-source cap from the peers in ps (load balancers in
// [proxy] trusted_proxies: the clients behind them are counted by the
// handler, by the address the balancer forwards). Call it before Accept.
func (l *Listener) Exempt(ps []netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exempt = append([]netip.Prefix(nil), ps...)
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

// source is the client's address as the per-source cap counts it, and the
// address itself.
func source(a net.Addr) (netip.Prefix, netip.Addr) {
	if a == nil {
		return netip.Prefix{}, netip.Addr{} // a unix socket's peer: one source
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}, netip.Addr{}
	}
	ip := ap.Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64 // one host's privacy addresses share its /64
	}
	p, _ := ip.Prefix(bits)
	return p, ip
}

func (l *Listener) exemptLocked(a netip.Addr) bool {
	for _, p := range l.exempt {
		if a.IsValid() && p.Contains(a) {
			return true
		}
	}
	return false
}

// Accept returns the next connection within the caps, closing the oldest
// idle connection (of the same source, when that cap is the one reached)
// to make room; a connection that finds none to replace goes to the
// reserve, if any has room (or an idle place to take), else is answered
// 503 and closed here, and Accept goes on waiting.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src, addr := source(c.RemoteAddr())
		nc := &conn{Conn: c, l: l, src: src}
		var victims []*conn
		ok, perSource := true, false
		l.mu.Lock()
		// A waiting listener holds the newcomer (one descriptor over the
		// cap at most) until a place frees or an idle connection can give
		// its own; those behind it wait in the kernel's backlog.
		for l.wait && !l.closed && l.open >= l.max && l.oldestWaitingLocked(netip.Prefix{}, false, false) == nil {
			l.cond.Wait()
		}
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return nil, net.ErrClosed
		}
		if l.bySource[nc.src] >= l.perSource && !l.exemptLocked(addr) {
			if v := l.oldestWaitingLocked(nc.src, true, false); v != nil {
				l.dropLocked(v)
				victims = append(victims, v)
			} else {
				ok, perSource = false, l.perSource < l.max
			}
		}
		if ok && l.open >= l.max {
			if v := l.oldestWaitingLocked(netip.Prefix{}, false, false); v != nil {
				l.dropLocked(v)
				victims = append(victims, v)
			} else {
				ok = false
			}
		}
		switch {
		case ok:
			l.open++
			l.bySource[nc.src]++
			// Waiting (replaceable) once the server says so: with no
			// ConnState hook every connection holds its place.
		case l.reserve > 0:
			if l.reserveOpen >= l.reserve {
				if v := l.oldestWaitingLocked(netip.Prefix{}, false, true); v != nil {
					l.dropLocked(v)
					victims = append(victims, v)
				}
			}
			if l.reserveOpen < l.reserve {
				ok, nc.reserved = true, true
				l.reserveOpen++
			}
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
		if perSource {
			_, _ = c.Write(refusalPerSource)
		} else {
			_, _ = c.Write(refusal)
		}
		_ = c.Close()
	}
}

// oldestWaitingLocked is the connection that has waited longest with no
// request in progress, of src when bySrc, in the reserve or not.
func (l *Listener) oldestWaitingLocked(src netip.Prefix, bySrc, reserved bool) *conn {
	for e := l.waiting.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*conn); c.reserved == reserved && (!bySrc || c.src == src) {
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
	l.cond.Broadcast()
	if c.reserved {
		l.reserveOpen--
	} else {
		l.open--
		if l.bySource[c.src]--; l.bySource[c.src] <= 0 {
			delete(l.bySource, c.src)
		}
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
	c.reading = false
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

type connKey struct{}

// ConnContext is the http.Server's ConnContext hook: it lets a handler
// tell the listener about its request's connection (Reading, Working) and
// ask whether it is in the reserve (Reserved).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if nc, ok := c.(*conn); ok {
		return context.WithValue(ctx, connKey{}, nc)
	}
	return ctx
}

func connOf(ctx context.Context) *conn {
	c, _ := ctx.Value(connKey{}).(*conn)
	return c
}

// Reserved reports whether the request's connection (ctx: the request's
// context) was accepted into the reserve: every other place was working.
func Reserved(ctx context.Context) bool {
	c := connOf(ctx)
	return c != nil && c.reserved
}

// Reading says that the request's connection is receiving the request's
// body, not yet working on it: a newcomer that finds the cap reached may
// take its place, as it may an idle one's, until Working. A slow uploader
// then cannot hold a place that others need (issue 41: 1,024 bodies
// trickling a byte each 5 s shut every other client out of the proxy).
func Reading(ctx context.Context) {
	c := connOf(ctx)
	if c == nil {
		return
	}
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.released || c.elem != nil {
		return
	}
	c.reading = true
	c.elem = l.waiting.PushBack(c)
	l.cond.Broadcast()
}

// Working says that the request's body is read: its connection holds its
// place again. After the request has ended it does nothing.
func Working(ctx context.Context) {
	c := connOf(ctx)
	if c == nil {
		return
	}
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.released || !c.reading {
		return
	}
	c.reading = false
	if c.elem != nil {
		l.waiting.Remove(c.elem)
		c.elem = nil
	}
}

// conn gives its place back once, on the first Close.
type conn struct {
	net.Conn
	l        *Listener
	src      netip.Prefix
	reserved bool          // in the reserve, not under the cap
	elem     *list.Element // in l.waiting while no request is in progress
	released bool          // guarded by l.mu
	reading  bool          // guarded by l.mu: in l.waiting by Reading
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
