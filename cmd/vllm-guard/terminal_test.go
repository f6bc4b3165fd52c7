package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// diagnose prints vLLM's lines cleaned: a log line carrying an OSC title,
// a screen clear and a bidirectional override reaches the terminal as
// text, not as controls.
func TestDiagnosePrintsVLLMsLinesCleaned(t *testing.T) {
	log := filepath.Join(t.TempDir(), "vllm.log")
	text := "INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.32.0\n" +
		"Traceback (most recent call last):\n" +
		"  File \"x.py\", line 1, in <module>\n" +
		"torch.OutOfMemoryError: CUDA out of memory.\x1b]0;owned\x07\x1b[2J\u202e Tried to allocate 2.00 GiB\n"
	if err := os.WriteFile(log, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := call("diagnose", "--log", log)
	if code != 0 || !strings.Contains(out, "CUDA out of memory") {
		t.Fatalf("diagnose: exit %d\n%s\n%s", code, out, errs)
	}
	if strings.ContainsAny(out, "\x1b\x07\u202e") {
		t.Errorf("diagnose printed a terminal control from vLLM's log: %q", out)
	}
}
