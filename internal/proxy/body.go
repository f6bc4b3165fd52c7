package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// An inference request's body is read whole (up to [proxy] max_body_bytes)
// before the request takes a slot, so a slow uploader holds no slot (issue
// 24: one held a slot for a minute), and its prompt tokens are counted as
// it arrives (estimate.go). That one copy, in pieces allocated as the bytes
// come, is what is sent to vLLM and sent again after a planned restart.
// All bodies held at once stay within [proxy] max_buffered_bytes (issue 24:
// 1,000 concurrent 1 MiB requests took the guard to 2.9 GiB, each body
// held twice and nothing bounding the sum).

const (
	// A body is held in pieces that double from bodyChunkMin up to
	// bodyChunkMax as it arrives, the last cut to a known length.
	bodyChunkMax = 1 << 20
	bodyChunkMin = 16 << 10
	// A client that asked to wait (Expect: 100-continue) is told to send
	// its body once it holds a slot; it must then send it at least this
	// fast, after expectGrace, or lose the request.
	expectGrace   = 5 * time.Second
	expectMinRate = 1 << 20 // bytes a second
)

// bodyBudget is the process-wide bound on buffered body bytes, and each
// client address's share of it ([proxy] max_buffered_bytes_per_client):
// one address cannot hold the whole budget with bandwidth alone (issue 32:
// 16 MiB then a stall held it 60 s; 32 such filled 512 MiB).
type bodyBudget struct {
	mu        sync.Mutex
	used, max int64
	perClient int64                  // <= 0: no share
	byClient  map[netip.Prefix]int64 // held now, by client address
}

// newBodyBudget bounds bodies at max bytes in all, perClient bytes from
// one client address (<= 0 or above max: max).
func newBodyBudget(max, perClient int64) *bodyBudget {
	if perClient <= 0 || perClient > max {
		perClient = max
	}
	return &bodyBudget{max: max, perClient: perClient, byClient: map[netip.Prefix]int64{}}
}

// take reserves n bytes for a body of client: errBudget when the bodies
// held leave no room, errClientBudget when client's own do.
func (b *bodyBudget) take(client netip.Prefix, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return errBudget
	}
	if b.byClient[client]+n > b.perClient {
		return errClientBudget
	}
	b.used += n
	b.byClient[client] += n
	return nil
}

func (b *bodyBudget) give(client netip.Prefix, n int64) {
	b.mu.Lock()
	b.used -= n
	if b.byClient[client] -= n; b.byClient[client] <= 0 {
		delete(b.byClient, client)
	}
	b.mu.Unlock()
}

// clientOf is the client address a request's body counts against: its
// peer's IP, an IPv6 /64 as one (a host's privacy addresses share it).
func clientOf(remoteAddr string) netip.Prefix {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Prefix{}
	}
	ip := ap.Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// bodyClient is whose share of the budget r's body counts against: the
// client a trusted peer forwards (forwardedClient, as for the share of
// requests in progress), else the peer's address.
func (p *Proxy) bodyClient(r *http.Request) netip.Prefix {
	if p.trustedPeer(r.RemoteAddr) {
		return p.forwardedClient(r)
	}
	return clientOf(r.RemoteAddr)
}

func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// bufferedBody is a request body held in memory, in pieces.
type bufferedBody struct {
	chunks [][]byte
	size   int64
	budget *bodyBudget
	client netip.Prefix // whose share holds it
	held   atomic.Int64 // budget bytes to give back
}

// release gives the body's budget back (once). Its bytes stay readable
// for whoever still holds a reader (the transport may read a body after
// RoundTrip returns); the garbage collector frees them.
func (b *bufferedBody) release() {
	if b == nil {
		return
	}
	if n := b.held.Swap(0); n > 0 {
		b.budget.give(b.client, n)
	}
}

// reader reads the body from its start.
func (b *bufferedBody) reader() *chunkReader { return &chunkReader{chunks: b.chunks} }

type chunkReader struct {
	chunks [][]byte
	i, off int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for c.i < len(c.chunks) {
		if ch := c.chunks[c.i]; c.off < len(ch) {
			n := copy(p, ch[c.off:])
			c.off += n
			return n, nil
		}
		c.i, c.off = c.i+1, 0
	}
	return 0, io.EOF
}

// errBudget: the bodies held leave no room for this one.
var errBudget = errors.New("buffered request bodies at [proxy] max_buffered_bytes")

// errClientBudget: the bodies of this request's client address leave no
// room in its share.
var errClientBudget = errors.New("buffered request bodies of one client at [proxy] max_buffered_bytes_per_client")

// readBody reads r's body whole into memory within the budget and
// max_body_bytes, by deadline, feeding sc (nil: no estimate) as it goes.
// ok is false when it answered the request itself (too large, too slow,
// no room) or the client left; the caller releases body once done with it.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request, sc *promptScanner, deadline func(read int64) time.Time) (body *bufferedBody, ok bool) {
	body = &bufferedBody{budget: p.budget, client: p.bodyClient(r)}
	if r.Body == nil || r.Body == http.NoBody {
		return body, true
	}
	var src io.Reader = r.Body
	if p.cfg.MaxBodyBytes > 0 {
		src = http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes)
	}
	rc := http.NewResponseController(w)
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	known := r.ContentLength >= 0
	var cur []byte
	var err error
	for {
		if known && body.size == r.ContentLength {
			break // all of it: no read to see the end
		}
		if r.Context().Err() != nil {
			err = r.Context().Err()
			break
		}
		if len(cur) == cap(cur) {
			// Pieces grow with what came (a slow uploader holds about
			// what it sent, not what it announced), the last one cut to
			// the announced length.
			n := min(max(body.size, bodyChunkMin), bodyChunkMax)
			if known {
				n = min(n, r.ContentLength-body.size)
			}
			if err = p.budget.take(body.client, n); err != nil {
				break
			}
			body.held.Add(n)
			cur = make([]byte, 0, n)
			body.chunks = append(body.chunks, cur)
		}
		_ = rc.SetReadDeadline(deadline(body.size))
		var n int
		n, err = src.Read(cur[len(cur):cap(cur)])
		if n > 0 {
			if sc != nil {
				sc.feed(cur[len(cur) : len(cur)+n])
			}
			cur = cur[:len(cur)+n]
			body.chunks[len(body.chunks)-1] = cur
			body.size += int64(n)
		}
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return body, true
	case errors.As(err, &mbe):
		p.tooLarge(w, mbe.Limit+1)
	case errors.Is(err, errBudget):
		p.bufferFull(w)
	case errors.Is(err, errClientBudget):
		p.clientBufferFull(w)
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestTimeout, "invalid_request_error",
			fmt.Sprintf("request body not received in time (%s, or at least %d KiB/s after a 100 Continue); send it at once", bodyReadTimeout, expectMinRate>>10))
	default:
		// A malformed chunk or trailer: 400 (it was answered with
		// nothing, a bare 200); nothing when the client left.
		badBody(w, r, err)
	}
	body.release()
	return nil, false // else the client went away
}

// bufferFull answers a request whose body finds no room in the budget.
func (p *Proxy) bufferFull(w http.ResponseWriter) {
	p.lim.reject(reasonBufferFull)
	p.m.rejected.WithLabelValues(reasonBufferFull).Inc()
	w.Header().Set("Connection", "close")
	if p.lim.isReady() {
		w.Header().Set("Retry-After", retryAfterBusy)
	} else {
		// The bodies are those held while vLLM restarts: retry when it is back.
		w.Header().Set("Retry-After", p.retryAfterDown())
	}
	writeError(w, http.StatusServiceUnavailable, "server_error",
		fmt.Sprintf("vllm-guard holds %d bytes of request bodies already, its limit ([proxy] max_buffered_bytes); retry shortly", p.cfg.MaxBufferedBytes))
}

// clientBufferFull answers a request whose body finds no room in its
// client address's share of the budget: that client is sending more at
// once than its share, so it is the one told to slow down (429).
func (p *Proxy) clientBufferFull(w http.ResponseWriter) {
	p.lim.reject(reasonBufferFull)
	p.m.rejected.WithLabelValues(reasonBufferFull).Inc()
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", retryAfterBusy)
	writeError(w, http.StatusTooManyRequests, "rate_limit_error",
		fmt.Sprintf("vllm-guard holds %d bytes of request bodies from this client address already, its share ([proxy] max_buffered_bytes_per_client); send fewer large requests at once, or retry shortly",
			p.budget.perClient))
}

// expectsContinue: the client waits for 100 Continue before it sends its
// body, and said how long it is. It is told to send once admitted.
func expectsContinue(r *http.Request) bool {
	return r.ContentLength > 0 && strings.EqualFold(r.Header.Get("Expect"), "100-continue")
}

// minRateDeadline: after start, expectGrace and then expectMinRate: the
// deadline for the next read when read bytes have arrived, allowing for the
// next piece (up to bodyChunkMax).
func minRateDeadline(start time.Time) func(int64) time.Time {
	return func(read int64) time.Time {
		return start.Add(expectGrace + time.Duration(float64(read+bodyChunkMax)/expectMinRate*float64(time.Second)))
	}
}

// trackBody is the client's request body as sent upstream: it notes
// whether anything was read (a refused connection may be retried only if
// not), and ignores the transport's Close, so that a retry can send it.
type trackBody struct {
	b    *bufferedBody
	r    *chunkReader
	read atomic.Bool
}

func newTrackBody(b *bufferedBody) *trackBody { return &trackBody{b: b, r: b.reader()} }

func (t *trackBody) Read(p []byte) (int, error) {
	t.read.Store(true)
	return t.r.Read(p)
}

// replay is the whole body again, from the one copy held.
func (t *trackBody) replay() (io.ReadCloser, bool) {
	return io.NopCloser(t.b.reader()), true
}

func (t *trackBody) Close() error  { return nil }
func (t *trackBody) touched() bool { return t.read.Load() }
