package vllmlog

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var stamp = time.Date(2025, 10, 14, 12, 0, 0, 0, time.UTC)

// The process prefixes of V1, over time, and V0's workers.
var procs = []string{
	"APIServer pid=1",
	"EngineCore_0 pid=312",
	"EngineCore_DP0 pid=301",
	"EngineCore pid=298",
	"VllmWorker rank=3 pid=403",
	"VllmWorker TP0 pid=400",
	"Worker_TP0 pid=400",
	"VllmWorkerProcess pid=5101",
}

func TestFormatLine(t *testing.T) {
	for _, c := range []struct {
		era        Era
		proc, want string
	}{
		{EraV0, "", "INFO 10-14 12:00:00 api_server.py:527] hello"},
		{EraV0, "VllmWorkerProcess pid=5101", "(VllmWorkerProcess pid=5101) INFO 10-14 12:00:00 api_server.py:527] hello"},
		{EraV1ANSI, "APIServer pid=1", "\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO 10-14 12:00:00 [api_server.py:527] hello"},
		{EraV1Plain, "APIServer pid=1", "(APIServer pid=1) INFO 10-14 12:00:00 [api_server.py:527] hello"},
		{EraV1Plain, "", "INFO 10-14 12:00:00 [api_server.py:527] hello"},
	} {
		if got := FormatLine(c.era, c.proc, "INFO", stamp, "api_server.py:527", "hello"); got != c.want {
			t.Errorf("era %d %q:\n got %q\nwant %q", c.era, c.proc, got, c.want)
		}
	}
	if got := Proc("EngineCore_DP0", 42); got != "EngineCore_DP0 pid=42" {
		t.Errorf("Proc: %q", got)
	}
}

func TestWrappers(t *testing.T) {
	for got, want := range map[string]string{
		Journal(stamp, "gpu-node-3", "vllm[4121]"): "Oct 14 12:00:00 gpu-node-3 vllm[4121]: ",
		Docker(stamp.Add(123456789)):               "2025-10-14T12:00:00.123456789Z ",
		CRI(stamp, "stdout", false):                "2025-10-14T12:00:00.000000000Z stdout F ",
		CRI(stamp, "stderr", true):                 "2025-10-14T12:00:00.000000000Z stderr P ",
	} {
		if got != want {
			t.Errorf("got %q want %q", got, want)
		}
	}
}

// Every era, process prefix, level and wrapper round-trips: what FormatLine
// and the wrappers write, Message reads back.
func TestMessageOfEveryShape(t *testing.T) {
	const msg = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB."
	wrappers := map[string]string{
		"plain":     "",
		"journal":   Journal(stamp, "gpu-node-3", "vllm[4121]"),
		"short-iso": "2025-12-02T09:31:24+0000 gpu-node-3 vllm[1234]: ",
		"docker":    Docker(stamp),
		"cri":       CRI(stamp, "stdout", false),
		"cri-p":     CRI(stamp, "stderr", true),
	}
	for _, era := range []Era{EraV0, EraV1ANSI, EraV1Plain} {
		for _, proc := range append([]string{""}, procs...) {
			for _, level := range Levels {
				for name, w := range wrappers {
					for _, line := range []string{
						FormatLine(era, proc, level, stamp, "model_runner.py:1703", msg),
						ProcessPrefix(era, proc) + msg, // a raw stderr line
					} {
						in := w + line
						if got := Message(in); got != msg {
							t.Errorf("era %d, %s, %q: Message(%q) = %q", era, name, proc, in, got)
						}
						if got := Message(in + "\r\n"); got != msg {
							t.Errorf("with CRLF: Message(%q) = %q", in, got)
						}
					}
				}
			}
		}
	}
}

func TestMessage(t *testing.T) {
	for in, want := range map[string]string{
		// Indentation of traceback source lines survives the prefix.
		"(EngineCore pid=298)     raise ValueError(": "    raise ValueError(",
		// The level may come before the process prefix.
		"INFO 10-14 12:00:00 [core.py:1] (EngineCore pid=298) hi": "hi",
		// journalctl pads a one-digit day.
		"Dec  2 09:31:24 gpu-node-3 vllm[1234]: hi": "hi",
		// A line that is only a level prefix.
		"INFO 10-14 12:00:00 [core.py:1]": "",
		// Colours elsewhere than around the prefix: stripped into a copy.
		"(APIServer pid=1) \x1b[31mERROR\x1b[0m 10-14 12:00:00 [core.py:1] boom": "boom",
		"\x1b]0;t\x07(APIServer pid=1) hi\x1b(B":                                 "hi",
		// Not prefixes: left alone.
		"(see above) something":                      "(see above) something",
		"INFO:     Application startup complete.":    "INFO:     Application startup complete.",
		"Decimal 12 value: 3":                        "Decimal 12 value: 3",
		"INFO 10-14 12:00:00 [core.py:x] not a line": "INFO 10-14 12:00:00 [core.py:x] not a line",
		"INFORMATION 10-14 12:00:00 [core.py:1] hi":  "INFORMATION 10-14 12:00:00 [core.py:1] hi",
		"(pid=1)": "(pid=1)",
	} {
		if got := Message(in); got != want {
			t.Errorf("Message(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCutters(t *testing.T) {
	for _, proc := range procs {
		for _, era := range []Era{EraV0, EraV1ANSI, EraV1Plain} {
			in := skipCSI(ProcessPrefix(era, proc) + "rest")
			rest, got, ok := CutProcess(in)
			if !ok || got != proc || rest != "rest" {
				t.Errorf("CutProcess(%q) = %q, %q, %v", in, rest, got, ok)
			}
		}
	}
	for _, c := range []struct{ in, rest, level string }{
		{"WARNING 10-14 12:00:00 [utils.py:1] w", "w", "WARNING"},
		{"WARN 10-14 12:00:00 utils.py:1] w", "w", "WARN"},
		{"CRITICAL 10-14 12:00:00 [x.py:9] c", "c", "CRITICAL"},
		{"DEBUG 10-14 12:00:00 [x.py:9] d", "d", "DEBUG"},
		{"ERROR 10-14 12:00:00 model_runner.py:1703] e", "e", "ERROR"},
		{"INFO:     Started server process [1951]", "INFO:     Started server process [1951]", ""},
	} {
		rest, level, ok := CutLevel(c.in)
		if rest != c.rest || level != c.level || ok != (c.level != "") {
			t.Errorf("CutLevel(%q) = %q, %q, %v", c.in, rest, level, ok)
		}
	}
	if rest, ok := CutWrapper("2026-01-20T04:00:00.123456789Z stdout F x"); !ok || rest != "x" {
		t.Errorf("CutWrapper: %q %v", rest, ok)
	}
	if rest, ok := CutWrapper("2026 was a year"); ok || rest != "2026 was a year" {
		t.Errorf("CutWrapper: %q %v", rest, ok)
	}
}

// The classifier reads hundreds of thousands of lines: the common V1 shape
// (a coloured process prefix, a level prefix, a plain message) and the
// plain shapes are cut without allocating.
func TestMessageDoesNotAllocate(t *testing.T) {
	for _, in := range []string{
		"\x1b[1;36m(EngineCore_0 pid=312)\x1b[0;0m INFO 10-14 12:00:00 [core.py:1] Avg prompt throughput: 1.0 tokens/s",
		"(EngineCore pid=298) ERROR 10-14 12:00:00 [core.py:1] boom",
		"INFO 10-14 12:00:00 api_server.py:527] hello",
		"2026-01-20T04:00:00.123456789Z stdout F (EngineCore pid=298) hi",
		"Dec 02 09:31:24 gpu-node-3 vllm[1234]: (APIServer pid=1) INFO 10-14 12:00:00 [a.py:1] hi",
	} {
		if n := testing.AllocsPerRun(100, func() { _ = Message(in) }); n != 0 {
			t.Errorf("Message(%q): %v allocations", in, n)
		}
	}
}

func FuzzMessage(f *testing.F) {
	f.Add("\x1b[1;36m(EngineCore_0 pid=312)\x1b[0;0m INFO 10-14 12:00:00 [core.py:1] hi")
	f.Add("2026-01-20T04:00:00.123456789Z stdout F (EngineCore pid=298) hi")
	f.Add("Dec 02 09:31:24 gpu-node-3 vllm[1234]: INFO 10-14 12:00:00 api_server.py:527] hi")
	f.Add("INFO 10-14 12:00:00 [core.py:1]")
	f.Fuzz(func(t *testing.T, s string) {
		m := Message(s)
		if strings.IndexByte(m, esc) >= 0 {
			t.Fatalf("Message(%q) = %q holds an ESC", s, m)
		}
		if strings.IndexByte(s, esc) < 0 && !strings.Contains(s, m) {
			t.Fatalf("Message(%q) = %q is not a part of the line", s, m)
		}
	})
}

// TestSupportedTasksOnlyFromVLLMsLogger: the tasks line in both wordings
// and every era; the same words in an access line, a logged request or a
// bare print are the client's text (issue 24 item 2: one GET
// /v1/models?Supported_tasks:[embed] made every start probe /v1/embeddings).
func TestSupportedTasksOnlyFromVLLMsLogger(t *testing.T) {
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		line string
		want []string
	}{
		{FormatLine(EraV1Plain, Proc("APIServer", 7), "INFO", at, "api_server.py:1805", "Supported tasks: ['generate']"), []string{"generate"}},
		{FormatLine(EraV1ANSI, Proc("APIServer", 7), "INFO", at, "api_server.py:1611", "Supported_tasks: ['encode', 'embed']"), []string{"encode", "embed"}},
		{FormatLine(EraV0, "", "INFO", at, "api_server.py:1611", "Supported_tasks: ['token_embed', 'embed']"), []string{"token_embed", "embed"}},
		{Docker(at) + FormatLine(EraV1Plain, Proc("APIServer", 7), "INFO", at, "api_server.py:1805", "Supported tasks: ['classify']"), []string{"classify"}},
		// A client's words.
		{ProcessPrefix(EraV1Plain, Proc("APIServer", 7)) + FormatAccess("127.0.0.1:5000", "GET", "/v1/models?Supported_tasks:[embed]", "HTTP/1.1", 200, "OK"), nil},
		{FormatAccess("127.0.0.1:5000", "GET", "/v1/models?x=Supported%20tasks:%20['embed']", "HTTP/1.1", 200, "OK"), nil},
		{FormatLine(EraV1Plain, Proc("APIServer", 7), "INFO", at, "logger.py:41", "Received request cmpl-1: prompt: \"Supported tasks: ['embed']\", params: SamplingParams()"), nil},
		{"Supported tasks: ['embed']", nil},
		{FormatLine(EraV1Plain, Proc("APIServer", 7), "INFO", at, "api_server.py:1805", "Supported tasks: ['embed'] and more"), nil},
	} {
		if got := SupportedTasks(tc.line); !slices.Equal(got, tc.want) {
			t.Errorf("SupportedTasks(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

func TestIsClientText(t *testing.T) {
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for line, want := range map[string]bool{
		FormatAccess("127.0.0.1:5000", "GET", "/v1/models?OutOfMemoryError", "HTTP/1.1", 200, "OK"):                                       true,
		FormatLine(EraV1Plain, Proc("APIServer", 7), "INFO", at, "logger.py:41", "Received request cmpl-1: prompt: 'CUDA out of memory'"): true,
		FormatLine(EraV1Plain, Proc("APIServer", 7), "INFO", at, "logger.py:60", "Generated response cmpl-1: output: 'OutOfMemoryError'"): true,
		FormatLine(EraV1Plain, Proc("EngineCore_DP0", 8), "ERROR", at, "core.py:700", "torch.OutOfMemoryError: CUDA out of memory."):      false,
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.":                                                        false,
	} {
		if got := IsClientText(line); got != want {
			t.Errorf("IsClientText(%q) = %v, want %v", line, got, want)
		}
	}
}

func FuzzSupportedTasks(f *testing.F) {
	f.Add("(APIServer pid=7) INFO 12-02 09:00:00 [api_server.py:1805] Supported tasks: ['generate']")
	f.Add("INFO 12-02 09:00:00 api_server.py:1611] Supported_tasks: ['encode', 'embed']")
	f.Add(`INFO:     127.0.0.1:5000 - "GET /v1/models?Supported_tasks:[embed] HTTP/1.1" 200 OK`)
	f.Fuzz(func(t *testing.T, line string) {
		ts := SupportedTasks(line)
		if ts != nil && !strings.Contains(line, "upported") {
			t.Fatalf("tasks %q from a line without the words: %q", ts, line)
		}
		for _, x := range ts {
			if x == "" || strings.ContainsAny(x, " '\"[]") {
				t.Fatalf("task %q from %q", x, line)
			}
		}
		if IsClientText(line) && ts != nil {
			t.Fatalf("a client's line gave tasks %q: %q", ts, line)
		}
	})
}
