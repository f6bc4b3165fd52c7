package cause

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// corpusCase is one line of testdata/expect.txt.
type corpusCase struct {
	file     string
	cause    Cause // "" = no failure
	diagnose Cause
	exit     Exit
	line     int
}

func loadCorpus(t testing.TB) []corpusCase {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "expect.txt"))
	if err != nil {
		t.Fatalf("open expectations: %v", err)
	}
	defer f.Close()
	var out []corpusCase
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if len(fields) < 2 {
			t.Fatalf("expect.txt:%d: want FILE CAUSE [FLAGS]", n)
		}
		c := corpusCase{file: fields[0], cause: causeArg(fields[1]), line: n}
		c.diagnose = c.cause
		c.exit.ExitCode = 1
		for _, fl := range fields[2:] {
			k, v, _ := strings.Cut(fl, "=")
			switch k {
			case "exit":
				c.exit.ExitCode, err = strconv.Atoi(v)
			case "signal":
				c.exit.Signal, c.exit.ExitCode = v, -1
			case "guard":
				c.exit.SignalByGuard = true
			case "hostoom":
				c.exit.HostOOMKill = true
			case "hang":
				c.exit.Hang = strings.ReplaceAll(v, "_", " ")
			case "phase":
				c.exit.Phase = Phase(v)
			case "critical":
				c.exit.Critical, err = strconv.ParseFloat(v, 64)
			case "mem":
				for _, s := range strings.Split(v, ",") {
					var m float64
					m, err = strconv.ParseFloat(s, 64)
					c.exit.MemFractions = append(c.exit.MemFractions, m)
				}
			case "diagnose":
				c.diagnose = causeArg(v)
			default:
				t.Fatalf("expect.txt:%d: unknown flag %q", n, fl)
			}
			if err != nil {
				t.Fatalf("expect.txt:%d: flag %q: %v", n, fl, err)
			}
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func causeArg(s string) Cause {
	if s == "-" {
		return ""
	}
	return Cause(s)
}

func readLog(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "logs", name))
	if err != nil {
		t.Fatalf("read corpus log: %v", err)
	}
	return b
}

// wrapperTexts must never be evidence: they only say that the engine died.
var wrapperTexts = []string{"EngineCore failed to start", "Engine core initialization failed", "EngineCore encountered",
	"AsyncLLM output_handler failed", "EngineDeadError", "MQLLMEngine is already dead", "Engine loop has died"}

func checkEvidence(t *testing.T, lines []Line, v Verdict) {
	t.Helper()
	for _, ev := range v.Evidence {
		if ev.N < 1 || ev.N > len(lines) {
			t.Fatalf("evidence line %d outside 1..%d", ev.N, len(lines))
		}
		if !strings.Contains(vllmlog.StripANSI(lines[ev.N-1].Text), ev.Text) {
			t.Errorf("evidence %d: %q is not on that line: %q", ev.N, ev.Text, lines[ev.N-1].Text)
		}
		for _, w := range wrapperTexts {
			if strings.Contains(ev.Text, w) {
				t.Errorf("evidence %d is a wrapper, not a root cause: %q", ev.N, ev.Text)
			}
		}
	}
}

// TestCorpus runs every corpus log through Classify (with the exit facts of
// expect.txt) and through Diagnose (text only).
func TestCorpus(t *testing.T) {
	cases := loadCorpus(t)
	logs, _ := filepath.Glob(filepath.Join("testdata", "logs", "*.log"))
	covered := map[string]bool{}
	causes := map[Cause]bool{}
	for _, c := range cases {
		covered[c.file] = true
		causes[c.cause] = true
		t.Run(strconv.Itoa(c.line)+"_"+c.file, func(t *testing.T) {
			data := readLog(t, c.file)
			lines := SplitLines(string(data))
			e := c.exit
			e.Lines = lines
			e.Offline = c.cause == ""
			v := Classify(e)
			if v.Cause != c.cause {
				t.Fatalf("Classify: cause %q, want %q (summary %q, evidence %v)", v.Cause, c.cause, v.Summary, v.Evidence)
			}
			checkEvidence(t, lines, v)
			if c.cause != "" {
				if v.Summary == "" || len(v.Advice) == 0 || (v.Confidence != "high" && v.Confidence != "low") {
					t.Errorf("Classify: want summary, advice and confidence, got %+v", v)
				}
			}
			// A log line says why: text-only causes need their evidence line.
			if c.exit.Hang == "" && !c.exit.HostOOMKill && len(c.exit.MemFractions) == 0 && c.cause != "" && c.cause != CauseCrash && len(v.Evidence) == 0 {
				t.Errorf("Classify: %s without evidence lines", v.Cause)
			}

			rep, err := Diagnose(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Cause != c.diagnose {
				t.Fatalf("Diagnose: cause %q, want %q (summary %q)", rep.Cause, c.diagnose, rep.Summary)
			}
			if rep.Lines != len(lines) {
				t.Errorf("Diagnose: %d lines, want %d", rep.Lines, len(lines))
			}
			checkEvidence(t, lines, rep.Verdict)
			if c.diagnose == "" && !strings.HasPrefix(rep.Summary, "no failure found") {
				t.Errorf("Diagnose: healthy log summary %q", rep.Summary)
			}
			if rep.Facts.Ready != (rep.Phase == PhaseReady) {
				t.Errorf("Diagnose: ready %v but phase %s", rep.Facts.Ready, rep.Phase)
			}
			var text bytes.Buffer
			if err := rep.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			for _, ev := range rep.Evidence {
				if !strings.Contains(text.String(), strconv.Itoa(ev.N)) {
					t.Errorf("text report lacks evidence line number %d", ev.N)
				}
			}
			if _, err := json.Marshal(rep); err != nil {
				t.Fatalf("report does not marshal: %v", err)
			}
		})
	}
	for _, l := range logs {
		if !covered[filepath.Base(l)] {
			t.Errorf("%s has no line in expect.txt", l)
		}
	}
	for _, c := range append([]Cause{""}, logCauses()...) {
		if !causes[c] {
			t.Errorf("corpus has no log for cause %q", c)
		}
	}
}

// logCauses are the causes a log can show: every one but group, which is
// the guard's own fact (the group's epoch ended elsewhere), never a line.
func logCauses() []Cause {
	var out []Cause
	for _, c := range Causes {
		if c != CauseGroup {
			out = append(out, c)
		}
	}
	return out
}
