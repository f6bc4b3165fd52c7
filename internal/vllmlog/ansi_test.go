package vllmlog

import (
	"bytes"
	"strings"
	"testing"
)

var stripCases = []struct{ in, want string }{
	{"plain", "plain"},
	{"", ""},
	{"\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO x", "(APIServer pid=1) INFO x"},
	{"\x1b[0m", ""},
	{"a\x1b[?25lb", "ab"},                  // private parameter
	{"a\x1b[38;5;208mb", "ab"},             // 256 colours
	{"hi\x1b(B", "hi"},                     // nF: charset designation, three bytes (policy made "hiB")
	{"a\x1b(Bb", "ab"},                     // the same mid-line
	{"a\x1b)0b", "ab"},                     // G1 designation
	{"a\x1b$)Cb", "ab"},                    // two intermediates
	{"\x1b]0;title\x07text", "text"},       // OSC ended by BEL
	{"\x1b]8;;http://x\x1b\\link", "link"}, // OSC ended by ST (supervisor kept the payload)
	{"a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"},
	{"a\x1bPq#0\x1b\\b", "ab"}, // DCS
	{"a\x1b_app\x07b", "ab"},   // APC
	{"a\x1bMb", "ab"},          // Fe two-byte: reverse index
	{"a\x1b7b\x1b8", "ab"},     // Fp: save and restore cursor
	{"a\x1bcb", "ab"},          // Fs: reset
	{"trailing \x1b", "trailing "},
	{"\x1b", ""},
	{"\x1b\x1b[31mx", "x"},
	{"\x1b[", ""},                  // unterminated CSI
	{"a\x1b[1;3", "a"},             // unterminated CSI at the end
	{"a\x1b[1;3\nb", "a\nb"},       // malformed CSI: the text after it survives
	{"a\x1b]0;title", "a"},         // unterminated OSC runs to the end
	{"a\x1b]0;t\x1b[1mb", "ab"},    // OSC cut short by another escape
	{"a\x1b(", "a"},                // unterminated nF
	{"a\x1b\xc3\xa9", "a\xc3\xa9"}, // stray ESC before UTF-8: the text stays
	{"a\x1b\tb", "a\tb"},
}

func TestStripANSI(t *testing.T) {
	for _, c := range stripCases {
		if got := StripANSI(c.in); got != c.want {
			t.Errorf("StripANSI(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := string(AppendStripANSI([]byte("x"), []byte(c.in))); got != "x"+c.want {
			t.Errorf("AppendStripANSI(%q) = %q, want %q", c.in, got, "x"+c.want)
		}
	}
}

func TestStripANSIWithoutEscapeDoesNotAllocate(t *testing.T) {
	s := strings.Repeat("(EngineCore_0 pid=42) INFO 10-14 12:00:00 [core.py:1] hi ", 4)
	if n := testing.AllocsPerRun(100, func() { _ = StripANSI(s) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
	buf := make([]byte, 0, 512)
	b := []byte("\x1b[1;36m(EngineCore_0 pid=42)\x1b[0;0m hi")
	if n := testing.AllocsPerRun(100, func() { buf = AppendStripANSI(buf[:0], b) }); n != 0 {
		t.Fatalf("AppendStripANSI into room: %v allocations", n)
	}
}

// FuzzStripANSI checks the properties every caller relies on. The seeds are
// the inputs on which the two functions it replaced disagreed.
func FuzzStripANSI(f *testing.F) {
	for _, c := range stripCases {
		f.Add(c.in)
	}
	for _, s := range []string{"hi\x1b(B", "\x1b]0;title\x07text", "\x1b]8;;http://x\x1b\\link", "\x1b[1;3", "\x1b]0;never ended", "end\x1b", "\x1b[\x1b]\x1b(\x1b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := StripANSI(s)
		if strings.IndexByte(out, esc) >= 0 {
			t.Fatalf("StripANSI(%q) = %q holds an ESC", s, out)
		}
		if len(out) > len(s) {
			t.Fatalf("StripANSI(%q) = %q is longer", s, out)
		}
		if again := StripANSI(out); again != out {
			t.Fatalf("not idempotent: %q → %q → %q", s, out, again)
		}
		if strings.IndexByte(s, esc) < 0 && out != s {
			t.Fatalf("text without ESC changed: %q → %q", s, out)
		}
		if b := AppendStripANSI(nil, []byte(s)); !bytes.Equal(b, []byte(out)) {
			t.Fatalf("AppendStripANSI(%q) = %q, StripANSI %q", s, b, out)
		}
	})
}
