// A stream's bytes to and from the client and vLLM: the SSE events read
// from vLLM (pump, event) and what is written to the client.

package proxy

import (
	"bufio"
	"bytes"
	"net/http"
)

func (s *resumer) writeHeader(from http.Header) {
	h := s.w.Header()
	for k, v := range from {
		switch k {
		case "Content-Length", "Connection", "Transfer-Encoding", "Keep-Alive":
			continue
		}
		h[k] = v
	}
	s.w.WriteHeader(http.StatusOK)
	s.headerSent = true
	_ = s.w.FlushError()
}

func (s *resumer) write(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		s.clientGone = true
		return err
	}
	s.unflushed = false
	if err := s.w.FlushError(); err != nil {
		s.clientGone = true
		return err
	}
	return nil
}

// writeSoon writes b to the client without flushing it: pump flushes
// before it waits for more from vLLM.
func (s *resumer) writeSoon(b []byte) {
	if _, err := s.w.Write(b); err != nil {
		s.clientGone = true
		return
	}
	s.unflushed = true
}

func (s *resumer) flush() {
	if !s.unflushed {
		return
	}
	s.unflushed = false
	if err := s.w.FlushError(); err != nil {
		s.clientGone = true
	}
}

// eventReady: br holds a whole event already (no wait for vLLM).
func eventReady(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, []byte("\n\n"))
}

func (s *resumer) writeEvent(data []byte) {
	b := make([]byte, 0, len(data)+8)
	b = append(append(append(b, "data: "...), data...), "\n\n"...)
	_ = s.write(b)
}

// pump reads vLLM's stream and writes it to the client until [DONE] or a
// cut; why says what cut it.
func (s *resumer) pump(resp *http.Response) (outcome, string) {
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	var ev []byte
	s.partial = nil
	defer s.flush()
	inLine := false // the last read ended inside a line longer than the buffer
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			ev, inLine = append(ev, line...), true
			continue
		}
		if err != nil {
			s.partial = append(ev, line...)
			return outCut, "vLLM went away"
		}
		if inLine || len(bytes.TrimRight(line, "\r\n")) > 0 {
			ev, inLine = append(ev, line...), false
			continue
		}
		if len(ev) == 0 {
			continue
		}
		out, why, cut := s.event(ev)
		ev = ev[:0]
		if s.unflushed && !eventReady(br) {
			// Flushed before the wait for vLLM's next event, not after
			// each one: a write to the client's connection each, when
			// several came at once.
			s.flush()
		}
		if s.clientGone {
			return outDone, ""
		}
		if cut {
			return outCut, why
		}
		if out {
			return outDone, ""
		}
	}
}

// event handles one SSE event: done when the stream ended, cut when vLLM
// said its engine failed.
func (s *resumer) event(ev []byte) (done bool, why string, cut bool) {
	data := eventData(ev)
	if data == nil {
		return false, "", false // a comment: nothing for the client
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		s.finish()
		return true, "", false
	}
	return s.onChunk(ev, data)
}

// eventData is an event's data: its data lines joined by a newline; nil
// when it has none. One data line (vLLM's every event) is not copied.
func eventData(ev []byte) []byte {
	var data []byte
	copied := false
	for rest := ev; len(rest) > 0; {
		l := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			l, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		l = bytes.TrimRight(l, "\r")
		d, ok := bytes.CutPrefix(l, []byte("data:"))
		if !ok {
			continue
		}
		d = bytes.TrimPrefix(d, []byte(" "))
		switch {
		case data == nil:
			if len(d) > 0 { // (an empty data line before any other adds nothing)
				data = d[:len(d):len(d)]
			}
		case !copied:
			data = append(append(append([]byte(nil), data...), '\n'), d...)
			copied = true
		default:
			data = append(append(data, '\n'), d...)
		}
	}
	return data
}
