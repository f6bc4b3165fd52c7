package logging

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"go.uber.org/zap/zapcore"
)

// Under journald (stderr is the journal's stream: JOURNAL_STREAM) the guard
// writes native journal entries, so each carries its priority and fields:
// `journalctl -p err -u vllm-guard` finds the guard's errors and vLLM's
// (its ERROR and CRITICAL lines and every line of its tracebacks), and
//
//	journalctl -u vllm-guard VLLM_STREAM=stderr
//	journalctl -u vllm-guard VLLM_GUARD_STATE=backoff
//
// select by field. vLLM's lines keep their own text as MESSAGE, with
// SYSLOG_IDENTIFIER=vllm, SYSLOG_PID, VLLM_PID and VLLM_STREAM; the
// guard's lines are its message followed by its fields (key=value), each
// field also as VLLM_GUARD_<KEY>; every entry has VLLM_GUARD_STATE, the
// guard's state when it was written. An entry the journal refuses is
// written to stderr as a console line instead: nothing is lost.

// guardState is the state the journal entries carry (set on each state
// event).
var guardState atomic.Pointer[string]

// SetGuardState is the guard's state every journal entry carries from now
// on (VLLM_GUARD_STATE).
func SetGuardState(s string) { guardState.Store(&s) }

// journalSend is journal.Send; tests replace it.
type journalSend func(message string, priority journal.Priority, vars map[string]string) error

type journalCore struct {
	zapcore.LevelEnabler
	send     journalSend
	fallback zapcore.Core // a console core on stderr
	fields   []zapcore.Field
}

func (c *journalCore) With(fields []zapcore.Field) zapcore.Core {
	return &journalCore{
		LevelEnabler: c.LevelEnabler,
		send:         c.send,
		fallback:     c.fallback.With(fields),
		fields:       append(append([]zapcore.Field(nil), c.fields...), fields...),
	}
}

func (c *journalCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *journalCore) Sync() error { return c.fallback.Sync() }

func (c *journalCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	all := fields
	if len(c.fields) > 0 {
		all = append(append([]zapcore.Field(nil), c.fields...), fields...)
	}
	vars := map[string]string{}
	if s := guardState.Load(); s != nil {
		vars["VLLM_GUARD_STATE"] = *s
	}
	msg := clean(ent.Message)
	if ent.LoggerName == "vllm" {
		// One of vLLM's own lines: its text, and who wrote it.
		vars["SYSLOG_IDENTIFIER"] = "vllm"
		for _, f := range all {
			v := fieldText(f)
			switch f.Key {
			case "pid":
				vars["VLLM_PID"], vars["SYSLOG_PID"] = v, v
			case "stream":
				vars["VLLM_STREAM"] = v
			default:
				vars[journalKey(f.Key)] = v
			}
		}
	} else {
		vars["SYSLOG_IDENTIFIER"] = "vllm-guard"
		var b strings.Builder
		b.WriteString(msg)
		for _, f := range all {
			v := fieldText(f)
			vars[journalKey(f.Key)] = v
			fmt.Fprintf(&b, " %s=%s", quoteIfNeeded(f.Key), quoteIfNeeded(v))
		}
		msg = b.String()
	}
	if err := c.send(msg, journalPriority(ent.Level), vars); err != nil {
		return c.fallback.Write(ent, fields)
	}
	return nil
}

func journalPriority(l zapcore.Level) journal.Priority {
	switch {
	case l <= zapcore.DebugLevel:
		return journal.PriDebug
	case l == zapcore.InfoLevel:
		return journal.PriInfo
	case l == zapcore.WarnLevel:
		return journal.PriWarning
	case l == zapcore.ErrorLevel:
		return journal.PriErr
	default:
		return journal.PriCrit
	}
}

// journalKey turns a log field's key into a journal field name: upper case,
// A–Z, 0–9 and _ only, prefixed VLLM_GUARD_ (never one of the journal's
// own fields), at most 64 characters.
func journalKey(k string) string {
	b := []byte("VLLM_GUARD_" + strings.ToUpper(k))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b[:min(len(b), 64)])
}

// fieldText is a field's value as text, cleaned like every log line
// (secrets masked, controls escaped): strings as they are, anything else
// as JSON, durations and times as people write them.
func fieldText(f zapcore.Field) string {
	enc := zapcore.NewMapObjectEncoder()
	cleanField(f).AddTo(enc)
	v := enc.Fields[f.Key]
	switch v := v.(type) {
	case string:
		return v // cleanField cleaned it
	case time.Duration:
		return v.String() // "40ms", not nanoseconds
	case time.Time:
		return v.Format(time.RFC3339Nano)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return clean(fmt.Sprint(v))
	}
	return clean(string(b))
}

func quoteIfNeeded(s string) string {
	if s == "" || strings.ContainsAny(s, " \"=") {
		return strconv.Quote(s)
	}
	return s
}
