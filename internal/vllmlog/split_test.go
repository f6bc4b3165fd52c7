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

func TestLastRewrite(t *testing.T) {
	for in, want := range map[string]string{
		"a 50%\rb 100%\r\n": "b 100%",
		"plain":             "plain",
		"a\rb":              "b",
	} {
		if got := LastRewrite(in); got != want {
			t.Errorf("LastRewrite(%q) = %q, want %q", in, got, want)
		}
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
