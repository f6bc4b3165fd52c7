package config

import (
	"strconv"
	"strings"
)

// BurntSushi/toml v1.6.0 keeps key positions private (MetaData has no
// position API), yet every error must name its line. scanPositions walks
// the already-parsed source once and records the line where each key path
// first appears: table headers, dotted keys and inline-table keys included.
// It only ever runs on input the TOML parser accepted, and it never panics
// or loops on anything else.

// keySep joins key pieces into a map key; it cannot appear in a key the
// operator would write by accident.
const keySep = "\x1f"

type positions map[string]int

// line returns the line of path, or of its nearest ancestor written in the
// file (an env entry inside an inline table, say), or 0.
func (p positions) line(path []string) int {
	for n := len(path); n > 0; n-- {
		if l, ok := p[strings.Join(path[:n], keySep)]; ok {
			return l
		}
	}
	return 0
}

// has reports whether path itself was written in the file.
func (p positions) has(path []string) bool {
	_, ok := p[strings.Join(path, keySep)]
	return ok
}

func scanPositions(src string) positions {
	s := &scanner{src: src, line: 1, pos: positions{}}
	s.run()
	return s.pos
}

type scanner struct {
	src   string
	i     int
	line  int
	table []string
	pos   positions
}

func (s *scanner) eof() bool { return s.i >= len(s.src) }

func (s *scanner) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.i]
}

func (s *scanner) advance() {
	if s.eof() {
		return
	}
	if s.src[s.i] == '\n' {
		s.line++
	}
	s.i++
}

func (s *scanner) skipSpace() {
	for c := s.peek(); c == ' ' || c == '\t'; c = s.peek() {
		s.i++
	}
}

// skipBlank skips spaces, newlines and comments.
func (s *scanner) skipBlank() {
	for !s.eof() {
		switch s.peek() {
		case ' ', '\t', '\r', '\n':
			s.advance()
		case '#':
			s.skipLine()
		default:
			return
		}
	}
}

func (s *scanner) skipLine() {
	for !s.eof() && s.peek() != '\n' {
		s.i++
	}
}

func (s *scanner) record(path []string, line int) {
	k := strings.Join(path, keySep)
	if _, ok := s.pos[k]; !ok {
		s.pos[k] = line
	}
}

func (s *scanner) run() {
	for {
		s.skipBlank()
		if s.eof() {
			return
		}
		start := s.i
		if s.peek() == '[' {
			s.header()
		} else {
			s.keyval(s.table)
		}
		if s.i == start {
			s.advance()
		}
	}
}

func (s *scanner) header() {
	line := s.line
	s.i++ // [
	if s.peek() == '[' {
		s.i++
	}
	key := s.key()
	for !s.eof() && s.peek() != '\n' && s.peek() != ']' {
		s.i++
	}
	for s.peek() == ']' {
		s.i++
	}
	s.table = key
	for j := 1; j <= len(key); j++ {
		s.record(key[:j], line)
	}
}

func (s *scanner) keyval(prefix []string) {
	line := s.line
	key := s.key()
	s.skipSpace()
	if len(key) == 0 || s.peek() != '=' {
		s.skipLine()
		return
	}
	s.i++ // =
	s.skipSpace()
	full := append(append([]string{}, prefix...), key...)
	for j := len(prefix) + 1; j <= len(full); j++ {
		s.record(full[:j], line)
	}
	s.value(full)
}

// key reads a possibly dotted key: bare, "basic" or 'literal' pieces.
func (s *scanner) key() []string {
	var parts []string
	for {
		s.skipSpace()
		switch c := s.peek(); {
		case c == '"' || c == '\'':
			parts = append(parts, s.str())
		case c < 0x80 && isBareRune(rune(c)):
			start := s.i
			for c := s.peek(); c < 0x80 && c != 0 && isBareRune(rune(c)); c = s.peek() {
				s.i++
			}
			parts = append(parts, s.src[start:s.i])
		default:
			return parts
		}
		s.skipSpace()
		if s.peek() != '.' {
			return parts
		}
		s.i++
	}
}

// str reads any of the four string forms and returns its content (decoded
// for single-line basic strings, which is all a key can be).
func (s *scanner) str() string {
	q := s.src[s.i]
	triple := strings.Repeat(string(q), 3)
	if strings.HasPrefix(s.src[s.i:], triple) {
		s.i += 3
		start := s.i
		for !s.eof() {
			if q == '"' && s.peek() == '\\' {
				s.advance()
				s.advance()
				continue
			}
			if strings.HasPrefix(s.src[s.i:], triple) {
				end := s.i
				s.i += 3
				// Up to two more quotes belong to the content: """a""""".
				for n := 0; n < 2 && s.peek() == q; n++ {
					s.i++
					end++
				}
				return s.src[start:end]
			}
			s.advance()
		}
		return s.src[start:]
	}
	s.i++
	start := s.i
	for !s.eof() && s.peek() != q && s.peek() != '\n' {
		if q == '"' && s.peek() == '\\' {
			s.i++
			if s.eof() || s.peek() == '\n' {
				break
			}
		}
		s.i++
	}
	raw := s.src[start:s.i]
	if s.peek() == q {
		s.i++
	}
	if q == '"' {
		if u, err := strconv.Unquote(`"` + raw + `"`); err == nil {
			return u
		}
	}
	return raw
}

func (s *scanner) value(path []string) {
	switch s.peek() {
	case '"', '\'':
		s.str()
	case '[':
		s.i++
		for {
			s.skipBlank()
			if s.eof() {
				return
			}
			if s.peek() == ']' {
				s.i++
				return
			}
			start := s.i
			s.value(path)
			s.skipBlank()
			if s.peek() == ',' {
				s.i++
			}
			if s.i == start {
				s.advance()
			}
		}
	case '{':
		s.i++
		for {
			s.skipBlank()
			if s.eof() {
				return
			}
			if s.peek() == '}' {
				s.i++
				return
			}
			start := s.i
			s.keyval(path)
			s.skipBlank()
			if s.peek() == ',' {
				s.i++
			}
			if s.i == start {
				s.advance()
			}
		}
	default:
		for !s.eof() {
			switch s.peek() {
			case ',', ']', '}', '\n', '#':
				return
			}
			s.i++
		}
	}
}
