package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/vllm-guard/vllm-guard/internal/connlimit"
	"github.com/vllm-guard/vllm-guard/internal/state"
)

// Modes of the control socket and of the folder it lives in: the owner
// and its group may talk to the guard, nobody else may even look.
const (
	SocketMode    os.FileMode = 0o660
	SocketDirMode os.FileMode = 0o750
)

// Bounds of the control API: requests are tiny, answers are documents.
const (
	maxHeaderBytes = 16 << 10
	maxBodyBytes   = 4 << 10
	// DefaultIncidents is how many records GET /incidents returns without n.
	DefaultIncidents = 20
	maxIncidentsN    = 100000
	shutdownTimeout  = 5 * time.Second
	// recordWriteTimeout bounds the write of one incident record.
	recordWriteTimeout = 30 * time.Second
)

// Server is the control socket's HTTP server.
type Server struct {
	path string
	ln   *net.UnixListener
	lock *os.File // <socket>.lock, flocked while the guard serves
	srv  *http.Server
	done chan struct{} // closed when Serve returns
	log  *zap.Logger
}

// ListenSocket prepares path and serves the control API on it. The parent
// folder is created with mode 0750 when missing; a socket left by a crash
// (nobody answers on it) is replaced; a live guard on it, or a file that
// is not a socket, is an error naming the path.
func ListenSocket(path string, b Backend, log *zap.Logger) (*Server, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if path == "" {
		return nil, errors.New("control: no socket path; set [control] socket")
	}
	if err := prepareSocketDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	lock, err := lockSocket(path)
	if err != nil {
		return nil, err
	}
	if err := clearStaleSocket(path, log); err != nil {
		lock.Close()
		return nil, err
	}
	ln, err := listenPrivately(path)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("control: listen on %s: %w; check that its folder is writable by the guard", path, err)
	}
	// Bound 0600 (the umask below): nobody could connect before the mode
	// is set; now let the group in.
	if err := os.Chmod(path, SocketMode); err != nil {
		ln.Close()
		lock.Close()
		return nil, fmt.Errorf("control: chmod %s to %o: %w", path, SocketMode, err)
	}
	s := &Server{path: path, ln: ln, lock: lock, done: make(chan struct{}), log: log}
	// The socket's clients (its owner and group) get the control port's
	// small cap, within the descriptors reserved for supervision: a script
	// that opens connections in a loop cannot take the pipes a restart of
	// vLLM needs. Past it they wait in the backlog rather than be refused
	// (they are the operators), and idle connections give their place, so
	// `status` still gets in.
	_, capN := connlimit.Caps(connlimit.NoFile(), 0)
	cl := connlimit.NewWaiting(ln, capN)
	s.srv = &http.Server{
		Handler:           socketHandler(b, log),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       withPeer,
		ConnState:         cl.ConnState,
		ErrorLog:          zap.NewStdLog(log.Named("control-socket")),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(cl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("control socket stopped serving", zap.String("socket", path), zap.Error(err))
		}
	}()
	log.Info("control socket listening", zap.String("socket", path))
	return s, nil
}

// Close stops accepting, lets requests in flight finish (up to 5s), and
// removes the socket file.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close())
	}
	<-s.done
	// The listener removes the file on close; make sure of it, since a
	// leftover file would read as a crash to the next guard.
	if rmErr := os.Remove(s.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("control: remove %s: %w", s.path, rmErr))
	}
	// The lock goes last, once the socket is gone; its file stays (removing
	// it would let two guards lock two different files).
	return errors.Join(err, s.lock.Close())
}

// umaskMu serialises the umask changes of listenPrivately (the umask is
// the process's).
var umaskMu sync.Mutex

// listenPrivately binds the socket under umask 0177, so it is born 0600:
// between bind and chmod nobody else can connect.
func listenPrivately(path string) (*net.UnixListener, error) {
	umaskMu.Lock()
	defer umaskMu.Unlock()
	old := syscall.Umask(0o177)
	defer syscall.Umask(old)
	return net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
}

// lockSocket takes <path>.lock (flock, exclusive): only the guard holding
// it may remove or create the socket, so two guards configured with the
// same socket cannot remove each other's. The holder's PID is written in
// it, for the error the next one gets.
func lockSocket(path string) (*os.File, error) {
	lockPath := path + ".lock"
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("control: open the socket's lock file %s: %w; check that the socket's folder is the guard's", lockPath, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := "another vllm-guard"
		if b, rerr := io.ReadAll(io.LimitReader(f, 32)); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				holder = fmt.Sprintf("another vllm-guard (pid %d)", pid)
			}
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("control: %s holds %s and serves %s; stop it first, or give this one another [control] socket", holder, lockPath, path)
		}
		return nil, fmt.Errorf("control: lock %s: %w", lockPath, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// prepareSocketDir makes sure the socket's folder is the guard's: created
// 0750 when missing; an existing one must be a real folder (not a
// symlink), owned by the guard's user or root, and writable by nobody
// else: whoever can write there can replace the socket with their own.
func prepareSocketDir(dir string) error {
	info, err := os.Lstat(dir)
	if err == nil {
		if info.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("control: the socket folder %s is a symlink; the guard does not follow one (whoever can change it can redirect the socket): point [control] socket into the real folder", dir)
		}
		if !info.IsDir() {
			return fmt.Errorf("control: %s is not a folder; the socket's parent must be one: fix [control] socket", dir)
		}
		return checkSocketDir(dir, info) // an existing folder is the operator's: its mode is checked, not changed
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control: socket folder %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, SocketDirMode); err != nil {
		return fmt.Errorf("control: create socket folder %s: %w; create it (mode 0750) or fix [control] socket", dir, err)
	}
	// MkdirAll's mode passes through the umask; set it exactly.
	if err := os.Chmod(dir, SocketDirMode); err != nil {
		return fmt.Errorf("control: chmod socket folder %s: %w", dir, err)
	}
	// In a shared parent (a Kubernetes emptyDir is 0777) someone may have
	// made the folder first: check what is there now, as an existing one.
	info, err = os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("control: socket folder %s: %w", dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("control: %s is not a folder; the socket's parent must be one: fix [control] socket", dir)
	}
	return checkSocketDir(dir, info)
}

func checkSocketDir(dir string, info os.FileInfo) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("control: cannot tell who owns the socket folder %s", dir)
	}
	if euid := os.Geteuid(); int(st.Uid) != euid && st.Uid != 0 {
		return fmt.Errorf("control: the socket folder %s belongs to uid %d, not to the guard's user (uid %d) or root: its owner could replace the socket; chown it to the guard's user, or point [control] socket elsewhere", dir, st.Uid, euid)
	}
	if perm := info.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("control: the socket folder %s is mode %04o, writable by other users, who could replace the socket; chmod it 0750 (chmod go-w), or point [control] socket into a folder the guard makes itself (a missing one is made 0750, e.g. %s/vllm-guard/guard.sock: a subfolder of a shared folder such as a Kubernetes emptyDir)", dir, perm, dir)
	}
	return nil
}

// clearStaleSocket makes path free for a new socket: nothing there, or a
// socket nobody answers on (left by a crash), which it removes.
func clearStaleSocket(path string, log *zap.Logger) error {
	info, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control: socket path %s: %w", path, err)
	}
	if info.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("control: %s exists and is not a socket (%s); remove it or set [control] socket to another path", path, info.Mode().Type())
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("control: another vllm-guard is serving on %s; stop it first, or give this one another [control] socket", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("control: cannot tell whether a guard serves on %s (%w); remove the file if no guard runs", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control: remove the stale socket %s: %w", path, err)
	}
	log.Warn("removed a stale control socket nobody answered on (left by a guard that crashed)", zap.String("socket", path))
	return nil
}

// Peer is who is on the other end of a control connection, from
// SO_PEERCRED.
type Peer struct {
	UID, GID uint32
	PID      int32
	Known    bool
}

func (p Peer) String() string {
	if !p.Known {
		return "unknown peer"
	}
	return fmt.Sprintf("uid=%d pid=%d", p.UID, p.PID)
}

type peerKey struct{}

// withPeer stashes the connection's credentials for the handlers: the
// kernel vouches for them, so they name who asked for an action.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = w.NetConn() // the cap's wrapper
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var p Peer
	raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err == nil {
			p = Peer{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid, Known: true}
		}
	})
	return context.WithValue(ctx, peerKey{}, p)
}

// PeerFrom returns the peer of the request's connection.
func PeerFrom(ctx context.Context) Peer {
	p, _ := ctx.Value(peerKey{}).(Peer)
	return p
}

// ActionResult is the answer to a POST on the control socket.
type ActionResult struct {
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

type errorBody struct {
	Error string `json:"error"`
}

func socketHandler(b Backend, log *zap.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/status", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		// A few KiB of vLLM's output whatever it printed: the full lines
		// are in the incident record.
		writeJSON(w, http.StatusOK, Bound(Redacted(b.Doc())))
	}))
	mux.HandleFunc("/incidents", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		n, err := ParseIncidentsQuery(r.URL.RawQuery)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		serveIncidents(w, b, n, log)
	}))
	action := func(name, done string, do func(context.Context, string) error) http.HandlerFunc {
		return only(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
			// Actions take no body; read a bounded one so the connection
			// can be reused, and refuse a large one.
			if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxBodyBytes)); err != nil {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%s takes no body (at most %d bytes)", name, maxBodyBytes))
				return
			}
			p := PeerFrom(r.Context())
			fields := []zap.Field{zap.String("action", name), zap.Bool("peer_known", p.Known),
				zap.Uint32("peer_uid", p.UID), zap.Uint32("peer_gid", p.GID), zap.Int32("peer_pid", p.PID)}
			if err := do(r.Context(), p.String()); err != nil {
				log.Warn("control action refused", append(fields, zap.Error(err))...)
				writeError(w, http.StatusConflict, err.Error())
				return
			}
			log.Info("control action accepted", fields...)
			writeJSON(w, http.StatusOK, ActionResult{OK: true, Message: done})
		})
	}
	mux.HandleFunc("/restart", action("restart", "vLLM will be restarted", b.Restart))
	mux.HandleFunc("/profile/reset", action("profile reset", "the profile returns to rung 0 at the next restart", b.ResetProfile))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s; the control socket serves GET /status, GET /incidents?n=N, POST /restart, POST /profile/reset", r.URL.Path))
	})
	return mux
}

// serveIncidents writes the records as one JSON array, one record at a
// time as the store reads them: the guard never holds more than one. An
// error before the first record is a 500; after it, the array is cut
// short (the client's decoder says the answer ended early).
func serveIncidents(w http.ResponseWriter, b Backend, n int, log *zap.Logger) {
	started := false
	start := func() {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "[")
		started = true
	}
	first := true
	// The write deadline bounds one record, not the whole answer.
	rc := http.NewResponseController(w)
	err := b.Incidents(n, func(inc state.Incident) error {
		rc.SetWriteDeadline(time.Now().Add(recordWriteTimeout))
		data, err := json.Marshal(state.Redacted(inc))
		if err != nil {
			data, _ = json.Marshal(state.Incident{ID: inc.ID, Time: inc.Time, Cause: inc.Cause, Unreadable: "cannot be encoded: " + err.Error()})
		}
		if !started {
			start()
		}
		if !first {
			io.WriteString(w, ",\n")
		}
		first = false
		_, err = w.Write(data)
		return err
	})
	if err != nil && !started {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if err != nil {
		log.Warn("the incident records were cut short", zap.Error(err))
		return
	}
	if !started {
		start()
	}
	io.WriteString(w, "]\n")
}

// only answers 405 with an Allow header to any method but m (and HEAD for
// GET).
func only(m string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m && !(m == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", m)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, m))
			return
		}
		h(w, r)
	}
}

// ParseIncidentsQuery reads the query of GET /incidents: n, the number of
// records (0 = all; DefaultIncidents when absent).
func ParseIncidentsQuery(rawQuery string) (int, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return 0, fmt.Errorf("bad query %q: %w", rawQuery, err)
	}
	for k := range q {
		if k != "n" {
			return 0, fmt.Errorf("unknown query parameter %q; /incidents takes only n", k)
		}
	}
	vs, ok := q["n"]
	if !ok {
		return DefaultIncidents, nil
	}
	if len(vs) != 1 {
		return 0, fmt.Errorf("n given %d times; give it once", len(vs))
	}
	n, err := strconv.Atoi(vs[0])
	if err != nil || n < 0 || n > maxIncidentsN {
		return 0, fmt.Errorf("n=%q is not a number of records from 0 (all) to %d", vs[0], maxIncidentsN)
	}
	return n, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		// A document that cannot be encoded (a NaN from somewhere) is a
		// bug; say so instead of sending half of it.
		code = http.StatusInternalServerError
		data, _ = json.Marshal(errorBody{Error: "encode the answer: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(append(data, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorBody{Error: msg})
}
