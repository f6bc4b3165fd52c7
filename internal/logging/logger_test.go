package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// hostile is a vLLM line with every control a journal must not see raw, and
// a forged entry after a NUL and a newline.
const hostile = "INFO ok\x00\x07\x1b]0;title\x07 \xff\xfe tab\there\r\n12:00:00.000\tINFO\tvllm-guard\tforged \u0085\u009b31m end\x7f"

func TestLoggerEscapesControlsAndRedacts(t *testing.T) {
	for _, format := range []string{"console", "json"} {
		t.Run(format, func(t *testing.T) {
			var out bytes.Buffer
			log, err := newLoggerTo(zapcore.AddSync(&out), "info", format, false, format == "console")
			if err != nil {
				t.Fatal(err)
			}
			vllm := log.Named("vllm").With(zap.String("with", "VLLM_API_KEY=withsecret\x00"))
			vllm.Info(hostile, zap.String("stream", "stdout\x1b[31m"), zap.Int("pid", 7))
			vllm.Info("(APIServer pid=7) INFO non-default args: {'model_tag': 'm', 'api_key': 'linesecret', 'max_num_seqs': 8}")
			log.Info("launching vLLM", zap.Strings("argv", []string{"vllm", "serve", "m", "--api-key", "argvsecret", "argvsecond", "--port", "8000"}))
			log.Warn("webhook failed", zap.Error(errors.New("POST https://u:pwsecret@hooks.example/x: refused\nsecond line")),
				zap.ByteString("raw", []byte("Authorization: Bearer bytesecret")))
			log.Sync()
			text := out.String()
			lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
			if len(lines) != 4 {
				t.Fatalf("%d log lines for 4 entries (a control split one):\n%s", len(lines), text)
			}
			if !utf8.ValidString(text) {
				t.Errorf("log is not valid UTF-8: %q", text)
			}
			for _, r := range text {
				// The console encoder separates its columns with tabs.
				if (r < 0x20 && r != '\n' && !(format == "console" && r == '\t')) || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
					t.Errorf("control character %U reached the log:\n%q", r, text)
				}
			}
			for _, secret := range []string{"withsecret", "linesecret", "argvsecret", "argvsecond", "pwsecret", "bytesecret"} {
				if strings.Contains(text, secret) {
					t.Errorf("%q reached the log:\n%s", secret, text)
				}
			}
			first, argv := lines[0], lines[2]
			if format == "json" {
				var m, a struct {
					Msg  string   `json:"msg"`
					Argv []string `json:"argv"`
				}
				if err := json.Unmarshal([]byte(first), &m); err != nil {
					t.Fatalf("not JSON: %v: %q", err, first)
				}
				if err := json.Unmarshal([]byte(argv), &a); err != nil {
					t.Fatalf("not JSON: %v: %q", err, argv)
				}
				first, argv = m.Msg, strings.Join(a.Argv, ", ")
			}
			for _, want := range []string{`ok\x00\x07\x1b]0;title\x07`, "\uFFFD", `tab\there\r\n12:00:00.000\tINFO\tvllm-guard\tforged \u0085\u009b31m end\x7f`} {
				if !strings.Contains(first, want) {
					t.Errorf("the vLLM line does not carry %q escaped: %q", want, first)
				}
			}
			if !strings.Contains(strings.ReplaceAll(argv, `"`, ""), "--api-key, ***, ***, --port") {
				t.Errorf("argv not masked after --api-key (both of its values): %s", argv)
			}
		})
	}
}

func TestEscapeControlsKeepsPrintableText(t *testing.T) {
	for _, s := range []string{"", "plain ascii", "GPU 0: 78.2 GiB — ünïcödé ✓ 日本", "\uFFFD"} {
		if got := escapeControls(s); got != s {
			t.Errorf("escapeControls(%q) = %q", s, got)
		}
	}
	if got := clean(clean(hostile)); got != clean(hostile) {
		t.Errorf("clean is not idempotent: %q", got)
	}
}
