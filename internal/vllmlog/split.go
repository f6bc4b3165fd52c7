package vllmlog

import (
	"bytes"
)

// Breaks are the bytes that end a line of vLLM's output: "\n", and "\r",
// with which tqdm rewrites its progress bars on stderr.
const Breaks = "\r\n"

// LineStart is what came before a line in its stream: the provenance of
// its first byte. vLLM's logger (vllm/logging_utils/formatter.py) ends
// every line of a multi-line record but the last with "\r\n" and repeats
// the record's header after it, so a line after "\r\n" continues the
// record above and is never a record's first line; a line after a lone
// "\r" is a rewrite (tqdm's bar) or a "\r" inside a message, never the
// start of anything vLLM printed.
type LineStart uint8

const (
	StartUnknown LineStart = iota // not known (a saved log)
	StartFresh                    // the stream's first line, or after "\n"
	StartCRLF                     // after "\r\n": a record going on
	StartCR                       // after a lone "\r"
)

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
	begun   bool // the line in progress has a byte (kept or dropped)
	cr      bool // the last byte was a "\r" ending a line
	start   LineStart
	next    LineStart // the start of the next line
}

// Write feeds b and calls emit with every line b completes, without its
// break. The slice is valid only during the call.
func (s *Splitter) Write(b []byte, emit func(line []byte)) {
	s.WriteStart(b, func(line []byte, _ LineStart) { emit(line) })
}

// WriteStart is Write that also says what came before each line.
func (s *Splitter) WriteStart(b []byte, emit func(line []byte, start LineStart)) {
	for len(b) > 0 {
		i := bytes.IndexAny(b, Breaks)
		if i < 0 {
			s.content(b)
			return
		}
		s.content(b[:i])
		brk := b[i]
		b = b[i+1:]
		if !s.begun { // nothing since the last break
			switch {
			case brk == '\n' && s.cr:
				s.next, s.cr = StartCRLF, false
			case brk == '\n':
				s.next = StartFresh
			default:
				s.next, s.cr = StartCR, true
			}
			continue
		}
		s.FlushStart(emit)
		if brk == '\r' {
			s.next, s.cr = StartCR, true
		} else {
			s.next, s.cr = StartFresh, false
		}
	}
}

func (s *Splitter) content(b []byte) {
	if len(b) == 0 {
		return
	}
	if !s.begun {
		s.begun, s.start = true, s.next
		if s.start == StartUnknown {
			s.start = StartFresh
		}
	}
	s.cr = false
	s.keep(b)
}

// Flush emits the line in progress, if any: a last line with no break.
func (s *Splitter) Flush(emit func(line []byte)) {
	s.FlushStart(func(line []byte, _ LineStart) { emit(line) })
}

// FlushStart is Flush that also says what came before the line.
func (s *Splitter) FlushStart(emit func(line []byte, start LineStart)) {
	s.skip, s.begun = false, false
	if len(s.partial) == 0 {
		return
	}
	emit(s.partial, s.start)
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
