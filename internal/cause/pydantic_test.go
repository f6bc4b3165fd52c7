package cause

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Pydantic's exception line says only that a validation failed ("1
// validation error for ModelConfig"); the summary and the decision's reason
// quote the line below it, which says what is wrong (issue 32 item 5). The
// two testdata/local logs are the pinned vLLM 0.32.0 (CPU) refusing
// --max-model-len 8192 and --gpu-memory-utilization 2; the third is a
// public issue's log (testdata/real).
func TestSummaryQuotesWhatPydanticFoundWrong(t *testing.T) {
	for _, tc := range []struct {
		file, want string
	}{
		{filepath.Join("local", "vllm-0.32.0-cpu-max-model-len.log"),
			"line 53: ModelConfig: User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings=4096.0"},
		{filepath.Join("local", "vllm-0.32.0-cpu-gpu-memory-utilization.log"),
			"line 52: CacheConfig.gpu_memory_utilization: Input should be less than or equal to 1"},
		{filepath.Join("real", "minicpmv-51-pydantic-modelconfig.log"),
			"line 7: ModelConfig: Expecting value: line 1 column 1 (char 0)"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rep, err := Diagnose(f)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Cause != CauseConfigError {
				t.Fatalf("cause %q, want config_error (summary %q)", rep.Cause, rep.Summary)
			}
			if !strings.Contains(rep.Summary, tc.want) {
				t.Errorf("summary %q\nwant it to quote %q", rep.Summary, tc.want)
			}
			if strings.Contains(rep.Summary, "validation error for") || strings.Contains(rep.Summary, "[type=") {
				t.Errorf("summary %q quotes pydantic's framing", rep.Summary)
			}
			if got := rep.Verdict.Words(); !strings.HasPrefix(got, tc.want[:40]) {
				t.Errorf("the decision's reason is %q, want it to start %q", got, tc.want[:40])
			}
		})
	}
}

// Without the line below it (a log cut there), pydantic's line is still
// quoted: it is the best there is.
func TestSummaryKeepsPydanticsLineWhenNothingFollows(t *testing.T) {
	ev := []Line{{N: 9, Text: "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"}}
	if got := summaryFor(CauseConfigError, ev); !strings.HasSuffix(got, "line 9: pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig") {
		t.Fatalf("summary %q", got)
	}
}
