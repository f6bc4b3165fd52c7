package main

import (
	"fmt"
	"os"

	"github.com/coreos/go-systemd/v22/journal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
)

// newLogger builds the guard's logger: console on a terminal, JSON
// otherwise; under journald no timestamps of our own (the journal stamps
// every line already).
func newLogger(level, format string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("[log] level %q: %w", level, err)
	}
	journald, _ := journal.StderrIsJournalStream()
	if format == "auto" || format == "" {
		format = "json"
		if isTerminal(os.Stderr) || journald {
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
	core := zapcore.NewCore(encoder, zapcore.Lock(os.Stderr), lvl)
	return zap.New(core), nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
