package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/connlimit"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Readiness is the body of /readyz.
type Readiness struct {
	State  status.State `json:"state"`
	Reason string       `json:"reason"`
}

// NewHTTPHandler serves the guard's HTTP endpoints: /livez (200 while the
// guard's loop works, whatever vLLM does; 503 when it is wedged or gave
// up), /readyz (200 only while vLLM is
// ready), /status (Summary of the status document) and /metrics (metrics;
// 404 when nil). Actions are not served here: they need the socket's
// permissions.
func NewHTTPHandler(b Backend, metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/livez", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if ok, why := b.Alive(); !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not alive: %s\n", why)
			return
		}
		// A guard that gave up (on_give_up = "stay") keeps serving status
		// but no longer keeps vLLM up: let an orchestrator replace it.
		if g := b.Doc().Guard; g.State == status.StateFailed {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not alive: the guard gave up: %s\n", g.Reason)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	mux.HandleFunc("/readyz", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		g := b.Doc().Guard
		code := http.StatusOK
		if g.State != status.StateReady {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, Readiness{State: g.State, Reason: g.Reason})
	}))
	mux.HandleFunc("/status", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		// Anyone who reaches the port may ask: a bounded summary without
		// vLLM's lines or command lines (the full document is on the socket).
		writeJSON(w, http.StatusOK, Summary(b.Doc()))
	}))
	if metrics != nil {
		mux.Handle("/metrics", metrics)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s; this port serves GET /livez, /readyz, /status, /metrics", r.URL.Path))
	})
	return mux
}

// HTTPServer serves the guard's HTTP endpoints on a TCP address.
type HTTPServer struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// ListenHTTP listens on addr ("127.0.0.1:9461") and serves h. A listen
// error (the port is taken) is returned at once, so the guard can refuse
// to start instead of running blind.
func ListenHTTP(addr string, h http.Handler, log *zap.Logger) (*HTTPServer, error) {
	if log == nil {
		log = zap.NewNop()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("control: listen on %s ([control] http_listen): %w; free the port or choose another address (\"\" disables HTTP)", addr, err)
	}
	// Probes and scrapes are few: past connlimit.Caps' small share
	// connections are refused at accept, never taking the descriptors that
	// supervising vLLM needs. Idle and header-sending connections give
	// their place to a newcomer, and one client address holds at most a
	// quarter of them, so /livez and /readyz cannot be starved by
	// connections that ask nothing (issue 24).
	//
	// Connections with a request in progress can still fill it (scrapes
	// whose answer is read slowly, from many addresses): a newcomer that
	// finds every place working goes to a reserve of its own, where only
	// /livez and /readyz are answered, each at once and on a connection
	// closed after it, so nothing can hold the reserve (issue 41).
	_, capN := connlimit.Caps(connlimit.NoFile(), 0)
	cl := connlimit.NewPerSource(ln, capN, max(capN/4, 2))
	cl.SetReserve(healthReserve)
	s := &HTTPServer{
		ln:   cl,
		done: make(chan struct{}),
		srv: &http.Server{
			Handler:     frontDoor(checkHost(ln.Addr(), addr, h)),
			ConnContext: connlimit.ConnContext,
			// Probes and scrapes send their headers at once and are
			// answered at once: short bounds, so a connection that does
			// neither leaves soon even when nobody needs its place.
			ReadHeaderTimeout: 2 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       10 * time.Second,
			MaxHeaderBytes:    maxHeaderBytes,
			ConnState:         cl.ConnState,
			ErrorLog:          zap.NewStdLog(log.Named("http")),
		},
	}
	go func() {
		defer close(s.done)
		// The capped listener, never ln itself: serving ln left the port
		// with no cap at all (issue 32: 1,000 keep-alive connections took
		// 1,000 descriptors, and under LimitNOFILE vLLM's restart failed).
		if err := s.srv.Serve(cl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP endpoints stopped serving", zap.String("listen", addr), zap.Error(err))
		}
	}()
	log.Info("HTTP endpoints listening", zap.String("listen", ln.Addr().String()))
	return s, nil
}

// healthReserve is the number of connections kept for /livez and /readyz
// when every place of the port is working (connlimit's reserve).
const healthReserve = 8

// frontDoor answers what the port's endpoints need and nothing more. No
// endpoint here takes a body, so none is read: a request that announces
// one is answered at once, and its connection closed at once (a read
// deadline of now ends the server's wait for the rest of the body), so a
// body that never arrives holds no place (issue 41: 64 `GET /livez` with
// `Content-Length: 100000` and one byte held every place for the 10 s
// read timeout, and /livez answered 503). On a connection of the reserve
// only /livez and /readyz are answered, and the connection is closed
// after its one answer.
func frontDoor(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reserved := connlimit.Reserved(r.Context())
		if r.ContentLength != 0 || reserved {
			w.Header().Set("Connection", "close")
		}
		if r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		}
		if reserved && r.URL.Path != "/livez" && r.URL.Path != "/readyz" {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, fmt.Sprintf(
				"too many open connections with a request in progress: only /livez and /readyz are answered now, not %s; retry shortly", r.URL.Path))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Addr is the address listened on (the real port when addr had port 0).
func (s *HTTPServer) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server, letting requests in flight finish (up to 5s).
func (s *HTTPServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close())
	}
	<-s.done
	return err
}

// checkHost refuses a request whose Host header names something other
// than this listener (421 Misdirected Request), against DNS rebinding: a
// browser led to the port by a name an attacker controls sends that name.
// Allowed always: localhost (and *.localhost), loopback IPs, the listen
// address itself. Bound to all addresses (0.0.0.0, ::): also any IP
// literal, this host's name (full and short), and Kubernetes service names
// (*.svc, *.svc.cluster.local), which only the cluster's DNS resolves.
func checkHost(bound net.Addr, listen string, h http.Handler) http.Handler {
	listenHost, _, _ := net.SplitHostPort(listen)
	all := false
	if ta, ok := bound.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		all = true
	}
	hostname, _ := os.Hostname()
	allowed := func(host string) bool {
		if host == "" {
			return true // HTTP/1.0 without Host: no browser sends that
		}
		name, _, err := net.SplitHostPort(host)
		if err != nil {
			name = host // no port
		}
		name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
		if ip := net.ParseIP(name); ip != nil {
			return ip.IsLoopback() || all || strings.EqualFold(name, strings.Trim(listenHost, "[]"))
		}
		switch {
		case name == "localhost" || strings.HasSuffix(name, ".localhost"):
			return true
		case listenHost != "" && strings.EqualFold(name, strings.TrimSuffix(listenHost, ".")):
			return true
		case !all:
			return false
		case hostname != "" && (strings.EqualFold(name, hostname) || strings.EqualFold(name, strings.Split(hostname, ".")[0])):
			return true
		case strings.HasSuffix(name, ".svc") || strings.HasSuffix(name, ".svc.cluster.local"):
			return true
		}
		return false
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowed(r.Host) {
			writeError(w, http.StatusMisdirectedRequest, fmt.Sprintf(
				"Host %q is not this guard's address: the HTTP endpoints answer to localhost, loopback IPs and %s (when bound to all addresses: any IP literal, this host's name, *.svc); use one of those", r.Host, listen))
			return
		}
		h.ServeHTTP(w, r)
	})
}
