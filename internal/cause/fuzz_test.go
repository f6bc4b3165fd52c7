package cause

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// FuzzClassify feeds arbitrary logs to Classify (online and offline) and
// Diagnose: no panic, a known cause, and evidence that points at real lines
// holding the evidence text.
func FuzzClassify(f *testing.F) {
	logs, err := filepath.Glob(filepath.Join("testdata", "logs", "*.log"))
	if err != nil || len(logs) == 0 {
		f.Fatalf("no corpus logs: %v", err)
	}
	for _, l := range logs {
		f.Add(readLog(f, filepath.Base(l)), byte(0))
	}
	for _, c := range loadReal(f) {
		f.Add(c.body, byte(0))
	}
	f.Add([]byte("\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO:     Application startup complete.\n\x1b["), byte(3))
	f.Add([]byte("Dec 02 09:31:24 h vllm[1]: (EngineCore pid=2) ERROR 01-01 00:00:00 [x.py:1] "), byte(5))

	f.Fuzz(func(t *testing.T, data []byte, flags byte) {
		text := string(data)
		ls := SplitLines(text)
		e := Exit{Lines: ls, ExitCode: int(flags % 3), Critical: 0.97}
		if flags&8 != 0 {
			e.Signal, e.ExitCode = "SIGKILL", -1
			e.HostOOMKill = flags&16 != 0
		}
		if flags&32 != 0 {
			e.MemFractions = []float64{0.5, 0.99}
		}
		if flags&64 != 0 {
			e.Phase = PhaseReady
		}
		v := Classify(e)
		if v.Cause == "" || !slices.Contains(Causes, v.Cause) {
			t.Fatalf("online cause %q not one of %v", v.Cause, Causes)
		}
		checkFuzzEvidence(t, ls, v)

		e.Offline = true
		v = Classify(e)
		if v.Cause != "" && v.Cause != CauseUnknown && !slices.Contains(Causes, v.Cause) {
			t.Fatalf("offline cause %q", v.Cause)
		}
		checkFuzzEvidence(t, ls, v)

		rep, err := Diagnose(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if rep.Lines != len(ls) || (rep.Cause != "" && rep.Cause != CauseUnknown && !slices.Contains(Causes, rep.Cause)) {
			t.Fatalf("diagnose: %d lines (want %d), cause %q", rep.Lines, len(ls), rep.Cause)
		}
		checkFuzzEvidence(t, ls, rep.Verdict)
		if _, err := json.Marshal(rep); err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteText(&bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
	})
}

func checkFuzzEvidence(t *testing.T, ls []Line, v Verdict) {
	t.Helper()
	for _, ev := range v.Evidence {
		if ev.N < 1 || ev.N > len(ls) {
			t.Fatalf("evidence line %d outside 1..%d", ev.N, len(ls))
		}
		if !strings.Contains(vllmlog.StripANSI(ls[ev.N-1].Text), ev.Text) {
			t.Fatalf("evidence %d %q not in line %q", ev.N, ev.Text, ls[ev.N-1].Text)
		}
	}
}

// bigLog is about n lines of one run of a healthy V1 server (ANSI
// prefixes, requests, stats) that ends in an engine OOM: every line is
// scanned, the classifier's worst realistic case.
func bigLog(b *testing.B, n int) string {
	const ready = "Application startup complete.\n"
	healthy := string(readLog(b, "v1-2025-ansi-ready.log"))
	i := strings.Index(healthy, ready) + len(ready)
	serving := healthy[i:]
	oom := string(readLog(b, "2026-oom-runtime.log"))
	death := oom[strings.Index(oom, ready)+len(ready):]
	var sb strings.Builder
	sb.WriteString(healthy[:i])
	for lines := strings.Count(healthy[:i], "\n"); lines < n-strings.Count(death, "\n"); lines += strings.Count(serving, "\n") {
		sb.WriteString(serving)
	}
	sb.WriteString(death)
	return sb.String()
}

func BenchmarkClassify100k(b *testing.B) {
	text := bigLog(b, 100_000)
	ls := SplitLines(text)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	for b.Loop() {
		if v := Classify(Exit{Lines: ls}); v.Cause != CauseOOM {
			b.Fatalf("cause %q", v.Cause)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(b.N)/float64(len(ls)), "allocs/line")
	b.ReportMetric(float64(len(ls)), "lines")
}

func BenchmarkDiagnose100k(b *testing.B) {
	text := bigLog(b, 100_000)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if rep, err := Diagnose(strings.NewReader(text)); err != nil || rep.Cause != CauseOOM {
			b.Fatalf("cause %q, %v", rep.Cause, err)
		}
	}
}
