package vllmlog

import (
	"bytes"
	"strings"
)

// Breaks are the bytes that end a line of vLLM's output: "\n", and "\r",
// with which tqdm rewrites its progress bars on stderr.
const Breaks = "\r\n"

// Splitter cuts a stream of output into lines at "\n" and "\r", across
// writes. Empty lines (the "" between "\r" and "\n") are not emitted. The
// zero value is ready; it is not safe for concurrent use.
type Splitter struct {
	// Max bounds one line in bytes (0: no bound): vLLM can print megabyte
	// lines (a dumped config, a flood); the rest of such a line is dropped
	// and never buffered.
	Max int

	partial []byte
	skip    bool // inside an over-long line: drop until its end
}

// Write feeds b and calls emit with every line b completes, without its
// break. The slice is valid only during the call.
func (s *Splitter) Write(b []byte, emit func(line []byte)) {
	for len(b) > 0 {
		i := bytes.IndexAny(b, Breaks)
		if i < 0 {
			s.keep(b)
			return
		}
		s.keep(b[:i])
		s.Flush(emit)
		b = b[i+1:]
	}
}

// Flush emits the line in progress, if any: a last line with no break.
func (s *Splitter) Flush(emit func(line []byte)) {
	s.skip = false
	if len(s.partial) == 0 {
		return
	}
	emit(s.partial)
	s.partial = s.partial[:0]
}

func (s *Splitter) keep(b []byte) {
	if s.skip {
		return
	}
	if s.Max > 0 {
		if room := s.Max - len(s.partial); len(b) > room {
			s.partial = append(s.partial, b[:room]...)
			s.skip = true
			return
		}
	}
	s.partial = append(s.partial, b...)
}

// LastRewrite returns what a terminal would show of a saved line that tqdm
// rewrote with "\r": the last non-empty segment ("a 50%\rb 100%\r" → "b 100%").
func LastRewrite(line string) string {
	line = strings.TrimRight(line, Breaks)
	if i := strings.LastIndexByte(line, '\r'); i >= 0 {
		return line[i+1:]
	}
	return line
}

// ScanLines is a bufio.SplitFunc that cuts at "\n" and "\r", as Splitter
// does, for readers that scan a whole stream. Unlike Splitter it returns the
// empty lines too.
func ScanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexAny(data, Breaks); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}
