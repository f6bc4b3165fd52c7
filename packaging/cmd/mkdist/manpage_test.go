package main

import (
	"strings"
	"testing"
)

func TestParseListLine(t *testing.T) {
	for _, c := range []struct{ line, path, synopsis, summary string }{
		{"  vllm-guard run [--config FILE] [--init] [-- EXTRA_VLLM_ARGS...]   supervise vLLM (the main job)",
			"run", "[--config FILE] [--init] [-- EXTRA_VLLM_ARGS...]", "supervise vLLM (the main job)"},
		{"  vllm-guard profile reset                     back to rung 0 at the next start",
			"profile reset", "", "back to rung 0 at the next start"},
		{"  vllm-guard status --all                     one line per guard on this host",
			"status", "--all", "one line per guard on this host"},
		{"  vllm-guard completion bash|zsh              a shell completion script",
			"completion", "bash|zsh", "a shell completion script"},
		// One space only before the summary: the first lower-case word outside brackets starts it.
		{"  vllm-guard diagnose [--log FILE|-] [--json] classify a vLLM log offline: cause, evidence",
			"diagnose", "[--log FILE|-] [--json]", "classify a vLLM log offline: cause, evidence"},
		{"  vllm-guard version", "version", "", ""},
	} {
		got, err := parseListLine(c.line)
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		if got.path != c.path || got.synopsis != c.synopsis || got.summary != c.summary {
			t.Errorf("%q:\n got path %q synopsis %q summary %q\nwant path %q synopsis %q summary %q",
				c.line, got.path, got.synopsis, got.summary, c.path, c.synopsis, c.summary)
		}
	}
	for _, bad := range []string{"  run [--config FILE]   supervise", "  vllm-guard [--flag]   no command"} {
		if _, err := parseListLine(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestParseTop(t *testing.T) {
	top, err := parseTop(`tool keeps things: it does.

Usage:
  vllm-guard run [--x]      runs
  vllm-guard status         shows
  vllm-guard status --all   shows all

A note about instances.

Exit codes:
  0   done
`)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, c := range top.commands {
		paths = append(paths, c.path)
	}
	if strings.Join(paths, ",") != "run,status" {
		t.Errorf("commands %q; want run,status (status once)", paths)
	}
	if len(top.intro) != 1 || len(top.notes) != 1 || top.notes[0] != "A note about instances." {
		t.Errorf("intro %q notes %q; want the first paragraph, then the note (not the exit codes)", top.intro, top.notes)
	}
	if _, err := parseTop("no list here\n"); err == nil || !strings.Contains(err.Error(), "Usage:") {
		t.Errorf("help with no list: %v; want an error naming the Usage: paragraph", err)
	}
}

func TestRoffEscapes(t *testing.T) {
	for in, want := range map[string]string{
		`--config C:\x`:  `\-\-config C:\ex`,
		".hidden file":   `\&.hidden file`,
		"'quoted":        `\&'quoted`,
		"GPU memory · ≥": `GPU memory \[u00B7] \[u2265]`,
	} {
		if got := roff(in); got != want {
			t.Errorf("roff(%q) = %q; want %q", in, got, want)
		}
	}
	if got := roffArg(`say "hi"`); got != `"say \(dqhi\(dq"` {
		t.Errorf("roffArg: %q", got)
	}
	if got := markdown("`status --all`: every `x`"); got != `\fBstatus \-\-all\fR: every \fBx\fR` {
		t.Errorf("markdown: %q", got)
	}
}

func TestWriteParagraphFlags(t *testing.T) {
	var b strings.Builder
	writeParagraph(&b, "  -config string\n    \tconfig file\n    \tsecond line\n  -init\n    \tact as an init\n  -n int\n    \thow many (default 20)\n  -q\tquiet")
	want := `.TP
.BI "\-\-config " "string"
config file
second line
.TP
.B "\-\-init"
act as an init
.TP
.BI "\-n " "int"
how many (default 20)
.TP
.B "\-q"
quiet
`
	if b.String() != want {
		t.Errorf("flags:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	writeParagraph(&b, "  bash:  one\n         (or: two)")
	if want := ".PP\n.RS 2\n.nf\nbash:  one\n       (or: two)\n.fi\n.RE\n"; b.String() != want {
		t.Errorf("indented block:\n%q\nwant\n%q", b.String(), want)
	}
}

func TestReadExitCodes(t *testing.T) {
	rows, after, err := readExitCodes([]byte("# x\n### Exit codes\n\n| code | meaning |\n|---|---|\n| `0` | done; `--help` |\n| `78` | config |\n\n`incidents` too.\n\n### Next\n| `5` | not this |\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0] != (exitRow{"0", "done; `--help`"}) || rows[1].code != "78" {
		t.Errorf("rows %q", rows)
	}
	if len(after) != 1 || after[0] != "`incidents` too." {
		t.Errorf("after %q", after)
	}
	if _, _, err := readExitCodes([]byte("# README\nno table\n")); err == nil || !strings.Contains(err.Error(), "### Exit codes") {
		t.Errorf("no table: %v; want an error naming the heading", err)
	}
}

func TestPackagedUnit(t *testing.T) {
	got, err := packagedUnit("u", []byte("# install to /usr/local/bin/vllm-guard\n[Service]\nExecStart=/usr/local/bin/vllm-guard run --instance %i\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "# install to /usr/local/bin/vllm-guard\n[Service]\nExecStart=/usr/bin/vllm-guard run --instance %i\n"
	if string(got) != want {
		t.Errorf("got %q; want %q", got, want)
	}
	if _, err := packagedUnit("u", []byte("[Service]\nExecStart=/opt/other run\n")); err == nil || !strings.Contains(err.Error(), "ExecStart") {
		t.Errorf("a unit running something else: %v; want an error naming ExecStart", err)
	}
}
