package proxy

// Issue 41: what clients hold at the proxy's door.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

const slowHeadAndByte = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"

// With every place taken, a request still receiving its body gives its
// place to a newcomer; one whose body is read (to its Content-Length) and
// that is in flight at vLLM keeps its own and is answered.
func TestSlowBodyGivesWayWorkingRequestDoesNot(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxConnections = 2
	g := newGate()
	s := serveProxy(t, cfg, 4, holdOnly(g))
	working := s.dial(t, 2)
	_ = working.SetDeadline(time.Now().Add(60 * time.Second)) // against a hang
	io.WriteString(working, strings.Replace(postHi, "/v1/completions", "/v1/hold", 1))
	testkit.WaitFor(t, "the request at vLLM", 30*time.Second, func() bool { return g.n() == 1 })
	slow := s.dial(t, 3)
	_ = slow.SetDeadline(time.Now().Add(60 * time.Second))
	io.WriteString(slow, slowHeadAndByte)
	testkit.WaitFor(t, "the slow body read", 30*time.Second, func() bool { return s.p.budget.inUse() > 0 })
	// The working request came first: were it still counted as receiving
	// its body, it would be the one to give way.
	c := s.dial(t, 4)
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if resp, body, err := roundTrip(c, bufio.NewReader(c), postHi); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a newcomer with a working request and a slow body in the two places: %v %q %v; want 200", resp, body, err)
	}
	if _, err := http.ReadResponse(bufio.NewReader(slow), nil); err == nil {
		t.Error("the slow body was answered; want its connection closed for the newcomer")
	}
	g.release <- struct{}{}
	if resp, err := http.ReadResponse(bufio.NewReader(working), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("the working request: %v %v; want its 200 (it kept its place)", resp, err)
	}
}

// A body that stalls is answered 408 once its grace has passed, and its
// connection let go at once; before, the server went on reading the rest
// with no deadline, and the connection stayed as long as the client kept
// it.
func TestStalledBodyLetsGoOfItsConnection(t *testing.T) {
	s := serveProxy(t, proxyConfig(), 4, func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	c := s.dial(t, 2)
	io.WriteString(c, slowHeadAndByte)
	_ = c.SetDeadline(time.Now().Add(2 * bodyReadTimeout)) // against a hang
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a stalled body: %v %v; want 408", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the 408: %v; want the connection closed by the proxy", err)
	}
}

// The body's deadline: the grace, then a rate, never past the bound.
func TestBodyDeadline(t *testing.T) {
	start := time.Unix(1000, 0)
	dl := bodyDeadline(start)
	for _, tc := range []struct {
		read int64
		want time.Duration
	}{
		{0, bodyGrace},
		{1, bodyGrace + time.Second/bodyMinRate},
		{bodyMinRate * 5, bodyGrace + 5*time.Second},
		{1 << 30, bodyReadTimeout},
	} {
		if got := dl(tc.read).Sub(start); got != tc.want {
			t.Errorf("deadline after %d bytes: %s; want %s", tc.read, got, tc.want)
		}
	}
}

// Behind a trusted balancer each forwarded client gets its own share: the
// rightmost address not itself trusted names the client.
func TestForwardedClientShare(t *testing.T) {
	cfg := proxyConfig()
	cfg.MaxConnections, cfg.MaxConnectionsPerClient = 16, 2
	cfg.TrustedProxies = []string{"127.0.0.9", "10.0.0.0/8"}
	g := newGate()
	s := serveProxy(t, cfg, 8, holdOnly(g))
	postTo := func(path, xff string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: %s\r\nContent-Length: 15\r\n\r\n{\"prompt\":\"hi\"}", path, xff)
	}
	post := func(xff string) string { return postTo("/v1/completions", xff) }
	for _, xff := range []string{"203.0.113.7", "198.51.100.1, 203.0.113.7, 10.1.2.3"} {
		c := s.dial(t, 9)
		_ = c.SetDeadline(time.Now().Add(60 * time.Second)) // against a hang
		io.WriteString(c, postTo("/v1/hold", xff))
	}
	testkit.WaitFor(t, "client A's two requests at vLLM", 30*time.Second, func() bool { return g.n() == 2 })
	c := s.dial(t, 9)
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if resp, body, err := roundTrip(c, bufio.NewReader(c), post("203.0.113.7")); err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("client A's third: %v %q %v; want 429", resp, body, err)
	}
	c = s.dial(t, 9)
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if resp, body, err := roundTrip(c, bufio.NewReader(c), post("203.0.113.8")); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("client B behind the same balancer: %v %q %v; want 200", resp, body, err)
	}
	for range 2 {
		g.release <- struct{}{}
	}
}

func TestForwardedClient(t *testing.T) {
	p := New(proxyConfig(), &fakeUp{}, nil, nil)
	p.trusted = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	for _, tc := range []struct {
		xff  []string
		want string
	}{
		{nil, "10.0.0.1/32"}, // the balancer's own request
		{[]string{"203.0.113.7"}, "203.0.113.7/32"},
		{[]string{"1.2.3.4, 203.0.113.7"}, "203.0.113.7/32"},
		{[]string{"1.2.3.4", "203.0.113.7, 10.9.9.9"}, "203.0.113.7/32"},
		{[]string{"2001:db9::1:2:3:4"}, "2001:db9::/64"},
		{[]string{"::ffff:203.0.113.7"}, "203.0.113.7/32"},
		{[]string{"203.0.113.7:5555"}, "203.0.113.7/32"},
		{[]string{"CUDA out of memory"}, "10.0.0.1/32"},
		{[]string{"10.1.1.1, 10.2.2.2"}, "10.0.0.1/32"},
	} {
		r, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
		r.RemoteAddr = "10.0.0.1:4000"
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := p.forwardedClient(r).String(); got != tc.want {
			t.Errorf("X-Forwarded-For %q: client %s; want %s", tc.xff, got, tc.want)
		}
	}
}

func TestPerClientDefault(t *testing.T) {
	for _, tc := range []struct{ configured, capN, want int }{
		{0, 1024, 256}, {0, 352, 88}, {0, 12, 4}, {7, 1024, 7},
	} {
		if got := perClient(tc.configured, tc.capN); got != tc.want {
			t.Errorf("perClient(%d, %d) = %d; want %d", tc.configured, tc.capN, got, tc.want)
		}
	}
}

// Whatever a client writes in X-Forwarded-For, the client it is counted as
// is the balancer itself or an address not trusted, of the right width.
func FuzzForwardedClient(f *testing.F) {
	for _, s := range []string{"203.0.113.7", "1.2.3.4, 10.0.0.5", "::ffff:1.2.3.4", "[2001:db8::1]:80", ",,,", "CUDA out of memory", "10.0.0.1, 2001:db9::5"} {
		f.Add(s)
	}
	p := New(proxyConfig(), &fakeUp{}, nil, nil)
	p.trusted = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	peer := netip.MustParsePrefix("10.0.0.1/32")
	f.Fuzz(func(t *testing.T, xff string) {
		r, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
		r.RemoteAddr = "10.0.0.1:4000"
		r.Header.Set("X-Forwarded-For", xff)
		got := p.forwardedClient(r)
		if got == peer {
			return
		}
		if !got.IsValid() || p.trustedAddr(got.Addr()) || (got.Addr().Is4() && got.Bits() != 32) || (got.Addr().Is6() && got.Bits() != 64) {
			t.Fatalf("X-Forwarded-For %q: client %s", xff, got)
		}
	})
}
