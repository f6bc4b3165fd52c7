package group

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

var secret = []byte("0123456789abcdef-the-group-secret")

// bound is how long a test waits for what must happen (never a pause).
const bound = 10 * time.Second

// refusals collects a node's refusals, in order.
type refusals struct {
	mu   sync.Mutex
	errs []error
	ch   chan struct{}
}

func newRefusals() *refusals { return &refusals{ch: make(chan struct{}, 1000)} }

func (r *refusals) add(_ string, err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
	r.ch <- struct{}{}
}

// waitFor waits for a refusal that matches.
func (r *refusals) waitFor(t *testing.T, what string, match func(error) bool) {
	t.Helper()
	deadline := time.After(bound)
	for {
		r.mu.Lock()
		for _, e := range r.errs {
			if match(e) {
				r.mu.Unlock()
				return
			}
		}
		r.mu.Unlock()
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("no refusal %s; refusals: %v", what, r.errs)
		}
	}
}

func leader(t *testing.T, size int, tune func(*Options)) (*Node, *refusals) {
	t.Helper()
	ref := newRefusals()
	o := Options{Rank: 0, Size: size, Address: "127.0.0.1:0", Secret: secret, Incarnation: 100,
		Interval: 50 * time.Millisecond, LossTimeout: 5 * time.Second, Refused: ref.add}
	if tune != nil {
		tune(&o)
	}
	n, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, ref
}

func follower(t *testing.T, rank int, addr string, key []byte) (*Node, *refusals) {
	t.Helper()
	ref := newRefusals()
	n, err := Start(Options{Rank: rank, Size: 3, Address: addr, Secret: key, Incarnation: uint64(200 + rank),
		Interval: 50 * time.Millisecond, LossTimeout: 5 * time.Second, Refused: ref.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, ref
}

// hear waits for a report from `from` that matches want.
func hear(t *testing.T, n *Node, from int, want Report) Heard {
	t.Helper()
	deadline := time.After(bound)
	for {
		select {
		case h := <-n.Heard():
			if h.From == from && h.Report == want {
				return h
			}
		case <-deadline:
			t.Fatalf("never heard %v from %d", want, from)
		}
	}
}

// Two guards on 127.0.0.1 over real sockets: each hears what the other
// says, at once after Say and then at each heartbeat.
func TestTwoGuardsHearEachOther(t *testing.T) {
	l, _ := leader(t, 3, nil)
	f, _ := follower(t, 1, l.Addr().String(), secret)
	h := hear(t, l, 1, Report{Kind: Idle})
	if h.Incarnation != 201 {
		t.Errorf("incarnation %d, want 201", h.Incarnation)
	}
	hear(t, f, 0, Report{Kind: End})
	l.Say(Report{Kind: Open, Epoch: 1, Rung: 2})
	hear(t, f, 0, Report{Kind: Open, Epoch: 1, Rung: 2})
	f.Say(Report{Kind: Running, Epoch: 1})
	hear(t, l, 1, Report{Kind: Running, Epoch: 1})
	f.Say(Report{Kind: Ended, Epoch: 1})
	hear(t, l, 1, Report{Kind: Ended, Epoch: 1})
}

// A follower that starts again (a new incarnation) replaces its old
// connection: the leader hears the new one.
func TestAFollowerStartedAgainIsHeard(t *testing.T) {
	l, _ := leader(t, 3, nil)
	f, _ := follower(t, 2, l.Addr().String(), secret)
	hear(t, l, 2, Report{Kind: Idle})
	f.Close()
	g, err := Start(Options{Rank: 2, Size: 3, Address: l.Addr().String(), Secret: secret, Incarnation: 999, Interval: 50 * time.Millisecond, LossTimeout: 5 * time.Second,
		Say: Report{Kind: Idle, Epoch: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if h := hear(t, l, 2, Report{Kind: Idle, Epoch: 4}); h.Incarnation != 999 {
		t.Errorf("incarnation %d, want 999", h.Incarnation)
	}
}

// An attacker's end of a connection: raw bytes, a handshake it may or may
// not sign right.
type raw struct {
	net.Conn
	key []byte
	n   uint64
}

func dialRaw(t *testing.T, addr string) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &raw{Conn: c}
}

// handshake reads the leader's hello, sends one, derives the key under s.
func (r *raw) handshake(t *testing.T, s []byte) {
	t.Helper()
	b := make([]byte, FrameSize)
	r.SetReadDeadline(time.Now().Add(bound))
	if _, err := io.ReadFull(r, b); err != nil {
		t.Fatal(err)
	}
	theirs, err := decodeHello(b)
	if err != nil {
		t.Fatal(err)
	}
	mine := nonce()
	if _, err := r.Write(encodeHello(mine)); err != nil {
		t.Fatal(err)
	}
	r.key = sessionKey(s, theirs, mine)
}

func (r *raw) report(from int, rep Report) []byte {
	r.n++
	return encodeReport(r.key, Frame{From: from, Incarnation: 7, Counter: r.n, Report: rep})
}

// closedByPeer: the leader closed the connection (reading ends in EOF or a
// reset, not in the bound's timeout).
func (r *raw) closedByPeer(t *testing.T) {
	t.Helper()
	r.SetReadDeadline(time.Now().Add(bound))
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the leader kept the connection open")
	}
}

func TestAttackers(t *testing.T) {
	t.Run("wrong secret", func(t *testing.T) {
		l, ref := leader(t, 3, nil)
		f, _ := follower(t, 1, l.Addr().String(), []byte("another-secret-of-sixteen-bytes"))
		ref.waitFor(t, "for the wrong secret", func(e error) bool { return errors.Is(e, ErrMAC) })
		f.Close()
		select {
		case h := <-l.Heard():
			t.Fatalf("heard %v signed with another secret", h)
		default:
		}
	})
	t.Run("a frame of another connection replayed", func(t *testing.T) {
		l, ref := leader(t, 3, nil)
		a := dialRaw(t, l.Addr().String())
		a.handshake(t, secret)
		captured := a.report(1, Report{Kind: Ended, Epoch: 1})
		b := dialRaw(t, l.Addr().String())
		b.handshake(t, secret)
		b.Write(captured)
		ref.waitFor(t, "for the replayed frame", func(e error) bool { return errors.Is(e, ErrMAC) })
		b.closedByPeer(t)
	})
	t.Run("a frame replayed on its connection", func(t *testing.T) {
		l, ref := leader(t, 3, nil)
		a := dialRaw(t, l.Addr().String())
		a.handshake(t, secret)
		f := a.report(1, Report{Kind: Running, Epoch: 1})
		a.Write(f)
		hear(t, l, 1, Report{Kind: Running, Epoch: 1})
		a.Write(f)
		ref.waitFor(t, "for the replay", func(e error) bool { return errors.Is(e, ErrReplay) })
		a.closedByPeer(t)
	})
	t.Run("a rank that is no follower", func(t *testing.T) {
		l, ref := leader(t, 3, nil)
		for _, from := range []int{0, 3} {
			a := dialRaw(t, l.Addr().String())
			a.handshake(t, secret)
			a.Write(a.report(from, Report{Kind: End, Epoch: 9}))
			a.closedByPeer(t)
		}
		ref.waitFor(t, "for rank 3", func(e error) bool { return strings.Contains(e.Error(), "rank 3 is no follower") })
	})
	t.Run("another rank on a member's connection", func(t *testing.T) {
		l, ref := leader(t, 3, nil)
		a := dialRaw(t, l.Addr().String())
		a.handshake(t, secret)
		a.Write(a.report(1, Report{Kind: Running, Epoch: 1}))
		a.Write(a.report(2, Report{Kind: Ended, Epoch: 1}))
		ref.waitFor(t, "for the second rank", func(e error) bool { return strings.Contains(e.Error(), "on the connection of rank 1") })
		a.closedByPeer(t)
	})
	t.Run("oversize: a megabyte of junk", func(t *testing.T) {
		l, ref := leader(t, 3, nil)
		a := dialRaw(t, l.Addr().String())
		go a.Write(bytes.Repeat([]byte("A"), 1<<20)) // ends when the leader closes
		ref.waitFor(t, "for the junk", func(e error) bool { return errors.Is(e, ErrFrame) })
		a.closedByPeer(t)
		f, _ := follower(t, 1, l.Addr().String(), secret)
		hear(t, l, 1, Report{Kind: Idle})
		f.Close()
	})
	t.Run("flood", func(t *testing.T) {
		l, ref := leader(t, 3, func(o *Options) { o.MaxRate = 20 })
		a := dialRaw(t, l.Addr().String())
		a.handshake(t, secret)
		go func() {
			for range 5000 {
				if _, err := a.Write(a.report(1, Report{Kind: Running, Epoch: 1})); err != nil {
					return
				}
			}
		}()
		stop := make(chan struct{})
		defer close(stop)
		go func() { // drain what the leader delivers
			for {
				select {
				case <-l.Heard():
				case <-stop:
					return
				}
			}
		}()
		ref.waitFor(t, "for the flood", func(e error) bool { return strings.Contains(e.Error(), "a flood") })
		a.closedByPeer(t)
	})
}

// Slowloris: connections that never finish their handshake hold a slot
// each only until the loss timeout; past the cap, newcomers are closed at
// accept; a real follower gets through once the slots free.
func TestSlowConnectionsAreBounded(t *testing.T) {
	l, ref := leader(t, 2, func(o *Options) { o.MaxPending = 2; o.LossTimeout = 2 * time.Second })
	var slow []*raw
	for range 2 {
		a := dialRaw(t, l.Addr().String())
		a.Write([]byte("VG")) // two bytes of a hello, then nothing
		slow = append(slow, a)
	}
	extra := dialRaw(t, l.Addr().String())
	extra.closedByPeer(t)
	ref.waitFor(t, "at accept", func(e error) bool { return strings.Contains(e.Error(), "closed at accept") })
	for _, a := range slow {
		a.closedByPeer(t)
	}
	ref.waitFor(t, "for the slow ones", func(e error) bool { return strings.Contains(e.Error(), "no hello") })
	f, _ := follower(t, 1, l.Addr().String(), secret)
	hear(t, l, 1, Report{Kind: Idle})
	f.Close()
}

func TestShortSecretRefused(t *testing.T) {
	if _, err := Start(Options{Rank: 0, Size: 2, Address: "127.0.0.1:0", Secret: []byte("short")}); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("a 5-byte secret: %v", err)
	}
}
