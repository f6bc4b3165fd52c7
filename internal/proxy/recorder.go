// The way back to the client: every write bounded by write_timeout, the
// status remembered, streaming kept working; and the copy buffers.

package proxy

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// recorder remembers the status code and bounds every write to the client:
// before each write or flush the connection's write deadline is set
// writeTimeout ahead, so a client that reads nothing for that long makes
// the write fail. The ReverseProxy then aborts the request, which cancels
// it at vLLM and frees its slot (issue 15: two clients that never read
// held both slots of a limit of 2 for as long as they liked). A client that
// reads, however slowly, renews the deadline with each write that gets
// through. Flush, FlushError and Unwrap keep streaming and
// http.ResponseController working through it.
type recorder struct {
	http.ResponseWriter
	rc           *http.ResponseController // of the server's ResponseWriter
	writeTimeout time.Duration
	code         int
	stalled      bool // a write failed on the deadline
}

func (r *recorder) renew() {
	if r.writeTimeout > 0 {
		_ = r.rc.SetWriteDeadline(time.Now().Add(r.writeTimeout))
	}
}

func (r *recorder) noteErr(err error) {
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		r.stalled = true
	}
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 && code >= 200 {
		r.code = code
	}
	r.renew()
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	r.renew()
	n, err := r.ResponseWriter.Write(b)
	r.noteErr(err)
	return n, err
}

func (r *recorder) Flush() { _ = r.FlushError() }

func (r *recorder) FlushError() error {
	r.renew()
	err := r.rc.Flush()
	r.noteErr(err)
	return err
}

// Hijack (a protocol upgrade) hands the connection over without the
// write deadline: the upgraded stream is no longer an HTTP answer.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	_ = r.rc.SetWriteDeadline(time.Time{})
	return r.rc.Hijack()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// bufferPool lends the ReverseProxy its copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte { return *(buffers.Get().(*[]byte)) }

func (bufferPool) Put(b []byte) { buffers.Put(&b) }
