package vllmlog

import (
	"bufio"
	"strings"
	"testing"
)

func split(s *Splitter, chunks ...string) []string {
	var got []string
	emit := func(b []byte) { got = append(got, string(b)) }
	for _, c := range chunks {
		s.Write([]byte(c), emit)
	}
	s.Flush(emit)
	return got
}

func TestSplitterCutsAtNewlineAndCarriageReturn(t *testing.T) {
	got := split(&Splitter{},
		"Loading safetensors checkpoint shards:   0% Completed\rLoading safetensors checkpoint shards: 50% Com",
		"pleted\r\nINFO:     Application startup complete.\n\n\npartial")
	want := []string{
		"Loading safetensors checkpoint shards:   0% Completed",
		"Loading safetensors checkpoint shards: 50% Completed",
		"INFO:     Application startup complete.",
		"partial",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestSplitterBoundsALine(t *testing.T) {
	got := split(&Splitter{Max: 8}, strings.Repeat("x", 20), "y\nnext\n", "0123456789")
	want := []string{"xxxxxxxx", "next", "01234567"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestScanLines(t *testing.T) {
	sc := bufio.NewScanner(strings.NewReader("a 0%\ra 50%\r\nb\nlast"))
	sc.Split(ScanLines)
	var got []string
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if want := []string{"a 0%", "a 50%", "", "b", "last"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q want %q", got, want)
	}
}

// Issue 41: what came before a line is its provenance. vLLM's formatter
// continues a record after "\r\n" (the header repeated); a lone "\r" is
// tqdm's rewrite, or a "\r" a client put inside a message: neither starts
// anything vLLM printed.
func TestSplitterLineStarts(t *testing.T) {
	type got struct {
		line  string
		start LineStart
	}
	in := "A first\n" +
		"H1 EngineCore encountered a fatal error.\r\nH1 Traceback (most recent call last):\r\nH1 TimeoutError\n" +
		"bar 10%\rbar 100%\n" +
		"H2 Error with model abc\rFree memory on device\r\nH2 next\n" +
		"\n\nlast\r\r\ncont"
	want := []got{{"A first", StartFresh},
		{"H1 EngineCore encountered a fatal error.", StartFresh}, {"H1 Traceback (most recent call last):", StartCRLF}, {"H1 TimeoutError", StartCRLF},
		{"bar 10%", StartFresh}, {"bar 100%", StartCR},
		{"H2 Error with model abc", StartFresh}, {"Free memory on device", StartCR}, {"H2 next", StartCRLF},
		{"last", StartFresh}, {"cont", StartCRLF}}
	// Whole, and one byte at a time (a write may end anywhere).
	for _, step := range []int{len(in), 1, 3} {
		var s Splitter
		var out []got
		emit := func(l []byte, st LineStart) { out = append(out, got{string(l), st}) }
		for i := 0; i < len(in); i += step {
			s.WriteStart([]byte(in[i:min(len(in), i+step)]), emit)
		}
		s.FlushStart(emit)
		if len(out) != len(want) {
			t.Fatalf("step %d: %d lines %v, want %d", step, len(out), out, len(want))
		}
		for i := range want {
			if out[i] != want[i] {
				t.Errorf("step %d: line %d = %+v, want %+v", step, i, out[i], want[i])
			}
		}
	}
}

// FuzzSplitterStarts: however the stream is cut into writes, the lines
// and what came before each are those of a reading of the whole stream at
// once (the oracle below, written the plain way).
func FuzzSplitterStarts(f *testing.F) {
	f.Add("a\r\nb\rc\n\nd\r\r\ne", uint8(1))
	f.Add("\r\n\r\nx", uint8(2))
	f.Fuzz(func(t *testing.T, in string, step uint8) {
		type got struct {
			line  string
			start LineStart
		}
		var want []got
		start, cr := StartFresh, false
		cur := ""
		for i := 0; i < len(in); i++ {
			switch c := in[i]; c {
			case '\r', '\n':
				if cur != "" {
					want = append(want, got{cur, start})
					cur = ""
					start, cr = StartFresh, c == '\r'
					if cr {
						start = StartCR
					}
					continue
				}
				switch {
				case c == '\n' && cr:
					start, cr = StartCRLF, false
				case c == '\n':
					start = StartFresh
				default:
					start, cr = StartCR, true
				}
			default:
				cur += in[i : i+1]
				cr = false
			}
		}
		if cur != "" {
			want = append(want, got{cur, start})
		}
		n := int(step)%7 + 1
		var s Splitter
		var out []got
		emit := func(l []byte, st LineStart) { out = append(out, got{string(l), st}) }
		for i := 0; i < len(in); i += n {
			s.WriteStart([]byte(in[i:min(len(in), i+n)]), emit)
		}
		s.FlushStart(emit)
		if len(out) != len(want) {
			t.Fatalf("%q by %d: %v, want %v", in, n, out, want)
		}
		for i := range want {
			if out[i] != want[i] {
				t.Fatalf("%q by %d: line %d %+v, want %+v", in, n, i, out[i], want[i])
			}
		}
	})
}
