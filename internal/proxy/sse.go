package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"mime"
	"net/http"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// apiError is OpenAI's error shape, which clients of vLLM parse.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func errorJSON(code int, typ, msg string) []byte {
	b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
	return b
}

// writeError answers with a JSON error in OpenAI's shape.
func writeError(w http.ResponseWriter, code int, typ, msg string) {
	b := errorJSON(code, typ, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func isEventStream(contentType string) bool {
	if contentType == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && strings.EqualFold(mt, "text/event-stream")
}

// sseStreamCut is the event that ends a stream vLLM cut.
var sseStreamCut = func() []byte {
	return []byte("data: " + string(errorJSON(http.StatusServiceUnavailable, "server_error",
		"vLLM stopped in the middle of this response (it died or is restarting); retry the request")) + "\n\n")
}()

// sseBody is vLLM's SSE response body as the ReverseProxy copies it. When
// reading it fails while the client is still there (vLLM died: the
// connection reset or closed mid-chunk), it ends the stream with an error
// event in OpenAI's shape instead of a bare reset, then reports a clean
// end. A client that left gets the error itself, so the copy stops.
type sseBody struct {
	rc      io.ReadCloser
	ctx     context.Context
	log     *zap.Logger
	path    string
	lastNL  int    // newlines ending what was passed on so far (0, 1, 2+)
	pending []byte // the error event still to hand out
	ended   bool
	cut     func() // counts the cut (a stream the proxy does not resume)
	errSeen bool   // vLLM's error event passed: counted as the cut
	tail    []byte // the last bytes passed, for an event across two reads
	started bool
}

func (b *sseBody) Read(p []byte) (int, error) {
	if b.ended {
		return b.drain(p)
	}
	n, err := b.rc.Read(p)
	b.track(p[:n])
	b.seeError(p[:n])
	if err == nil || err == io.EOF || b.ctx.Err() != nil {
		return n, err
	}
	// Debug: one vLLM death cuts every stream at once; the supervisor logs the death.
	b.log.Debug("SSE stream cut by vLLM; ending it with an error event", zap.String("path", b.path), zap.Error(err))
	b.ended = true
	if b.cut != nil && !b.errSeen {
		b.cut()
	}
	// Close the event the cut interrupted, so that the error event is
	// parsed on its own.
	b.pending = append([]byte(strings.Repeat("\n", max(0, 2-b.lastNL))), sseStreamCut...)
	if n > 0 {
		return n, nil
	}
	return b.drain(p)
}

// seeError counts a stream that vLLM ended with its engine-error event (a
// death seen from inside the stream: vLLM writes the error, then [DONE])
// as cut, once.
func (b *sseBody) seeError(p []byte) {
	if b.cut == nil || b.errSeen || len(p) == 0 {
		return
	}
	pat := []byte("\ndata: {\"error\"")
	if !b.started {
		b.started, b.tail = true, append(b.tail[:0], '\n')
	}
	seam := append(append(make([]byte, 0, 2*len(pat)), b.tail...), p[:min(len(p), len(pat))]...)
	if bytes.Contains(seam, pat) || bytes.Contains(p, pat) {
		b.errSeen = true
		b.cut()
		return
	}
	w := append(b.tail, p[max(0, len(p)-len(pat)):]...)
	b.tail = append(b.tail[:0], w[max(0, len(w)-len(pat)):]...)
}

func (b *sseBody) drain(p []byte) (int, error) {
	if len(b.pending) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

func (b *sseBody) track(p []byte) {
	if len(p) == 0 {
		return
	}
	i := len(p)
	for i > 0 && p[i-1] == '\n' {
		i--
	}
	if i == 0 {
		b.lastNL += len(p)
	} else {
		b.lastNL = len(p) - i
	}
}

func (b *sseBody) Close() error { return b.rc.Close() }

// newStdLog adapts zap for the standard library's error logs.
func newStdLog(l *zap.Logger, level zapcore.Level) *log.Logger {
	s, err := zap.NewStdLogAt(l, level)
	if err != nil {
		return zap.NewStdLog(l)
	}
	return s
}
