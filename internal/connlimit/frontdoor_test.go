package connlimit

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
)

// rigServer serves l with the hooks a handler needs to talk to it; hold
// blocks requests to /hold (after reading their body) until it is closed.
type rigServer struct {
	addr    string
	entered chan string   // the path of each request whose handler began
	working chan string   // the path of each request past Working
	idle    chan struct{} // a connection went idle after its answer
	hold    chan struct{}
}

func serveRig(t *testing.T, l *Listener) *rigServer {
	t.Helper()
	r := &rigServer{addr: l.Addr().String(), entered: make(chan string, 64), working: make(chan string, 64), idle: make(chan struct{}, 64), hold: make(chan struct{})}
	connState := func(c net.Conn, st http.ConnState) {
		l.ConnState(c, st)
		if st == http.StateIdle {
			r.idle <- struct{}{}
		}
	}
	srv := &http.Server{ConnState: connState, ConnContext: ConnContext, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ContentLength != 0 {
			Reading(req.Context())
		}
		r.entered <- req.URL.Path
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return // evicted: nobody to answer
		}
		Working(req.Context())
		r.working <- req.URL.Path
		if req.URL.Path == "/hold" {
			<-r.hold
		}
		if Reserved(req.Context()) {
			io.WriteString(w, "reserve")
			return
		}
		io.WriteString(w, "ok")
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	t.Cleanup(func() {
		select {
		case <-r.hold:
		default:
			close(r.hold)
		}
		srv.Close()
		<-done
	})
	return r
}

func (r *rigServer) from(t *testing.T, ip byte) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, ip)}}
	c, err := d.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// answer reads the answer on c: its status and body.
func answer(c net.Conn) (int, string, error) {
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), nil
}

const slowBody = "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nx"

// A connection whose request is still receiving its body gives its place
// to a newcomer, like an idle one; once its body is read (Working) it
// holds its place again.
func TestReadingGivesWayWorkingHolds(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewPerSource(inner, 2, 2)
	r := serveRig(t, l)
	slow := []net.Conn{r.from(t, 2), r.from(t, 3)}
	for _, c := range slow {
		io.WriteString(c, slowBody)
		<-r.entered
	}
	// Both places are taken by slow bodies: a newcomer gets in, and the
	// oldest slow body is the one that leaves.
	c := r.from(t, 4)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if code, body, err := answer(c); err != nil || code != http.StatusOK || body != "ok" {
		t.Fatalf("a newcomer with slow bodies in every place: %d %q %v; want 200", code, body, err)
	}
	<-r.idle // the newcomer's connection, kept alive
	if _, _, err := answer(slow[0]); err == nil {
		t.Error("the oldest slow body was answered; want its connection closed")
	}
	if l.Evicted() != 1 {
		t.Errorf("evicted %d; want 1", l.Evicted())
	}
	// Two requests whose bodies are read and that are working hold both
	// places: a newcomer is refused.
	close(r.hold)
	r.hold = make(chan struct{})
	for len(r.working) > 0 {
		<-r.working
	}
	for _, ip := range []byte{5, 6} {
		w := r.from(t, ip)
		io.WriteString(w, "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
		<-r.entered
		if p := <-r.working; p != "/hold" {
			t.Fatalf("working: %s; want /hold", p)
		}
	}
	n := r.from(t, 7)
	io.WriteString(n, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if code, body, err := answer(n); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("a newcomer with two working requests in both places: %d %q %v; want 503", code, body, err)
	}
	close(r.hold)
}

// A listener with a reserve accepts a newcomer that finds every place
// working (and its address at its share) into the reserve, which the
// handler can tell; a full reserve gives its oldest idle place.
func TestReserveTakesWhatTheCapRefuses(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewPerSource(inner, 2, 1)
	l.SetReserve(1)
	r := serveRig(t, l)
	for _, ip := range []byte{2, 3} {
		c := r.from(t, ip)
		io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		<-r.entered
	}
	for _, ip := range []byte{2, 4, 4} {
		c := r.from(t, ip)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if code, body, err := answer(c); err != nil || code != http.StatusOK || body != "reserve" {
			t.Fatalf("from 127.0.0.%d with every place working: %d %q %v; want 200 on the reserve", ip, code, body, err)
		}
		<-r.entered
		<-r.idle // kept alive: the next newcomer may take its place
	}
	if l.Refused() != 0 {
		t.Errorf("refused %d; want none (the reserve's idle place given to each newcomer)", l.Refused())
	}
}

// An exempt peer (a trusted load balancer) is not held to the per-source
// cap; others are.
func TestExemptPeerHasNoShare(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewPerSource(inner, 8, 1)
	l.Exempt([]netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")})
	r := serveRig(t, l)
	for range 3 {
		c := r.from(t, 2)
		io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		<-r.entered
	}
	c := r.from(t, 3)
	io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
	<-r.entered
	c = r.from(t, 3)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if code, _, err := answer(c); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("a second working connection from a peer that is not exempt: %d %v; want 503", code, err)
	}
}
