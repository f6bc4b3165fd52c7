// Package ownconns owns the record of the guard's own connections to vLLM
// (the readiness and liveness prober, the metrics scraper): their local
// addresses, so that vLLM's access-log lines for the guard's own requests
// can be told from a client's by the client port uvicorn prints.
package ownconns

import (
	"context"
	"net"
	"sync"
	"time"
)

// Linger is how long a closed connection's port is still recognised: vLLM
// logs an access line when its answer starts, and the guard may have read
// the answer and closed the connection before the log pump reads the line.
const Linger = 5 * time.Second

type key struct {
	ip   string
	port int
}

// Set remembers the local address of every open connection it dialled,
// and of closed ones for Linger. Safe from any goroutine.
type Set struct {
	mu     sync.Mutex
	open   map[key]int
	closed map[key]time.Time
	now    func() time.Time
}

// New returns an empty Set.
func New() *Set {
	return &Set{open: map[key]int{}, closed: map[key]time.Time{}, now: time.Now}
}

// Dial wraps d's DialContext so that every connection it makes is recorded
// while open (and for Linger after).
func (s *Set) Dial(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		ta, ok := c.LocalAddr().(*net.TCPAddr)
		if !ok {
			return c, nil
		}
		k := key{ta.IP.String(), ta.Port}
		s.mu.Lock()
		s.open[k]++
		delete(s.closed, k)
		s.mu.Unlock()
		return &conn{Conn: c, set: s, k: k}, nil
	}
}

func (s *Set) release(k key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[k]--; s.open[k] <= 0 {
		delete(s.open, k)
		s.closed[k] = s.now()
	}
}

// Has says whether host:port (as vLLM's access log prints the client) is
// one of the guard's own connections, open or closed within Linger. An
// empty or unparsable host matches on the port alone.
func (s *Set) Has(host string, port int) bool {
	if s == nil {
		return false
	}
	ip := host
	if p := net.ParseIP(host); p != nil {
		ip = p.String()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for k, at := range s.closed {
		if now.Sub(at) > Linger {
			delete(s.closed, k)
		}
	}
	match := func(k key) bool { return k.port == port && (ip == "" || net.ParseIP(ip) == nil || k.ip == ip) }
	for k := range s.open {
		if match(k) {
			return true
		}
	}
	for k := range s.closed {
		if match(k) {
			return true
		}
	}
	return false
}

// conn forgets its port (after Linger) when closed.
type conn struct {
	net.Conn
	set  *Set
	k    key
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.set.release(c.k) })
	return err
}
