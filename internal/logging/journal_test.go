package logging

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

type sent struct {
	msg  string
	prio journal.Priority
	vars map[string]string
}

// Under journald every entry carries its priority and fields; vLLM's lines
// keep their text and say which process and stream wrote them; secrets
// and controls are cleaned as in every other format.
func TestJournalEntries(t *testing.T) {
	var got []sent
	send := func(msg string, prio journal.Priority, vars map[string]string) error {
		got = append(got, sent{msg, prio, vars})
		return nil
	}
	var stderr bytes.Buffer
	log, err := newJournalLogger(zapcore.AddSync(&stderr), "debug", send)
	if err != nil {
		t.Fatal(err)
	}
	defer logLevel.SetLevel(zapcore.InfoLevel)
	SetGuardState("backoff")
	defer guardState.Store(nil)

	vllm := log.Named("vllm")
	vllm.Error("(EngineCore_DP0 pid=12) torch.OutOfMemoryError: CUDA out of memory", zap.String("stream", "stderr"), zap.Int("pid", 12))
	vllm.Info("INFO loading --api-key sk-secret\x00", zap.String("stream", "stdout"), zap.Int("pid", 12))
	log.With(zap.String("instance", "gpu0")).Warn("vLLM exited", zap.String("cause", "oom"), zap.Int("exit code", 0), zap.Duration("backoff", 40*time.Millisecond))
	log.Debug("probe")
	log.Error("config reload refused", zap.Error(errors.New("line 3: bad")))

	if len(got) != 5 || stderr.Len() != 0 {
		t.Fatalf("%d entries sent, stderr %q; want 5 entries and nothing on stderr", len(got), stderr.String())
	}
	want := []struct {
		prio journal.Priority
		msg  string
		vars map[string]string
	}{
		{journal.PriErr, "(EngineCore_DP0 pid=12) torch.OutOfMemoryError: CUDA out of memory",
			map[string]string{"SYSLOG_IDENTIFIER": "vllm", "VLLM_PID": "12", "SYSLOG_PID": "12", "VLLM_STREAM": "stderr", "VLLM_GUARD_STATE": "backoff"}},
		{journal.PriInfo, `INFO loading --api-key ***`, map[string]string{"VLLM_STREAM": "stdout"}},
		{journal.PriWarning, `vLLM exited instance=gpu0 cause=oom "exit code"=0 backoff=40ms`,
			map[string]string{"SYSLOG_IDENTIFIER": "vllm-guard", "VLLM_GUARD_INSTANCE": "gpu0", "VLLM_GUARD_CAUSE": "oom", "VLLM_GUARD_EXIT_CODE": "0", "VLLM_GUARD_BACKOFF": "40ms"}},
		{journal.PriDebug, "probe", nil},
		{journal.PriErr, "config reload refused error=\"line 3: bad\"", map[string]string{"VLLM_GUARD_ERROR": "line 3: bad"}},
	}
	for i, w := range want {
		g := got[i]
		if g.prio != w.prio || g.msg != w.msg {
			t.Errorf("entry %d: priority %d %q, want %d %q", i, g.prio, g.msg, w.prio, w.msg)
		}
		for k, v := range w.vars {
			if g.vars[k] != v {
				t.Errorf("entry %d: %s=%q, want %q (all: %v)", i, k, g.vars[k], v, g.vars)
			}
		}
		for k := range g.vars {
			if strings.Trim(k, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "" || strings.HasPrefix(k, "_") {
				t.Errorf("entry %d: field name %q is not a valid journal field", i, k)
			}
		}
	}
	if strings.Contains(got[1].msg, "sk-secret") {
		t.Errorf("a secret reached the journal: %q", got[1].msg)
	}
}

// An entry the journal refuses (its socket gone, a full queue) is written
// to stderr as a console line: the message is never lost.
func TestJournalRefusedFallsBackToStderr(t *testing.T) {
	var stderr bytes.Buffer
	log, err := newJournalLogger(zapcore.AddSync(&stderr), "info", func(string, journal.Priority, map[string]string) error {
		return errors.New("journal socket gone")
	})
	if err != nil {
		t.Fatal(err)
	}
	log.With(zap.String("instance", "gpu1")).Error("vLLM gave up", zap.String("cause", "oom"))
	if s := stderr.String(); !strings.Contains(s, "ERROR\tvLLM gave up") || !strings.Contains(s, `"instance": "gpu1"`) || !strings.Contains(s, `"cause": "oom"`) {
		t.Fatalf("stderr after a refused entry: %q; want the console line with its fields", s)
	}
}
