package supervisor

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

func newTestOutput(t *testing.T) *output {
	sink := newLogSink(zap.NewNop())
	t.Cleanup(sink.close)
	return newOutput(sink, 4, time.Now())
}

func TestStreamWriterSplitsOnNewlineAndCarriageReturn(t *testing.T) {
	o := newTestOutput(t)
	w := o.writer("stderr")
	fmt.Fprint(w, "Loading safetensors checkpoint shards:   0% Completed\rLoading safetensors checkpoint shards: 50% Com")
	fmt.Fprint(w, "pleted\r\nINFO:     Application startup complete.\npartial")
	w.Close()
	lines := o.ring.snapshot()
	var got []string
	for _, l := range lines {
		got = append(got, fmt.Sprintf("%d:%s:%s", l.N, l.Stream, l.Text))
	}
	want := []string{
		"1:stderr:Loading safetensors checkpoint shards:   0% Completed",
		"2:stderr:Loading safetensors checkpoint shards: 50% Completed",
		"3:stderr:INFO:     Application startup complete.",
		"4:stderr:partial",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("lines\n got %q\nwant %q", got, want)
	}
	select {
	case <-o.startupEnd:
	default:
		t.Fatal("Application startup complete. was not signalled")
	}
	if o.Phase() != "server" {
		t.Fatalf("phase %q, want server", o.Phase())
	}
}

func TestStreamWriterStripsEscapes(t *testing.T) {
	o := newTestOutput(t)
	w := o.writer("stdout")
	fmt.Fprint(w, "\x1b[1;36m(EngineCore_0 pid=42)\x1b[0;0m INFO 10-14 12:00:00 [core.py:1] hi\x1b(B\n")
	fmt.Fprint(w, "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\n\x1b[0m\n")
	lines := o.ring.snapshot()
	if len(lines) != 2 || lines[0].Text != "(EngineCore_0 pid=42) INFO 10-14 12:00:00 [core.py:1] hi" || lines[1].Text != "link" {
		t.Fatalf("ring %+v", lines)
	}
}

func TestRingKeepsTheLastLines(t *testing.T) {
	o := newTestOutput(t)
	w := o.writer("stdout")
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(w, "line %d\n", i)
	}
	lines := o.ring.snapshot()
	if len(lines) != 4 || lines[0].N != 7 || lines[3].Text != "line 10" {
		t.Fatalf("ring %+v", lines)
	}
}

func TestOverlongLineIsTruncatedNotBuffered(t *testing.T) {
	o := newTestOutput(t)
	w := o.writer("stdout")
	w.Write([]byte(strings.Repeat("x", 3*maxLine)))
	w.Write([]byte("y\nnext\n"))
	lines := o.ring.snapshot()
	if len(lines) != 2 || len(lines[0].Text) != maxLine || lines[1].Text != "next" {
		t.Fatalf("got %d lines, first %d bytes", len(lines), len(lines[0].Text))
	}
}

func TestSlowSinkDropsInsteadOfBlocking(t *testing.T) {
	// A sink whose queue is never drained: writes must still return.
	sink := &logSink{log: zap.NewNop(), ch: make(chan emitted, 2), done: make(chan struct{})}
	o := newOutput(sink, 8, time.Now())
	w := o.writer("stdout")
	for i := 0; i < 100; i++ {
		fmt.Fprintf(w, "line %d\n", i)
	}
	if d := sink.dropped.Load(); d != 98 {
		t.Fatalf("dropped %d, want 98", d)
	}
}

func BenchmarkLogPump(b *testing.B) {
	sink := newLogSink(zap.NewNop())
	defer sink.close()
	o := newOutput(sink, 1000, time.Now())
	w := o.writer("stdout")
	chunk := []byte(strings.Repeat("\x1b[36m(EngineCore_0 pid=42)\x1b[0m INFO 12-02 09:31:24 [core.py:123] Avg prompt throughput: 1234.5 tokens/s, Running: 12 reqs\n", 512))
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.Write(chunk)
	}
}

// The pump masks API keys, drops the access lines of the guard's own
// connections (not as progress either) and keeps a client's.
func TestLineFilter(t *testing.T) {
	f := &lineFilter{secrets: []string{"sk-9"}, own: func(host string, port int) bool { return port == 5555 }}
	if text, drop := f.apply("(APIServer pid=1) INFO 01-01 [utils.py:1] non-default args: {'api_key': ['sk-9']}"); drop || strings.Contains(text, "sk-9") {
		t.Fatalf("masking: %q %v", text, drop)
	}
	if _, drop := f.apply(`(APIServer pid=1) INFO:     127.0.0.1:5555 - "GET /metrics HTTP/1.1" 200 OK`); !drop {
		t.Fatal("own access line kept")
	}
	if _, drop := f.apply(`(APIServer pid=1) INFO:     127.0.0.1:6666 - "POST /v1/completions HTTP/1.1" 200 OK`); drop {
		t.Fatal("a client's access line dropped")
	}
}

// TestTasksOnlyFromVLLMsLineBeforeReady: the tasks come from vLLM's own
// logger line while it starts; a client's access line or logged prompt
// holding the same words never sets them, nor does any line once vLLM is
// ready (issue 24 item 2).
func TestTasksOnlyFromVLLMsLineBeforeReady(t *testing.T) {
	var tasks atomic.Pointer[[]string]
	sink := newLogSink(zap.NewNop())
	defer sink.close()
	sink.filter = &lineFilter{tasks: &tasks}
	o := newOutput(sink, 100, time.Now())
	w := o.writer("stdout")
	w.Write([]byte(`(APIServer pid=1) INFO:     127.0.0.1:6666 - "GET /v1/models?Supported_tasks:[embed] HTTP/1.1" 200 OK` + "\n"))
	w.Write([]byte(`(APIServer pid=1) INFO 12-02 09:00:00 [logger.py:41] Received request cmpl-1: prompt: "Supported tasks: ['classify']"` + "\n"))
	if got := tasks.Load(); got != nil {
		t.Fatalf("a client's text set the tasks: %q", *got)
	}
	w.Write([]byte("(APIServer pid=1) INFO 12-02 09:00:00 [api_server.py:1805] Supported tasks: ['generate']\n"))
	if got := tasks.Load(); got == nil || strings.Join(*got, ",") != "generate" {
		t.Fatalf("tasks %v, want generate from vLLM's line", got)
	}
	o.loaded.Store(true)
	w.Write([]byte("(APIServer pid=1) INFO 12-02 09:00:00 [api_server.py:1805] Supported_tasks: ['embed']\n"))
	if got := tasks.Load(); strings.Join(*got, ",") != "generate" {
		t.Fatalf("tasks %q changed after ready", *got)
	}
}

// Issue 41: the ring keeps what came before each line, the provenance the
// classifier reads: vLLM's formatter continues a record after "\r\n", and
// a lone "\r" (tqdm, or one inside a client's text) starts nothing.
func TestRingKeepsWhatCameBeforeEachLine(t *testing.T) {
	o := newTestOutput(t)
	w := o.writer("stdout")
	fmt.Fprint(w, "(EngineCore_DP0 pid=7) ERROR 12-06 07:00:00 [core.py:2056] Unexpected error pre-processing request x\r")
	fmt.Fprint(w, "\n(EngineCore_DP0 pid=7) ERROR 12-06 07:00:00 [core.py:2056] EngineCore encountered a fatal error.\n")
	fmt.Fprint(w, "a\rFree memory on device\n")
	w.Close()
	var got []string
	for _, l := range o.ring.snapshot() {
		got = append(got, fmt.Sprintf("%d:%d", l.N, l.Start))
	}
	want := fmt.Sprintf("1:%d|2:%d|3:%d|4:%d", vllmlog.StartFresh, vllmlog.StartCRLF, vllmlog.StartFresh, vllmlog.StartCR)
	if strings.Join(got, "|") != want {
		t.Fatalf("starts %v, want %s", got, want)
	}
}
