// Package logging owns the guard's log: the zap logger every part writes
// to (console, JSON, or native journal entries under journald), the level a
// reload changes, and what may reach the log at all (secrets masked, control
// characters escaped, invalid UTF-8 replaced) for the guard's lines and
// vLLM's alike.
package logging

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/coreos/go-systemd/v22/journal"
	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/vllm-guard/vllm-guard/internal/redact"
)

// logLevel is the guard's log level; a config reload changes it.
var logLevel = zap.NewAtomicLevel()

// SetLevel changes the level of every logger New made (a config reload).
func SetLevel(level string) error { return logLevel.UnmarshalText([]byte(level)) }

// New builds the guard's logger. format "auto": native journal
// entries when stderr is the journal (journal.go), console lines on a
// terminal, JSON otherwise. A format named in the config is written to
// stderr as it is, under journald without timestamps of our own (the
// journal stamps every line already).
func New(level, format string) (*zap.Logger, error) {
	journald, _ := journal.StderrIsJournalStream()
	if journald && (format == "auto" || format == "") {
		return newJournalLogger(zapcore.Lock(os.Stderr), level, journal.Send)
	}
	return newLoggerTo(zapcore.Lock(os.Stderr), level, format, isTerminal(os.Stderr), journald)
}

// newJournalLogger writes native journal entries with send, and console
// lines to w for any entry the journal refuses.
func newJournalLogger(w zapcore.WriteSyncer, level string, send journalSend) (*zap.Logger, error) {
	fallback, err := newLoggerTo(w, level, "console", false, true)
	if err != nil {
		return nil, err
	}
	return zap.New(&journalCore{LevelEnabler: logLevel, send: send, fallback: fallback.Core()}), nil
}

// newLoggerTo is New writing to w, for tests.
func newLoggerTo(w zapcore.WriteSyncer, level, format string, terminal, journald bool) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("[log] level %q: %w", level, err)
	}
	if format == "auto" || format == "" {
		format = "json"
		if terminal || journald {
			format = "console"
		}
	}
	var enc zapcore.EncoderConfig
	var encoder zapcore.Encoder
	switch format {
	case "console":
		enc = zap.NewDevelopmentEncoderConfig()
		enc.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000")
		enc.CallerKey = ""
		enc.StacktraceKey = ""
		if journald {
			enc.TimeKey = ""
		}
		encoder = zapcore.NewConsoleEncoder(enc)
	default:
		enc = zap.NewProductionEncoderConfig()
		enc.EncodeTime = zapcore.ISO8601TimeEncoder
		enc.CallerKey = ""
		enc.StacktraceKey = ""
		if journald {
			enc.TimeKey = ""
		}
		encoder = zapcore.NewJSONEncoder(enc)
	}
	logLevel.SetLevel(lvl)
	core := zapcore.NewCore(cleanEncoder{encoder}, w, logLevel)
	return zap.New(core), nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// cleanEncoder makes every message and string field safe to write before
// the real encoder sees it: secrets masked (internal/redact), invalid UTF-8
// replaced by U+FFFD, and control characters escaped. vLLM's lines reach
// the log as messages: without this, the console encoder wrote them raw,
// and a NUL or a newline in one split it into journal entries that read as
// the guard's own, and an API key in vLLM's `non-default args` line went
// to the journal as it was.
type cleanEncoder struct{ zapcore.Encoder }

func (e cleanEncoder) Clone() zapcore.Encoder { return cleanEncoder{e.Encoder.Clone()} }

func (e cleanEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	ent.Message = clean(ent.Message)
	ent.LoggerName = clean(ent.LoggerName)
	out := make([]zapcore.Field, len(fields))
	for i, f := range fields {
		out[i] = cleanField(f)
	}
	return e.Encoder.EncodeEntry(ent, out)
}

// The fields of logger.With(...) are added to the encoder itself.
func (e cleanEncoder) AddString(k, v string)            { e.Encoder.AddString(k, clean(v)) }
func (e cleanEncoder) AddByteString(k string, v []byte) { e.Encoder.AddString(k, clean(string(v))) }
func (e cleanEncoder) AddArray(k string, a zapcore.ArrayMarshaler) error {
	return e.Encoder.AddArray(k, cleanArray{a})
}
func (e cleanEncoder) AddObject(k string, o zapcore.ObjectMarshaler) error {
	return e.Encoder.AddObject(k, cleanObject{o})
}
func (e cleanEncoder) AddReflected(k string, v any) error {
	e.Encoder.AddString(k, cleanReflected(v))
	return nil
}

// cleanField returns f with its text cleaned; numbers, times and the like
// pass as they are.
func cleanField(f zapcore.Field) zapcore.Field {
	switch f.Type {
	case zapcore.StringType:
		f.String = clean(f.String)
	case zapcore.ByteStringType:
		if b, ok := f.Interface.([]byte); ok {
			return zap.String(f.Key, clean(string(b)))
		}
	case zapcore.ErrorType:
		if err, ok := f.Interface.(error); ok {
			return zap.String(f.Key, clean(err.Error()))
		}
	case zapcore.StringerType:
		return zap.String(f.Key, clean(fmt.Sprint(f.Interface))) // fmt reports a panicking String as text
	case zapcore.ArrayMarshalerType:
		if a, ok := f.Interface.(zapcore.ArrayMarshaler); ok {
			f.Interface = cleanArray{a}
		}
	case zapcore.ObjectMarshalerType, zapcore.InlineMarshalerType:
		if o, ok := f.Interface.(zapcore.ObjectMarshaler); ok {
			f.Interface = cleanObject{o}
		}
	case zapcore.ReflectType:
		return zap.String(f.Key, cleanReflected(f.Interface))
	}
	return f
}

func cleanReflected(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return clean(fmt.Sprint(v))
	}
	return clean(string(b))
}

type cleanArray struct{ zapcore.ArrayMarshaler }

func (a cleanArray) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	return a.ArrayMarshaler.MarshalLogArray(&cleanArrayEncoder{ArrayEncoder: enc})
}

// cleanArrayEncoder cleans each string of an array; those after a secret
// flag (an argv's "--api-key", "X", "Y") are masked whole.
type cleanArrayEncoder struct {
	zapcore.ArrayEncoder
	argv redact.ArgMasker
}

func (e *cleanArrayEncoder) AppendString(v string) {
	e.ArrayEncoder.AppendString(clean(e.argv.Next(v)))
}
func (e *cleanArrayEncoder) AppendByteString(v []byte) { e.AppendString(string(v)) }
func (e *cleanArrayEncoder) AppendArray(a zapcore.ArrayMarshaler) error {
	return e.ArrayEncoder.AppendArray(cleanArray{a})
}
func (e *cleanArrayEncoder) AppendObject(o zapcore.ObjectMarshaler) error {
	return e.ArrayEncoder.AppendObject(cleanObject{o})
}
func (e *cleanArrayEncoder) AppendReflected(v any) error {
	e.AppendString(cleanReflected(v))
	return nil
}

type cleanObject struct{ zapcore.ObjectMarshaler }

func (o cleanObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	return o.ObjectMarshaler.MarshalLogObject(cleanObjectEncoder{enc})
}

type cleanObjectEncoder struct{ zapcore.ObjectEncoder }

func (e cleanObjectEncoder) AddString(k, v string) { e.ObjectEncoder.AddString(k, clean(v)) }
func (e cleanObjectEncoder) AddByteString(k string, v []byte) {
	e.ObjectEncoder.AddString(k, clean(string(v)))
}
func (e cleanObjectEncoder) AddArray(k string, a zapcore.ArrayMarshaler) error {
	return e.ObjectEncoder.AddArray(k, cleanArray{a})
}
func (e cleanObjectEncoder) AddObject(k string, o zapcore.ObjectMarshaler) error {
	return e.ObjectEncoder.AddObject(k, cleanObject{o})
}
func (e cleanObjectEncoder) AddReflected(k string, v any) error {
	e.ObjectEncoder.AddString(k, cleanReflected(v))
	return nil
}

// clean is what the log may carry of s: valid UTF-8, secrets masked, no
// control characters.
func clean(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return escapeControls(redact.String(s))
}

// escapeControls writes C0 controls (NUL, BEL, ESC, tab, newline…), DEL and
// C1 controls (U+0080–U+009F) as visible escapes: \n, \t, \r, \x00, \u0085.
// A terminal or journald sees only printable text. s is valid UTF-8.
func escapeControls(s string) string {
	i := strings.IndexFunc(s, isControl)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for _, r := range s[i:] {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r <= 0x9f:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) }
