package group

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Options are one guard's side of the transport.
type Options struct {
	Rank, Size int
	// Address: the leader listens on it (":9462"); a follower dials it
	// (the leader's host:port).
	Address string
	// Secret is the group's shared secret (MinSecret bytes or more).
	Secret []byte
	// Incarnation tells this guard's start from its others (random).
	Incarnation uint64
	// Interval is the heartbeat; LossTimeout bounds a handshake and the
	// silence of a connection (then it is closed).
	Interval, LossTimeout time.Duration
	// MaxPending caps the connections not yet authenticated (0: Size+2);
	// MaxRate the frames one connection may send in a second (0: 50).
	MaxPending, MaxRate int
	// Refused is told of each connection refused or dropped, and why (the
	// log); nil: nothing.
	Refused func(peer string, err error)
	// Say is what this guard says until the first Node.Say (zero: what a
	// new machine of its rank says).
	Say Report
}

// Heard is an authenticated report of another guard.
type Heard struct {
	From        int
	Incarnation uint64
	Report      Report
}

// Node is one guard's end of the group's connections: the leader's
// listener and a connection per follower, or a follower's connection to
// the leader (dialled again when it drops).
type Node struct {
	opts  Options
	heard chan Heard
	done  chan struct{}
	stop  context.CancelFunc
	ln    net.Listener
	wg    sync.WaitGroup
	// writers: each connection's writer, waited for by Close before the
	// connections close, so that each sends its last words.
	writers sync.WaitGroup

	pending chan struct{} // a slot per connection not yet authenticated

	mu    sync.Mutex
	say   Report
	live  map[*conn]bool
	ranks map[int]*conn // the leader's: the authenticated connection of each rank
}

// Start opens the transport: the leader listens at once (an error when
// it cannot), a follower dials in the background.
func Start(opts Options) (*Node, error) {
	if len(opts.Secret) < MinSecret {
		return nil, fmt.Errorf("group: the shared secret has %d bytes; write at least %d (random) in the secret file", len(opts.Secret), MinSecret)
	}
	if opts.Interval <= 0 || opts.LossTimeout <= 0 || opts.Size < 2 || opts.Rank < 0 || opts.Rank >= opts.Size {
		return nil, fmt.Errorf("group: rank %d of %d, heartbeat %s, loss timeout %s: the rank must be below the size (2 or more), the times above 0", opts.Rank, opts.Size, opts.Interval, opts.LossTimeout)
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = opts.Size + 2
	}
	if opts.MaxRate <= 0 {
		opts.MaxRate = 50
	}
	if opts.Say.Kind == 0 {
		opts.Say = New(Config{Rank: opts.Rank, Size: opts.Size}).Say()
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{opts: opts, heard: make(chan Heard, 16), done: make(chan struct{}), stop: cancel, say: opts.Say,
		pending: make(chan struct{}, opts.MaxPending), live: map[*conn]bool{}, ranks: map[int]*conn{}}
	if opts.Rank == 0 {
		ln, err := net.Listen("tcp", opts.Address)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("group: the leader's guard cannot listen on %s: %w; free the port or set [group] port", opts.Address, err)
		}
		n.ln = ln
		n.wg.Add(1)
		go n.accept()
		return n, nil
	}
	n.wg.Add(1)
	go n.dial(ctx)
	return n, nil
}

// Addr is where the leader listens.
func (n *Node) Addr() net.Addr { return n.ln.Addr() }

// Heard delivers the other guards' authenticated reports, in order.
func (n *Node) Heard() <-chan Heard { return n.heard }

// Say sets what this guard says: sent at once to every peer, and again at
// every heartbeat.
func (n *Node) Say(r Report) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.say = r
	for c := range n.live {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// Close ends every connection and waits for its goroutines; again, it
// does nothing.
func (n *Node) Close() error {
	n.mu.Lock()
	select {
	case <-n.done:
		n.mu.Unlock()
		return nil
	default:
	}
	close(n.done)
	n.mu.Unlock()
	n.stop()
	if n.ln != nil {
		n.ln.Close()
	}
	n.writers.Wait()
	n.mu.Lock()
	for c := range n.live {
		c.close()
	}
	n.mu.Unlock()
	n.wg.Wait()
	return nil
}

func (n *Node) refused(peer string, err error) {
	if n.opts.Refused != nil {
		n.opts.Refused(peer, err)
	}
}

// wait is a pause that Close ends.
func (n *Node) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.done:
		return false
	}
}

func (n *Node) accept() {
	defer n.wg.Done()
	for {
		nc, err := n.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || !n.wait(n.opts.Interval/10) {
				return
			}
			continue
		}
		select {
		case n.pending <- struct{}{}:
		default:
			n.refused(nc.RemoteAddr().String(), fmt.Errorf("%d connections not yet authenticated: closed at accept", n.opts.MaxPending))
			nc.Close()
			continue
		}
		c := n.track(nc)
		if c == nil {
			<-n.pending
			return
		}
		n.wg.Add(1)
		go n.serve(c)
	}
}

// serve is the leader's side of one connection: the handshake under one
// deadline, the first signed report naming the follower, then its life.
func (n *Node) serve(c *conn) {
	defer n.wg.Done()
	defer n.untrack(c)
	authenticated := false
	defer func() {
		if !authenticated {
			<-n.pending
		}
	}()
	c.SetDeadline(time.Now().Add(n.opts.LossTimeout))
	mine := nonce()
	theirs, err := c.hello(mine)
	if err != nil {
		n.refused(c.peer(), err)
		return
	}
	c.key = sessionKey(n.opts.Secret, mine, theirs)
	first, err := c.read(n)
	if err != nil {
		n.refused(c.peer(), err)
		return
	}
	if first.From < 1 || first.From >= n.opts.Size {
		n.refused(c.peer(), fmt.Errorf("%w: rank %d is no follower of a group of %d", ErrFrame, first.From, n.opts.Size))
		return
	}
	authenticated = true
	<-n.pending
	c.rank, c.inc = first.From, first.Incarnation
	n.mu.Lock()
	if old := n.ranks[c.rank]; old != nil {
		old.close() // the member connected again: the newest wins
	}
	n.ranks[c.rank] = c
	n.mu.Unlock()
	n.live1(c, first)
	n.mu.Lock()
	if n.ranks[c.rank] == c {
		delete(n.ranks, c.rank)
	}
	n.mu.Unlock()
}

// dial is a follower's loop: connect to the leader, live, connect again.
func (n *Node) dial(ctx context.Context) {
	defer n.wg.Done()
	d := net.Dialer{Timeout: n.opts.LossTimeout}
	for {
		nc, err := d.DialContext(ctx, "tcp", n.opts.Address)
		if err == nil {
			if c := n.track(nc); c != nil {
				n.follow(c)
				n.untrack(c)
			}
		}
		if !n.wait(n.opts.Interval) {
			return
		}
	}
}

func (n *Node) follow(c *conn) {
	c.SetDeadline(time.Now().Add(n.opts.LossTimeout))
	mine := nonce()
	theirs, err := c.hello(mine)
	if err != nil {
		n.refused(c.peer(), err)
		return
	}
	c.key = sessionKey(n.opts.Secret, theirs, mine)
	c.rank = 0
	n.live1(c, Frame{})
}

// live1 runs an authenticated connection: a writer of this guard's
// reports, and this reader, until either fails or Close.
func (n *Node) live1(c *conn, first Frame) {
	n.wg.Add(1)
	n.writers.Add(1)
	go n.write(c)
	defer c.close()
	if first.Counter != 0 && !n.deliver(c, first) {
		return
	}
	for {
		c.SetReadDeadline(time.Now().Add(n.opts.LossTimeout))
		f, err := c.read(n)
		if err == nil && (f.From != c.rank || (c.inc != 0 && f.Incarnation != c.inc)) {
			err = fmt.Errorf("%w: rank %d incarnation %d on the connection of rank %d", ErrFrame, f.From, f.Incarnation, c.rank)
		}
		if err != nil {
			select {
			case <-n.done:
			default:
				n.refused(c.peer(), err)
			}
			return
		}
		c.inc = f.Incarnation
		if !n.deliver(c, f) {
			return
		}
	}
}

func (n *Node) deliver(c *conn, f Frame) bool {
	select {
	case n.heard <- Heard{From: f.From, Incarnation: f.Incarnation, Report: f.Report}:
		return true
	case <-n.done:
		return false
	case <-c.closed:
		return false
	}
}

func (n *Node) write(c *conn) {
	defer n.wg.Done()
	defer c.close()
	defer n.writers.Done()
	t := time.NewTicker(n.opts.Interval)
	defer t.Stop()
	for {
		if !n.send(c, n.opts.LossTimeout) {
			return
		}
		select {
		case <-t.C:
		case <-c.kick:
		case <-c.closed:
			return
		case <-n.done:
			// Its last words: what this guard says as it closes (a leader
			// whose guard gave up says so), once, briefly.
			n.send(c, lastWords)
			return
		}
	}
}

// lastWords bounds the last report's write as a guard closes.
const lastWords = 500 * time.Millisecond

// send writes what this guard says now to c, within d.
func (n *Node) send(c *conn, d time.Duration) bool {
	n.mu.Lock()
	say := n.say
	n.mu.Unlock()
	c.sent++
	b := encodeReport(c.key, Frame{From: n.opts.Rank, Incarnation: n.opts.Incarnation, Counter: c.sent, Report: say})
	c.SetWriteDeadline(time.Now().Add(d))
	_, err := c.Write(b)
	return err == nil
}

// track registers a connection so that Say and Close reach it; nil once
// closed.
func (n *Node) track(nc net.Conn) *conn {
	c := &conn{Conn: nc, kick: make(chan struct{}, 1), closed: make(chan struct{}), rank: -1}
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.done:
		nc.Close()
		return nil
	default:
	}
	n.live[c] = true
	return c
}

func (n *Node) untrack(c *conn) {
	c.close()
	n.mu.Lock()
	delete(n.live, c)
	n.mu.Unlock()
}

// conn is one authenticated (or authenticating) connection.
type conn struct {
	net.Conn
	key    []byte
	kick   chan struct{}
	closed chan struct{}
	once   sync.Once
	rank   int    // the peer's: -1 until its first report
	inc    uint64 // the peer's incarnation
	sent   uint64 // the writer's counter
	last   uint64 // the reader's: the peer's last counter
	// the reader's rate window
	window time.Time
	frames int
}

func (c *conn) close() {
	c.once.Do(func() {
		close(c.closed)
		c.Conn.Close()
	})
}

func (c *conn) peer() string { return c.RemoteAddr().String() }

// hello sends this side's nonce and reads the peer's.
func (c *conn) hello(mine []byte) ([]byte, error) {
	if _, err := c.Write(encodeHello(mine)); err != nil {
		return nil, err
	}
	b := make([]byte, FrameSize)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, fmt.Errorf("no hello: %w", err)
	}
	return decodeHello(b)
}

// read reads one signed report: its form, signature, counter and rate.
func (c *conn) read(n *Node) (Frame, error) {
	b := make([]byte, FrameSize)
	if _, err := io.ReadFull(c, b); err != nil {
		return Frame{}, fmt.Errorf("no report within the loss timeout, or the connection closed: %w", err)
	}
	f, err := decodeReport(c.key, b)
	if err != nil {
		return Frame{}, err
	}
	if f.Counter <= c.last {
		return Frame{}, fmt.Errorf("%w (%d after %d)", ErrReplay, f.Counter, c.last)
	}
	c.last = f.Counter
	now := time.Now()
	if now.Sub(c.window) >= time.Second {
		c.window, c.frames = now, 0
	}
	c.frames++
	if c.frames > n.opts.MaxRate {
		return Frame{}, fmt.Errorf("more than %d frames in a second: a flood", n.opts.MaxRate)
	}
	return f, nil
}

func nonce() []byte {
	b := make([]byte, FrameSize-macAt)
	rand.Read(b)
	return b
}
