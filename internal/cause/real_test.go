package cause

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// realCase is one log of testdata/real: vLLM output as a user posted it in a
// public issue, behind a header of "#! key: value" lines naming its source
// and the cause a person reading it would decide on ("none" = healthy).
type realCase struct {
	file   string
	source string
	era    string
	want   Cause // "" = no failure
	body   []byte
}

const realHeader = "#! "

func loadReal(t testing.TB) []realCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "real", "*.log"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no real corpus logs: %v", err)
	}
	var out []realCase
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c := realCase{file: filepath.Base(f)}
		cause := ""
		for bytes.HasPrefix(data, []byte(realHeader)) {
			line, rest, _ := bytes.Cut(data, []byte("\n"))
			data = rest
			k, v, ok := strings.Cut(strings.TrimPrefix(string(line), realHeader), ": ")
			if !ok {
				t.Fatalf("%s: header line %q is not \"#! key: value\"", c.file, line)
			}
			switch k {
			case "source":
				c.source = v
			case "cause":
				cause = strings.TrimSpace(v)
			case "era":
				c.era = v
			case "note":
			default:
				t.Fatalf("%s: unknown header key %q", c.file, k)
			}
		}
		switch {
		case cause == "none":
		case slices.Contains(Causes, Cause(cause)):
			c.want = Cause(cause)
		default:
			t.Fatalf("%s: header cause %q is not a cause or \"none\"", c.file, cause)
		}
		if c.source == "" || c.era == "" || len(bytes.TrimSpace(data)) == 0 {
			t.Fatalf("%s: needs #! source, #! era and a log body", c.file)
		}
		c.body = data
		out = append(out, c)
	}
	return out
}

// scored is one log's expected and decided cause.
type scored struct {
	file, source string
	want, got    Cause
	confidence   string
	summary      string
}

func causeName(c Cause) string {
	if c == "" {
		return "none"
	}
	return string(c)
}

// confusion prints per-cause precision and recall, the confusion table and
// every miss with its source; it returns recall by cause and the accuracy.
func confusion(t *testing.T, title string, res []scored) (map[Cause]float64, float64) {
	t.Helper()
	labels := append(append([]Cause{""}, Causes...), CauseUnknown)
	m := map[[2]Cause]int{}
	right := 0
	for _, r := range res {
		m[[2]Cause{r.want, r.got}]++
		if r.want == r.got {
			right++
		}
	}
	var b strings.Builder
	acc := float64(right) / float64(len(res))
	fmt.Fprintf(&b, "\n%s: %d/%d right (%.1f %%)\n\n", title, right, len(res), 100*acc)
	fmt.Fprintf(&b, "| expected ↓ / decided → |")
	for _, l := range labels {
		fmt.Fprintf(&b, " %s |", causeName(l))
	}
	b.WriteString(" recall | precision |\n|---|")
	for range labels {
		b.WriteString("---|")
	}
	b.WriteString("---|---|\n")
	recall := map[Cause]float64{}
	for _, w := range labels {
		row, col := 0, 0
		fmt.Fprintf(&b, "| %s |", causeName(w))
		for _, g := range labels {
			n := m[[2]Cause{w, g}]
			row += n
			col += m[[2]Cause{g, w}]
			if n == 0 {
				b.WriteString(" · |")
			} else {
				fmt.Fprintf(&b, " %d |", n)
			}
		}
		rc, pr := "–", "–"
		if row > 0 {
			recall[w] = float64(m[[2]Cause{w, w}]) / float64(row)
			rc = fmt.Sprintf("%.0f %% (%d/%d)", 100*recall[w], m[[2]Cause{w, w}], row)
		}
		if col > 0 {
			pr = fmt.Sprintf("%.0f %%", 100*float64(m[[2]Cause{w, w}])/float64(col))
		}
		fmt.Fprintf(&b, " %s | %s |\n", rc, pr)
	}
	misses := 0
	for _, r := range res {
		if r.want != r.got {
			if misses == 0 {
				b.WriteString("\nmisses:\n")
			}
			misses++
			fmt.Fprintf(&b, "  %s (%s): want %s, got %s: %s\n", r.file, r.source, causeName(r.want), causeName(r.got), clip(r.summary, 160))
		}
	}
	if misses == 0 {
		b.WriteString("\nmisses: none\n")
	}
	t.Log(b.String())
	return recall, acc
}

// group is the source a real log is held out with in the leave-one-group-out
// figure: its repository; for vllm-project/vllm, which holds most of the
// corpus, the repository and the month its era line names (its reporters,
// versions and log shapes change month by month).
func group(c realCase) string {
	repo, _, _ := strings.Cut(c.source, " ")
	if repo == "vllm-project/vllm" {
		e := c.era
		if len(e) >= 7 && e[4] == '-' && isDigit(e[0]) && isDigit(e[5]) && isDigit(e[6]) {
			return repo + " " + e[:7]
		}
		if len(e) >= 4 && isDigit(e[0]) {
			return repo + " " + e[:4]
		}
	}
	return repo
}

// logoMethod says what the leave-one-group-out figure measures; the report
// prints it beside the figure.
const logoMethod = `leave-one-group-out: the classifier is hand-written rules, not trained, so
"training" on a group means a rule was written from (or is borne out by) that
group's logs. Groups: the repository a log comes from; vllm-project/vllm,
which holds most logs, is split by the month of its era line. Every rule
(needle, frame rule, structural check, stall sign) has an id; a rule's
support is the set of groups with a log whose expected cause is the rule's
cause and in which the rule decided a line. When a group is held out, every
rule whose support is that group alone is switched off, and the group's logs
are diagnosed without it: a log counts as right only if rules borne out by
other groups (or written from source text and supported by no corpus log at
all) decide it. A rule that fixes only its own group's file shows here.`

// logoGoal is issue 25's goal for the leave-one-group-out figure; logoFloor
// is what the test holds it to, below the goal while the corpus has too few
// sources for some rules (the report says which).
const (
	logoGoal  = 0.90
	logoFloor = 0.85
)

// logo runs the leave-one-group-out pass and returns its results and the
// rules that only one group supports.
func logo(t *testing.T, cases []realCase) ([]scored, map[string]string) {
	t.Helper()
	support := map[string]map[string]bool{}
	for _, c := range cases {
		fired := map[string]Cause{}
		if _, err := diagnose(bytes.NewReader(c.body), nil, fired); err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		for id, cause := range fired {
			if cause != c.want {
				continue
			}
			if support[id] == nil {
				support[id] = map[string]bool{}
			}
			support[id][group(c)] = true
		}
	}
	single := map[string]string{}
	for id, gs := range support {
		if len(gs) == 1 {
			for g := range gs {
				single[id] = g
			}
		}
	}
	var res []scored
	for _, c := range cases {
		off := map[string]bool{}
		for id, g := range single {
			if g == group(c) {
				off[id] = true
			}
		}
		rep, err := diagnose(bytes.NewReader(c.body), off, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		res = append(res, scored{file: c.file, source: group(c), want: c.want, got: rep.Cause, confidence: rep.Confidence, summary: rep.Summary})
	}
	return res, single
}

// answers counts what kind of answer each log got: no failure found,
// unknown, and a confident wrong cause (the one answer never to give).
func answers(res []scored) (none, unknown, confidentWrong int) {
	for _, r := range res {
		switch {
		case r.got == "":
			none++
		case r.got == CauseUnknown:
			unknown++
		case r.got != r.want && r.confidence == "high":
			confidentWrong++
		}
	}
	return
}

// TestDiagnoseReport scores Diagnose on the real corpus (with every rule,
// and leave-one-group-out) and on the synthetic one, and holds it to the
// goals of issues 16 and 25 on the real one. `make diagnose-report` runs it
// with -v to print the tables and the misses.
func TestDiagnoseReport(t *testing.T) {
	cases := loadReal(t)
	var res []scored
	groups := map[string]bool{}
	for _, c := range cases {
		lines := SplitLines(string(c.body))
		rep, err := Diagnose(bytes.NewReader(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		checkEvidence(t, lines, rep.Verdict)
		res = append(res, scored{file: c.file, source: c.source, want: c.want, got: rep.Cause, confidence: rep.Confidence, summary: rep.Summary})
		groups[group(c)] = true
	}
	recall, acc := confusion(t, "real corpus (testdata/real, Diagnose, every rule: the trained figure)", res)

	lres, single := logo(t, cases)
	_, lacc := confusion(t, fmt.Sprintf("real corpus, leave-one-group-out (%d groups)", len(groups)), lres)
	var b strings.Builder
	b.WriteString("\n" + logoMethod + "\n\nrules borne out by one group only (off when it is held out):\n")
	ids := make([]string, 0, len(single))
	for id := range single {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "  %-60q %s\n", id, single[id])
	}
	none, unknown, cw := answers(res)
	lnone, lunknown, lcw := answers(lres)
	fmt.Fprintf(&b, "\nanswers, every rule: %d no failure found, %d unknown, %d confidently wrong\n", none, unknown, cw)
	fmt.Fprintf(&b, "answers, leave-one-group-out: %d no failure found, %d unknown, %d confidently wrong\n", lnone, lunknown, lcw)
	goal := "met"
	if lacc < logoGoal {
		goal = "NOT met: each miss above is a rule only its own group bears out; real logs from other sources showing the same text would lift it"
	}
	fmt.Fprintf(&b, "\nSUMMARY trained %.1f %% (%d logs) · leave-one-group-out %.1f %% (%d groups) · issue 25's goal of %.0f %% %s\n",
		100*acc, len(res), 100*lacc, len(groups), 100*logoGoal, goal)
	t.Log(b.String())

	var syn []scored
	for _, c := range loadCorpus(t) {
		rep, err := Diagnose(bytes.NewReader(readLog(t, c.file)))
		if err != nil {
			t.Fatal(err)
		}
		syn = append(syn, scored{file: c.file, source: "synthetic", want: c.diagnose, got: rep.Cause, confidence: rep.Confidence, summary: rep.Summary})
	}
	synRecall, _ := confusion(t, "synthetic corpus (testdata/logs, Diagnose)", syn)

	if acc < 0.95 {
		t.Errorf("real corpus: %.1f %% right, want ≥ 95 %%", 100*acc)
	}
	if lacc < logoFloor {
		t.Errorf("real corpus, leave-one-group-out: %.1f %% right, want ≥ %.0f %%", 100*lacc, 100*logoFloor)
	}
	for _, rs := range [][]scored{res, lres} {
		for _, r := range rs {
			if r.want == "" && r.got != "" && r.got != CauseUnknown {
				t.Errorf("%s: a healthy log called %s", r.file, r.got)
			}
		}
	}
	if cw > 0 {
		t.Errorf("real corpus: %d confidently wrong answers, want none", cw)
	}
	for _, c := range []Cause{CauseOOM, CauseKVInsufficient, CauseConfigError, CauseCrash} {
		if r, ok := recall[c]; !ok || r < 0.90 {
			t.Errorf("real corpus: recall of %s %.0f %%, want ≥ 90 %% (and at least one log)", c, 100*r)
		}
	}
	for c, r := range synRecall {
		if r < 1 {
			t.Errorf("synthetic corpus: recall of %s %.0f %%, want 100 %%", causeName(c), 100*r)
		}
	}
}

// TestRealCorpusCoverage keeps the real corpus what issue 16 asks for: every
// cause and healthy logs, each with its source.
func TestRealCorpusCoverage(t *testing.T) {
	n := map[Cause]int{}
	cases := loadReal(t)
	for _, c := range cases {
		n[c.want]++
		if !strings.Contains(c.source, "/") {
			t.Errorf("%s: source %q names no repository", c.file, c.source)
		}
	}
	for _, c := range append([]Cause{""}, logCauses()...) {
		if n[c] == 0 {
			t.Errorf("real corpus has no log for %s", causeName(c))
		}
	}
	if len(cases) < 80 {
		t.Errorf("real corpus has %d logs, want ≥ 80", len(cases))
	}
	if n[""] < 10 {
		t.Errorf("real corpus has %d healthy logs, want ≥ 10", n[""])
	}
}

// TestLeaveOneGroupOut: a rule only its own group bears out is off when that
// group is held out; one that two groups bear out stays on.
func TestLeaveOneGroupOut(t *testing.T) {
	cublas := "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n"
	torchOOM := "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n"
	cases := []realCase{
		{file: "a.log", source: "x/a issue #1", era: "2025", want: CauseOOM, body: []byte(cublas)},
		{file: "b.log", source: "x/b issue #2", era: "2025", want: CauseOOM, body: []byte(torchOOM)},
		{file: "c.log", source: "x/c issue #3", era: "2025", want: CauseOOM, body: []byte(torchOOM)},
	}
	res, single := logo(t, cases)
	if single["CUBLAS_STATUS_ALLOC_FAILED"] != "x/a" {
		t.Errorf("single-group rules %v: want CUBLAS_STATUS_ALLOC_FAILED from x/a", single)
	}
	if _, ok := single["OutOfMemoryError"]; ok {
		t.Errorf("OutOfMemoryError is borne out by two groups, listed as single: %v", single)
	}
	got := map[string]Cause{}
	for _, r := range res {
		got[r.file] = r.got
	}
	// Without its own rule, a.log falls to the generic CUDA error: crash.
	if got["a.log"] != CauseCrash || got["b.log"] != CauseOOM || got["c.log"] != CauseOOM {
		t.Errorf("leave-one-group-out answers %v, want a crash, b and c oom", got)
	}
}

func TestGroup(t *testing.T) {
	for _, tc := range []struct{ source, era, want string }{
		{"vllm-project/vllm issue #759 https://github.com/vllm-project/vllm/issues/759 (comment by cduk, 2025-06-02)", "2025-06, V1, brackets", "vllm-project/vllm 2025-06"},
		{"vllm-project/vllm issue #2734 https://github.com/vllm-project/vllm/issues/2734", "2024, V0", "vllm-project/vllm 2024"},
		{"ray-project/ray issue #53845 https://github.com/ray-project/ray/issues/53845", "2025-06, V1", "ray-project/ray"},
		{"vllm-project/vllm-ascend issue #3717 https://github.com/vllm-project/vllm-ascend/issues/3717", "2025-12, V1", "vllm-project/vllm-ascend"},
	} {
		if got := group(realCase{source: tc.source, era: tc.era}); got != tc.want {
			t.Errorf("group(%q, %q) = %q, want %q", tc.source, tc.era, got, tc.want)
		}
	}
}
