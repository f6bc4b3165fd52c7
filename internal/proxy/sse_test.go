package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// cutReader yields its data, then fails as a connection cut by vLLM would.
type cutReader struct{ r io.Reader }

func (c *cutReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}
func (c *cutReader) Close() error { return nil }

// FuzzSSEBodyCut: whatever vLLM sent before dying passes through intact,
// followed by the error event as an event of its own.
func FuzzSSEBodyCut(f *testing.F) {
	for _, s := range []string{"", "data: {\"n\":0}\n\n", "data: {\"n\"", "data: x\n", "data: x\r\n\r\n", "\n\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, sent []byte) {
		b := &sseBody{rc: &cutReader{bytes.NewReader(sent)}, ctx: context.Background(), log: zap.NewNop(), lastNL: 2}
		out, err := io.ReadAll(b)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if !bytes.HasPrefix(out, sent) || !bytes.HasSuffix(out, sseStreamCut) {
			t.Fatalf("out %q: want the sent bytes, then the error event", out)
		}
		before := string(out[:len(out)-len(sseStreamCut)])
		// At the start of the stream (nothing but blank lines) or after a
		// blank line: either way a parser sees a new event.
		if strings.Trim(before, "\n") != "" && !strings.HasSuffix(before, "\n\n") {
			t.Fatalf("the error event does not start an event of its own: %q", out)
		}
	})
}

func TestSSEBodyLeavesClientCancelAlone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := &sseBody{rc: &cutReader{strings.NewReader("data: 1\n\n")}, ctx: ctx, log: zap.NewNop(), lastNL: 2}
	out, err := io.ReadAll(b)
	if !errors.Is(err, io.ErrUnexpectedEOF) || bytes.Contains(out, sseStreamCut) {
		t.Fatalf("client gone: %q, %v; want the error itself and no event", out, err)
	}
}
