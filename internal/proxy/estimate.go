package proxy

// The prompt-token estimate: one pass over the body's bytes as they arrive,
// no tree, no re-parsing. Issue 24: the estimate re-parsed nested arrays at
// every level, and a 1 MiB body nested 10,000 deep cost 160 s of CPU before
// admission. Here each byte is looked at once, nesting deeper than
// maxPromptDepth or more than maxPromptItems values give up (the body then
// counts a quarter of its bytes, as any body that is not such JSON does),
// and so does a body past promptScanBudget bytes: the CPU an estimate may
// take is bounded whatever the body. The caller stops feeding when the
// request's context ends.

const (
	// maxPromptDepth: OpenAI-style bodies nest a handful of levels (a
	// message's content parts' image URL is 5); tool schemas a few more.
	maxPromptDepth = 64
	// maxPromptItems: values (of any kind) in one body; a 16 MiB list of
	// token ids has about 4 million.
	maxPromptItems = 1 << 23
	// promptScanBudget: bytes examined; past it the body counts a quarter
	// of its bytes.
	promptScanBudget = 64 << 20
)

// role is what a JSON value means to the estimate.
type role uint8

const (
	roleSkip     role = iota // counts nothing
	roleTop                  // the body: must be an object
	roleText                 // prompt, input, a message's content
	roleItem                 // an item of a text list: text, a token id, a list, a content part
	rolePartText             // a content part's "text"
	roleMessages             // the messages list
	roleMessage              // one message
)

// Where the value being parsed stands in its container.
const (
	expValue      uint8 = iota // a value (an array's next item, an object's value)
	expValueOrEnd              // an array's first item or ]
	expKey                     // an object's next key
	expKeyOrEnd                // an object's first key or }
	expColon                   // : after a key
	expCommaOrEnd              // , or the container's end
)

// Lexer states inside a scalar.
const (
	lexBetween uint8 = iota
	lexString
	lexEscape
	lexUnicode
	lexNumber
	lexLiteral
)

type frame struct {
	obj   bool
	role  role  // of the container
	exp   uint8 // what comes next in it
	child role  // of the value after the current key (objects)
	slot  int8  // the body's field the current key names (the body object)
}

// Fields of the body that hold prompt text, as slots: a repeated key
// replaces the earlier value, as vLLM's JSON parser does.
const (
	slotPrompt = iota
	slotInput
	slotMessages
	nSlots
)

// promptScanner estimates prompt tokens from a body fed in pieces.
type promptScanner struct {
	stack    []frame
	lex      uint8
	hexLeft  uint8
	uval     uint16
	lit      string // the rest of true, false or null
	count    bool   // the string being lexed is prompt text
	isKey    bool
	key      [16]byte
	keyLen   int
	keyBad   bool // longer than any key that matters, or not ASCII
	topDone  bool
	failed   bool // not such JSON, or over a cap: a quarter of the bytes
	items    int
	scanned  int64
	cur      int8 // the slot being counted, -1 none
	runes    [nSlots]int64
	ids      [nSlots]int64
	badShape [nSlots]bool // messages that is not a list of objects
}

func newPromptScanner() *promptScanner {
	return &promptScanner{stack: make([]frame, 0, 8), cur: -1}
}

// done reports whether feeding more can change nothing (the scanner gave
// up).
func (s *promptScanner) done() bool { return s.failed }

// tokens is the estimate for a body of total bytes, all fed.
func (s *promptScanner) tokens(total int64) float64 {
	if s.failed || !s.topDone || len(s.stack) > 0 || (s.lex != lexBetween && s.lex != lexNumber) {
		return float64(total) / 4
	}
	n := 0.0
	for i := range nSlots {
		if s.badShape[i] {
			return float64(total) / 4
		}
		n += float64(s.runes[i])/4 + float64(s.ids[i])
	}
	return n
}

func (s *promptScanner) fail() { s.failed = true }

// feed scans the next piece of the body.
func (s *promptScanner) feed(p []byte) {
	if s.failed {
		return
	}
	s.scanned += int64(len(p))
	if s.scanned > promptScanBudget {
		s.fail()
		return
	}
	for i := 0; i < len(p) && !s.failed; {
		switch s.lex {
		case lexString:
			// The hot loop: a run of plain string bytes.
			j := i
			for j < len(p) {
				b := p[j]
				if b == '"' || b == '\\' || b < 0x20 {
					break
				}
				if s.count && b&0xC0 != 0x80 { // a rune's first byte
					s.runes[s.cur]++
				}
				if s.isKey {
					s.keyByte(b)
				}
				j++
			}
			if j == len(p) {
				return
			}
			switch b := p[j]; {
			case b == '"':
				s.lex = lexBetween
				s.endString()
			case b == '\\':
				s.lex = lexEscape
			default:
				s.fail() // a control character in a string
			}
			i = j + 1
		case lexEscape:
			b := p[i]
			i++
			switch b {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.escaped(rune(unescape(b)))
				s.lex = lexString
			case 'u':
				s.lex, s.hexLeft, s.uval = lexUnicode, 4, 0
			default:
				s.fail()
			}
		case lexUnicode:
			d, ok := hexVal(p[i])
			i++
			if !ok {
				s.fail()
				break
			}
			s.uval = s.uval<<4 | uint16(d)
			if s.hexLeft--; s.hexLeft == 0 {
				s.lex = lexString
				if s.uval >= 0xDC00 && s.uval <= 0xDFFF {
					// A surrogate pair's second half: one rune with the first.
					if s.isKey {
						s.keyBad = true
					}
				} else {
					s.escaped(rune(s.uval))
				}
			}
		case lexNumber:
			b := p[i]
			if b >= '0' && b <= '9' || b == '-' || b == '+' || b == '.' || b == 'e' || b == 'E' {
				i++
				break
			}
			s.lex = lexBetween // b is looked at again below
		case lexLiteral:
			if p[i] != s.lit[0] {
				s.fail()
				break
			}
			i++
			if s.lit = s.lit[1:]; s.lit == "" {
				s.lex = lexBetween
			}
		default:
			s.structural(p[i])
			i++
		}
	}
}

// escaped notes one rune written as an escape.
func (s *promptScanner) escaped(r rune) {
	if s.count {
		s.runes[s.cur]++
	}
	if s.isKey {
		if r < 0x80 {
			s.keyByte(byte(r))
		} else {
			s.keyBad = true
		}
	}
}

func (s *promptScanner) keyByte(b byte) {
	if s.keyLen == len(s.key) {
		s.keyBad = true
		return
	}
	s.key[s.keyLen] = b
	s.keyLen++
}

func unescape(b byte) byte {
	switch b {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return b
}

func hexVal(b byte) (byte, bool) {
	switch {
	case b >= '0' && b <= '9':
		return b - '0', true
	case b >= 'a' && b <= 'f':
		return b - 'a' + 10, true
	case b >= 'A' && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}

// structural handles a byte between tokens.
func (s *promptScanner) structural(b byte) {
	if b == ' ' || b == '\t' || b == '\n' || b == '\r' {
		return
	}
	if len(s.stack) == 0 {
		if s.topDone {
			s.fail() // something after the body's value
			return
		}
		s.value(b, roleTop)
		return
	}
	f := &s.stack[len(s.stack)-1]
	switch f.exp {
	case expValue, expValueOrEnd:
		if b == ']' && f.exp == expValueOrEnd {
			s.pop()
			return
		}
		r := f.child
		if !f.obj {
			r = itemRole(f.role)
		}
		f.exp = expCommaOrEnd
		s.value(b, r)
	case expKey, expKeyOrEnd:
		switch {
		case b == '"':
			f.exp = expColon
			s.lex, s.isKey, s.count, s.keyLen, s.keyBad = lexString, true, false, 0, false
		case b == '}' && f.exp == expKeyOrEnd:
			s.pop()
		default:
			s.fail()
		}
	case expColon:
		if b != ':' {
			s.fail()
			return
		}
		f.exp = expValue
	case expCommaOrEnd:
		switch {
		case b == ',' && f.obj:
			f.exp = expKey
		case b == ',':
			f.exp = expValue
		case b == '}' && f.obj, b == ']' && !f.obj:
			s.pop()
		default:
			s.fail()
		}
	}
}

// itemRole is the role of an array's items.
func itemRole(container role) role {
	switch container {
	case roleText, roleItem:
		return roleItem
	case roleMessages:
		return roleMessage
	}
	return roleSkip
}

// value starts a value of role r whose first byte is b.
func (s *promptScanner) value(b byte, r role) {
	if s.items++; s.items > maxPromptItems {
		s.fail()
		return
	}
	if len(s.stack) == 1 && s.stack[0].role == roleTop {
		// A field of the body: count into its slot, afresh.
		s.cur = s.stack[0].slot
		if s.cur >= 0 {
			s.runes[s.cur], s.ids[s.cur], s.badShape[s.cur] = 0, 0, false
		}
	}
	switch b {
	case '{', '[':
		obj := b == '{'
		switch {
		case r == roleTop && !obj:
			s.fail()
		case (r == roleMessages || r == roleMessage) && obj != (r == roleMessage):
			s.badShape[s.cur] = true
		}
		if len(s.stack) >= maxPromptDepth {
			s.fail()
			return
		}
		if obj && r != roleTop && r != roleMessage && r != roleItem {
			r = roleSkip // an object where text is expected counts nothing
		}
		f := frame{obj: obj, role: r, exp: expValueOrEnd, slot: -1}
		if obj {
			f.exp = expKeyOrEnd
		}
		s.stack = append(s.stack, f)
		return
	case '"':
		s.lex, s.isKey = lexString, false
		s.count = r == roleText || r == roleItem || r == rolePartText
	case 't', 'f', 'n':
		s.lex, s.lit = lexLiteral, "rue"
		if b == 'f' {
			s.lit = "alse"
		} else if b == 'n' {
			s.lit = "ull"
		}
		if b == 'n' {
			if r == roleTop {
				s.fail()
			}
			s.scalarDone()
			return
		}
	default:
		if b != '-' && (b < '0' || b > '9') {
			s.fail()
			return
		}
		s.lex = lexNumber
		if r == roleItem {
			s.ids[s.cur]++
		}
	}
	switch r {
	case roleTop:
		s.fail()
	case roleMessages, roleMessage:
		s.badShape[s.cur] = true
	}
	if b != '"' {
		s.scalarDone()
	}
}

// scalarDone: a value that is not a container started; if it is the body's
// whole value, the body is done when it ends.
func (s *promptScanner) scalarDone() {
	if len(s.stack) == 0 {
		s.topDone = true
	}
}

// endString ends a string: a key sets the role of its value.
func (s *promptScanner) endString() {
	if !s.isKey {
		s.scalarDone()
		return
	}
	s.isKey = false
	f := &s.stack[len(s.stack)-1]
	key := ""
	if !s.keyBad {
		key = string(s.key[:s.keyLen])
	}
	f.child, f.slot = roleSkip, -1
	switch f.role {
	case roleTop:
		switch key {
		case "prompt":
			f.child, f.slot = roleText, slotPrompt
		case "input":
			f.child, f.slot = roleText, slotInput
		case "messages":
			f.child, f.slot = roleMessages, slotMessages
		}
	case roleMessage:
		if key == "content" {
			f.child = roleText
		}
	case roleItem:
		if key == "text" {
			f.child = rolePartText
		}
	}
}

func (s *promptScanner) pop() {
	s.stack = s.stack[:len(s.stack)-1]
	if len(s.stack) == 0 {
		s.topDone = true
	}
}

// PromptTokens estimates the prompt tokens of an OpenAI-style request
// body: the text of "prompt", "input" and each message's "content"
// (strings, lists of strings, {"type": "text", "text": …} parts) at 4
// characters a token, token ids at one each. Other content parts (images,
// audio: base64 data) count nothing. A body that is not such JSON, nests
// deeper than 64 levels or holds more than 8 Mi values counts a quarter of
// its bytes.
func PromptTokens(body []byte) float64 {
	s := newPromptScanner()
	s.feed(body)
	return s.tokens(int64(len(body)))
}
