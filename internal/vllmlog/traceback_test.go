package vllmlog

import "testing"

func TestTraceback(t *testing.T) {
	lines := []string{
		"(EngineCore_0 pid=312) Traceback (most recent call last):",
		`(EngineCore_0 pid=312)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 691, in run_engine_core`,
		"(EngineCore_0 pid=312)     engine_core = EngineCoreProc(*args, **kwargs)",
		"(EngineCore_0 pid=312) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.",
	}
	if !IsTracebackHeader(Message(lines[0])) || IsTracebackHeader(Message(lines[1])) {
		t.Error("header")
	}
	for i, want := range []bool{false, true, true, false} {
		if got := IsTracebackBody(Message(lines[i])); got != want {
			t.Errorf("IsTracebackBody(%q) = %v", lines[i], got)
		}
	}
	if typ, ok := ExceptionType(Message(lines[3])); !ok || typ != "torch.OutOfMemoryError" {
		t.Errorf("exception %q %v", typ, ok)
	}
	got := FormatFrame("vllm/x.py", 12, "f", "raise E")
	if got[0] != `  File "vllm/x.py", line 12, in f` || got[1] != "    raise E" {
		t.Errorf("FormatFrame %q", got)
	}
}

func TestExceptionType(t *testing.T) {
	for in, want := range map[string]string{
		"ValueError: No available memory for the cache blocks.": "ValueError",
		"RuntimeError": "RuntimeError",
		"vllm.v1.engine.exceptions.EngineDeadError: x": "vllm.v1.engine.exceptions.EngineDeadError",
		"KeyboardInterrupt":                            "",
		"Error:x":                                      "",
		"note: ValueError: x":                          "",
		"    raise ValueError(":                        "",
		"":                                             "",
	} {
		typ, ok := ExceptionType(in)
		if typ != want || ok != (want != "") {
			t.Errorf("ExceptionType(%q) = %q, %v", in, typ, ok)
		}
	}
}
