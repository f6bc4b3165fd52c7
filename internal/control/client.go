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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vllm-guard/vllm-guard/internal/state"
)

// DefaultSocket is [control] socket's default.
const DefaultSocket = "/run/vllm-guard/guard.sock"

// ErrNoGuard means no guard answers on the socket: not running, or not
// reachable by this user. The commands exit 3 (exitcode.NoGuard) on it.
var ErrNoGuard = errors.New("no vllm-guard reachable")

// noGuardError names the socket and why connecting failed.
type noGuardError struct {
	path string
	err  error
}

func (e *noGuardError) Error() string {
	if errors.Is(e.err, syscall.EACCES) || errors.Is(e.err, syscall.EPERM) {
		return fmt.Sprintf("cannot connect to the vllm-guard socket %s: permission denied; run as root or as a member of the socket's group (connect: %v)", e.path, e.err)
	}
	return fmt.Sprintf("no vllm-guard answers on %s: is it running? (connect: %v)", e.path, e.err)
}

func (e *noGuardError) Is(target error) bool { return target == ErrNoGuard }
func (e *noGuardError) Unwrap() error        { return e.err }

// untrustedServerError is a socket served by a process the client does
// not trust: not root, not this user, and not the owner of a socket
// folder nobody else could have written in. Whoever could write there
// could have put it there; its answer is not read.
type untrustedServerError struct {
	path     string
	uid, pid int
	ours     int
	why      string // why the folder does not vouch for the server
}

func (e *untrustedServerError) Error() string {
	return fmt.Sprintf("the process serving %s (pid %d) runs as uid %d, neither root nor this user (uid %d), and %s: not a guard this command trusts, so its answer was not read; check who owns the socket and its folders, or run as the guard's user", e.path, e.pid, e.uid, e.ours, e.why)
}

// Is makes the commands treat it as no guard reachable (exit 3).
func (e *untrustedServerError) Is(target error) bool { return target == ErrNoGuard }

// TrustedServer reports whether a control socket at socketPath served by
// uid may be believed: root's, this user's own, or the server's own
// folder's. The last is how root and the members of the socket's group
// ask a guard running as its own user (User=vllm): its folder is uid's and
// writable by nobody else, and so is every folder above it (root's, or
// sticky like /tmp), so nobody but uid or root could have bound a socket
// there. When it says no, the string says why.
func TrustedServer(uid int, socketPath string) (bool, string) {
	if uid == 0 || uid == os.Geteuid() {
		return true, ""
	}
	why := folderVouchesFor(filepath.Dir(socketPath), uid)
	return why == "", why
}

// folderVouchesFor returns "" when only uid or root could have made dir
// and put a socket in it, else what lets someone else.
func folderVouchesFor(dir string, uid int) string {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Sprintf("its folder %s cannot be checked (%v)", dir, err)
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return fmt.Sprintf("its folder %s cannot be checked (%v)", dir, err)
	}
	if info.Mode()&os.ModeSymlink != 0 {
		return fmt.Sprintf("its folder %s is a symlink", dir)
	}
	if why := ownedAndClosed(dir, info, uid, false); why != "" {
		return why
	}
	// The folders above may be links (/var/run to /run); what counts is
	// the folder they lead to and the folders above that.
	parent, err := filepath.EvalSymlinks(filepath.Dir(dir))
	if err != nil {
		return fmt.Sprintf("the folder above %s cannot be checked (%v)", dir, err)
	}
	for d := parent; ; d = filepath.Dir(d) {
		info, err := os.Lstat(d)
		if err != nil {
			return fmt.Sprintf("the folder %s above it cannot be checked (%v)", d, err)
		}
		if why := ownedAndClosed(d, info, uid, true); why != "" {
			return why
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// ownedAndClosed says what is wrong with folder d for a server running as
// uid: owned by someone else than uid or root, or writable by group or
// others (a sticky folder above the socket's is fine: nobody can rename or
// remove what they do not own in it).
func ownedAndClosed(d string, info os.FileInfo, uid int, above bool) string {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || !info.IsDir() {
		return fmt.Sprintf("%s is not a folder", d)
	}
	if int(st.Uid) != uid && st.Uid != 0 {
		return fmt.Sprintf("the folder %s belongs to uid %d", d, st.Uid)
	}
	if perm := info.Mode().Perm(); perm&0o022 != 0 && !(above && info.Mode()&os.ModeSticky != 0) {
		return fmt.Sprintf("the folder %s is mode %04o, writable by other users", d, perm)
	}
	return ""
}

// checkServer asks the kernel who serves the socket (SO_PEERCRED: the
// credentials of the process that bound it).
func checkServer(c net.Conn, path string) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("control: %s is not a unix socket connection", path)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("control: the peer of %s: %w", path, err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		credErr = err
	}
	if credErr != nil {
		return fmt.Errorf("control: cannot tell who serves %s (SO_PEERCRED: %w); its answer was not read", path, credErr)
	}
	if ok, why := TrustedServer(int(cred.Uid), path); !ok {
		return &untrustedServerError{path: path, uid: int(cred.Uid), pid: int(cred.Pid), ours: os.Geteuid(), why: why}
	}
	return nil
}

// Client talks to a guard over its control socket.
type Client struct {
	path string
	http *http.Client
}

// NewClient returns a client for the guard on socketPath.
func NewClient(socketPath string) *Client { return newClient(socketPath, false) }

// newClient is NewClient; with noFollow the socket must be the file at
// socketPath itself, never what a symlink there leads to (`status --all`
// reads a folder others may write in).
func newClient(socketPath string, noFollow bool) *Client {
	var d net.Dialer
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			addr := socketPath
			if noFollow {
				// O_PATH|O_NOFOLLOW opens the name itself; connecting to
				// /proc/self/fd/N reaches the socket that descriptor is,
				// whatever the name becomes after.
				fd, err := unix.Open(socketPath, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					return nil, &net.OpError{Op: "dial", Net: "unix", Err: err}
				}
				defer unix.Close(fd)
				var st unix.Stat_t
				if err := unix.Fstat(fd, &st); err != nil {
					return nil, &net.OpError{Op: "dial", Net: "unix", Err: err}
				}
				if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
					return nil, &net.OpError{Op: "dial", Net: "unix", Err: fmt.Errorf("%s is not a socket (a symlink is not followed)", socketPath)}
				}
				addr = fmt.Sprintf("/proc/self/fd/%d", fd)
			}
			c, err := d.DialContext(ctx, "unix", addr)
			if err != nil {
				return nil, err
			}
			if err := checkServer(c, socketPath); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		},
		MaxIdleConns:          1,
		IdleConnTimeout:       5 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	// No overall Timeout: each call bounds itself (a context of
	// requestTimeout; the records of /incidents by their pace).
	return &Client{path: socketPath, http: &http.Client{Transport: tr}}
}

// Path is the socket the client talks to.
func (c *Client) Path() string { return c.path }

// CloseIdleConnections releases the kept connection, if any.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Status returns the guard's status document.
func (c *Client) Status(ctx context.Context) (Doc, error) {
	var d Doc
	err := c.do(ctx, http.MethodGet, "/status", func(r io.Reader) (err error) {
		d, err = DecodeDoc(r)
		return err
	})
	return d, err
}

// Incidents returns up to n incident records (all when n ≤ 0), newest
// first. It holds them all; EachIncident does not.
func (c *Client) Incidents(ctx context.Context, n int) ([]state.Incident, error) {
	var incs []state.Incident
	err := c.EachIncident(ctx, n, func(inc state.Incident) error {
		incs = append(incs, inc)
		return nil
	})
	return incs, err
}

// recordTimeout bounds the wait for one incident record (an earlier
// guard's record of up to 32 MiB is read, decoded and sent whole).
const recordTimeout = 30 * time.Second

// maxRecordWire bounds one record read from a guard: this version serves
// records of about 1 MiB; an earlier guard served what it read, at most
// state.MaxRecordFileBytes, which JSON escaping may grow.
const maxRecordWire = 2 * state.MaxRecordFileBytes

// EachIncident hands up to n incident records (all when n ≤ 0), newest
// first, to each as they arrive: it never holds more than one. A record
// the guard could not read comes with Unreadable set.
// The answer may be long (hundreds of records): it is bounded by its
// pace, not its length: recordTimeout to the first record and between
// two, besides ctx.
func (c *Client) EachIncident(ctx context.Context, n int, each func(state.Incident) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := fmt.Errorf("no incident record came for %s", recordTimeout)
	idle := time.AfterFunc(recordTimeout, func() { cancel(stalled) })
	defer idle.Stop()
	err := c.do(ctx, http.MethodGet, "/incidents?n="+strconv.Itoa(max(n, 0)), func(r io.Reader) error {
		return DecodeIncidents(r, func(inc state.Incident) error {
			idle.Stop()
			defer idle.Reset(recordTimeout)
			return each(inc)
		})
	})
	if err != nil && context.Cause(ctx) == stalled {
		return fmt.Errorf("%w: %w", stalled, err)
	}
	return err
}

// DecodeIncidents reads a JSON array of incident records, handing each to
// each as it is decoded; a record larger than maxRecordWire is an error,
// not an allocation.
func DecodeIncidents(r io.Reader, each func(state.Incident) error) error {
	return decodeIncidents(r, maxRecordWire, each)
}

// decodeIncidents is DecodeIncidents with records of at most limit bytes.
func decodeIncidents(r io.Reader, limit int64, each func(state.Incident) error) error {
	lr := &windowReader{r: r}
	dec := json.NewDecoder(lr)
	lr.limit = limit
	if t, err := dec.Token(); err != nil {
		return fmt.Errorf("decode the incident records: %w", err)
	} else if t != json.Delim('[') {
		return fmt.Errorf("decode the incident records: want a JSON array, got %v", t)
	}
	for i := 1; dec.More(); i++ {
		lr.limit = dec.InputOffset() + limit
		var inc state.Incident
		if err := dec.Decode(&inc); err != nil {
			if lr.read >= lr.limit {
				return fmt.Errorf("incident record %d is larger than %d bytes: not a vllm-guard record", i, limit)
			}
			return fmt.Errorf("decode incident record %d: %w", i, err)
		}
		if err := each(inc); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("decode the incident records: the answer ended early: %w", err)
	}
	return nil
}

// windowReader reads r up to limit bytes in all, then says EOF; the
// decoder moves limit on before each record.
type windowReader struct {
	r           io.Reader
	read, limit int64
}

func (w *windowReader) Read(p []byte) (int, error) {
	if w.read >= w.limit {
		return 0, io.ErrUnexpectedEOF
	}
	if int64(len(p)) > w.limit-w.read {
		p = p[:w.limit-w.read]
	}
	n, err := w.r.Read(p)
	w.read += int64(n)
	return n, err
}

// Restart asks the guard to restart vLLM.
func (c *Client) Restart(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/restart", nil)
}

// ResetProfile asks the guard to return to rung 0 at the next restart.
func (c *Client) ResetProfile(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/profile/reset", nil)
}

func (c *Client) do(ctx context.Context, method, path string, decode func(io.Reader) error) error {
	// The host is a placeholder: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://vllm-guard"+path, nil)
	if err != nil {
		return fmt.Errorf("control: build request %s %s: %w", method, path, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var up *untrustedServerError
		if errors.As(err, &up) {
			return up
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return &noGuardError{path: c.path, err: op.Err}
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is our placeholder, not worth showing
		}
		return fmt.Errorf("vllm-guard on %s: %s %s: %w", c.path, method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var eb errorBody
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		msg := string(data)
		if json.Unmarshal(data, &eb) == nil && eb.Error != "" {
			msg = eb.Error
		}
		// The guard's words, for a terminal: cleaned and bounded.
		return &refusedError{fmt.Sprintf("vllm-guard on %s: %s %s: %s (HTTP %d)", c.path, method, path, state.Cut(clean(msg), 4<<10), resp.StatusCode)}
	}
	if decode == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := decode(resp.Body); err != nil {
		return &badAnswerError{fmt.Errorf("vllm-guard on %s answered %s %s, but: %w", c.path, method, path, err)}
	}
	return nil
}

// refusedError is a guard's answer that is not a 2xx: a guard answers.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// badAnswerError is a guard's answer that cannot be read (too large, not
// JSON): a guard answers, so it is not ErrNoGuard.
type badAnswerError struct{ err error }

func (e *badAnswerError) Error() string { return clean(e.err.Error()) }
func (e *badAnswerError) Unwrap() error { return e.err }
