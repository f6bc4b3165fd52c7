package supervisor

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// maxLine bounds one stored line: vLLM can print megabyte lines (a dumped
// config, a flood); the rest of such a line is dropped.
const maxLine = 16 << 10

// emitQueue bounds the lines waiting for the log sink. When the sink (a slow
// terminal, journald) falls behind, lines are dropped and counted: vLLM must
// never block on its stdout.
const emitQueue = 8192

// emitRate bounds the vLLM lines re-emitted per second (a burst of as many
// is allowed). A vLLM flooding its log at 100 MB/s would otherwise have the
// guard spend a core encoding lines nobody can read, and starve the pump
// that keeps vLLM from blocking; the excess is dropped and counted. Every
// line still reaches the ring kept for incidents and the classifier.
const emitRate = 20000

type emitted struct {
	stream string
	pid    int
	text   string
}

// logSink re-emits vLLM's lines through zap from one goroutine, so a slow
// sink costs dropped lines, never a blocked child.
type logSink struct {
	filter  *lineFilter // nil: every line as printed
	log     *zap.Logger
	ch      chan emitted
	levels  levels // used by run only
	dropped atomic.Uint64
	done    chan struct{}

	// a token bucket of emitRate lines a second, refilled per second
	mu       sync.Mutex
	tokens   int
	refilled time.Time
}

// admit takes one emission token; false means drop the line.
func (s *logSink) admit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens > 0 {
		s.tokens--
		return true
	}
	if now := time.Now(); now.Sub(s.refilled) >= time.Second {
		s.refilled, s.tokens = now, emitRate-1
		return true
	}
	return false
}

func newLogSink(log *zap.Logger) *logSink {
	s := &logSink{log: log.Named("vllm"), ch: make(chan emitted, emitQueue), done: make(chan struct{})}
	go s.run()
	return s
}

func (s *logSink) run() {
	defer close(s.done)
	var reported uint64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case e, ok := <-s.ch:
			if !ok {
				s.reportDrops(&reported)
				return
			}
			fields := []zap.Field{zap.String("stream", e.stream), zap.Int("pid", e.pid)}
			switch s.levels.of(e.stream, e.text) {
			case zapcore.ErrorLevel:
				s.log.Error(e.text, fields...)
			case zapcore.WarnLevel:
				s.log.Warn(e.text, fields...)
			default:
				s.log.Info(e.text, fields...)
			}
		case <-tick.C:
			s.reportDrops(&reported)
		}
	}
}

func (s *logSink) reportDrops(reported *uint64) {
	if d := s.dropped.Load(); d > *reported {
		s.log.Warn("vLLM log lines dropped: vLLM writes faster than the log sink takes (or over 20000 lines/s); vLLM was not blocked",
			zap.Uint64("dropped", d-*reported), zap.Uint64("dropped_total", d))
		*reported = d
	}
}

func (s *logSink) close() {
	close(s.ch)
	<-s.done
}

// lineRing keeps the last lines of one run of vLLM for the classifier and
// incidents.
type lineRing struct {
	mu    sync.Mutex
	lines []cause.Line
	next  int
	n     int // lines seen in total
}

func newLineRing(size int) *lineRing { return &lineRing{lines: make([]cause.Line, 0, size)} }

func (r *lineRing) add(stream, text string, start vllmlog.LineStart) {
	r.mu.Lock()
	r.n++
	l := cause.Line{N: r.n, Stream: stream, Text: text, Start: start}
	if len(r.lines) < cap(r.lines) {
		r.lines = append(r.lines, l)
	} else {
		r.lines[r.next] = l
		r.next = (r.next + 1) % len(r.lines)
	}
	r.mu.Unlock()
}

// snapshot returns the kept lines, oldest first.
func (r *lineRing) snapshot() []cause.Line {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]cause.Line, 0, len(r.lines))
	out = append(out, r.lines[r.next:]...)
	return append(out, r.lines[:r.next]...)
}

// output is what one run of vLLM printed, as the supervisor needs it.
type output struct {
	sink       *logSink
	ring       *lineRing
	pid        atomic.Int64
	lastLine   monoTime // when the last line came: load progress
	phase      atomic.Pointer[string]
	bar        atomic.Pointer[status.LoadProgress] // the last load progress bar (nil: none yet)
	loaded     atomic.Bool                         // vLLM is ready: load phases are no longer looked for
	progress   chan struct{}                       // a new load phase was recognised (coalesced)
	startupEnd chan struct{}                       // "Application startup complete." seen (coalesced)
	// serverUp: this run printed a line of its server's start ("Starting
	// vLLM API server", uvicorn's lines): only then is an answer on its
	// port its own.
	serverUp atomic.Bool
	// serverDone: the API server printed uvicorn's "Finished server
	// process [its pid]": it is exiting, its port closed.
	serverDone atomic.Bool
}

// newOutput is a run's output, its last line's time at (the launch).
func newOutput(sink *logSink, ringSize int, at time.Time) *output {
	o := &output{sink: sink, ring: newLineRing(ringSize),
		progress: make(chan struct{}, 1), startupEnd: make(chan struct{}, 1)}
	o.lastLine.Store(at)
	return o
}

// Phase is the load phase recognised last ("" before any).
func (o *output) Phase() string {
	if p := o.phase.Load(); p != nil {
		return *p
	}
	return ""
}

// Bar is the last load progress bar vLLM printed (Total 0: none yet).
func (o *output) Bar() status.LoadProgress {
	if b := o.bar.Load(); b != nil {
		return *b
	}
	return status.LoadProgress{}
}

// noteBar keeps a line that is a state of a load's progress bar, and says
// whether it is a new state (tqdm prints the last one again at close).
func (o *output) noteBar(text string) bool {
	b, ok := vllmlog.LoadBar(text)
	if !ok {
		return false
	}
	p := status.LoadProgress{Phase: b.Phase, Unit: b.Unit, Done: b.Done, Total: b.Total, Percent: b.Percent}
	if old := o.bar.Load(); old != nil && *old == p {
		return false
	}
	o.bar.Store(&p)
	return true
}

// streamWriter splits one stream of vLLM output into lines on \n and \r.
// Its Write never blocks on anything but a short mutex.
type streamWriter struct {
	o     *output
	name  string
	split vllmlog.Splitter
	clean []byte // the line without its escapes, reused
}

func (o *output) writer(stream string) *streamWriter {
	return &streamWriter{o: o, name: stream, split: vllmlog.Splitter{Max: maxLine}}
}

func (w *streamWriter) Write(b []byte) (int, error) {
	w.split.WriteStart(b, w.line)
	return len(b), nil
}

// Close emits a last line that had no newline.
func (w *streamWriter) Close() error {
	w.split.FlushStart(w.line)
	return nil
}

// lineFilter is how the pump treats vLLM's lines for one guard.
type lineFilter struct {
	// secrets (API keys) are masked in every line before it is kept or
	// logged: vLLM prints its non-default arguments, the key included.
	secrets []string
	// own says whether a client address is one of the guard's own
	// connections: uvicorn's access lines for them are dropped (neither
	// logged, kept nor counted as load progress).
	own func(host string, port int) bool
	// tasks receives vLLM's "Supported tasks: [...]" (older:
	// "Supported_tasks"), from its own logger only, before ready.
	tasks *atomic.Pointer[[]string]
}

// apply masks secrets and says whether to drop the line as the guard's
// own request.
func (f *lineFilter) apply(text string) (string, bool) {
	text = vllmargs.MaskText(text, f.secrets)
	if f.own != nil && strings.Contains(text, "HTTP/") {
		if a, ok := vllmlog.ParseAccess(text); ok && f.own(a.Client, a.Port) {
			return text, true
		}
	}
	return text, false
}

// noteTasks stores the tasks of vLLM's "Supported tasks: [...]" line. It
// is called only before vLLM is ready: the line is printed once while the
// server starts, and a client's text later (an access line, a logged
// prompt) must never change what the guard probes.
func (f *lineFilter) noteTasks(text string) {
	if f.tasks == nil || !strings.Contains(text, "upported") {
		return
	}
	if ts := vllmlog.SupportedTasks(text); len(ts) > 0 {
		f.tasks.Store(&ts)
	}
}

// loading notes what a line says while vLLM loads: its tasks, its load
// phase (its server's start among them), the end of its startup.
func (o *output) loading(text string) {
	if f := o.sink.filter; f != nil {
		f.noteTasks(text)
	}
	ph := vllmlog.LoadPhase(text)
	if ph == vllmlog.PhaseServer {
		o.serverUp.Store(true)
	}
	newBar := o.noteBar(text)
	if ph != "" && ph != o.Phase() || newBar {
		if ph != "" {
			o.phase.Store(&ph)
		}
		select {
		case o.progress <- struct{}{}:
		default:
		}
	}
	if vllmlog.IsStartupComplete(text) {
		select {
		case o.startupEnd <- struct{}{}:
		default:
		}
	}
}

func (w *streamWriter) line(b []byte, start vllmlog.LineStart) {
	w.clean = vllmlog.AppendStripANSI(w.clean[:0], b)
	if len(bytes.TrimSpace(w.clean)) == 0 {
		return
	}
	text := string(w.clean)
	o := w.o
	if f := o.sink.filter; f != nil {
		var own bool
		if text, own = f.apply(text); own {
			return
		}
	}
	o.lastLine.Store(time.Now())
	o.ring.add(w.name, text, start)
	if strings.HasPrefix(text, "INFO:") {
		if pid, ok := vllmlog.ServerFinished(text); ok && pid == int(o.pid.Load()) {
			o.serverDone.Store(true)
		}
	}
	// Load phases matter only while loading; a flood after ready skips the
	// matching.
	if !o.loaded.Load() {
		o.loading(text)
	}
	if !o.sink.admit() {
		o.sink.dropped.Add(1)
		return
	}
	select {
	case o.sink.ch <- emitted{stream: w.name, pid: int(o.pid.Load()), text: text}:
	default:
		o.sink.dropped.Add(1)
	}
}
