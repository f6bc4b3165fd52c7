package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// The man page is vllm-guard(1), written from the binary's own help so it
// never drifts from it: `vllm-guard --help` gives the description and the
// list of commands, each command's --help its synopsis and its section,
// the README's exit-code table the EXIT STATUS. Only FILES and SEE ALSO
// are written here.

// command is one line of the list in `vllm-guard --help`.
type command struct {
	path     string   // "status", "profile reset"
	synopsis string   // its arguments in the list: "[--json] [--watch]"
	summary  string   // what the list says it does (may be empty)
	usage    []string // the Usage: lines of its own --help
	body     []string // the paragraphs after them
}

// topHelp is `vllm-guard --help`, read into parts.
type topHelp struct {
	intro    []string // the paragraphs before the list of commands
	commands []*command
	notes    []string // the paragraphs after it (not the exit codes: the README has them in full)
}

// runHelp runs the binary and returns what it printed on stdout; --help
// exits 0. A minute is plenty: help is printed before anything else runs.
func runHelp(binary string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%v: %s", err, msg)
		}
		return "", fmt.Errorf("%s %s: %v", binary, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// paragraphs splits help text at its blank lines.
func paragraphs(text string) []string {
	var out []string
	for _, p := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n\n") {
		lines := strings.Split(strings.Trim(p, "\n"), "\n")
		for i, l := range lines {
			lines[i] = strings.TrimRight(l, " ")
		}
		if p := strings.Join(lines, "\n"); strings.TrimSpace(p) != "" {
			out = append(out, p)
		}
	}
	return out
}

var (
	pathWord = regexp.MustCompile(`^[a-z]+$`)
	// A word that starts the summary on a list line with a single space
	// before it: lower case, outside brackets, after the arguments.
	summaryWord = regexp.MustCompile(`^[a-z][a-z,;]*$`)
)

// parseTop reads `vllm-guard --help`: the paragraph that starts with
// "Usage:" lists the commands, one "  vllm-guard PATH ARGS  SUMMARY" a
// line; a command listed twice (status, status --all) is one command.
func parseTop(text string) (*topHelp, error) {
	top := &topHelp{}
	seen := map[string]bool{}
	list := false
	for _, p := range paragraphs(text) {
		first, rest, _ := strings.Cut(p, "\n")
		switch {
		case first == "Usage:":
			list = true
			for _, line := range strings.Split(rest, "\n") {
				c, err := parseListLine(line)
				if err != nil {
					return nil, err
				}
				if !seen[c.path] {
					seen[c.path] = true
					top.commands = append(top.commands, c)
				}
			}
		case !strings.HasPrefix(first, " ") && strings.HasSuffix(first, ":"):
			// A titled block such as "Exit codes:": the README's table is fuller.
		case list:
			top.notes = append(top.notes, p)
		default:
			top.intro = append(top.intro, p)
		}
	}
	if len(top.commands) == 0 {
		return nil, fmt.Errorf(`vllm-guard --help has no "Usage:" paragraph listing the commands ("  vllm-guard COMMAND ..." lines)`)
	}
	return top, nil
}

// parseListLine reads "  vllm-guard status [--json] [--watch]   state of a
// running guard": the command's path is its leading lower-case words, the
// summary follows two spaces (or, when only one space comes before it, is
// the first lower-case word outside brackets after the arguments).
func parseListLine(line string) (*command, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "vllm-guard ")
	if !ok {
		return nil, fmt.Errorf("vllm-guard --help: %q in the list of commands does not start with \"vllm-guard \"", line)
	}
	var words []string
	synopsis, summary, split := strings.Cut(rest, "  ")
	if split {
		words = strings.Fields(synopsis)
	} else {
		words = strings.Fields(rest)
	}
	c := &command{}
	n := 0
	for n < len(words) && pathWord.MatchString(words[n]) {
		n++
	}
	c.path = strings.Join(words[:n], " ")
	if c.path == "" {
		return nil, fmt.Errorf("vllm-guard --help: %q in the list of commands names no command", line)
	}
	if split {
		c.synopsis = strings.Join(words[n:], " ")
		c.summary = strings.TrimSpace(summary)
		return c, nil
	}
	depth, end := 0, len(words)
	for i := n; i < len(words); i++ {
		if depth == 0 && summaryWord.MatchString(words[i]) {
			end = i
			break
		}
		depth += strings.Count(words[i], "[") - strings.Count(words[i], "]")
	}
	c.synopsis = strings.Join(words[n:end], " ")
	c.summary = strings.Join(words[end:], " ")
	return c, nil
}

// readCommand fills in a command from its own --help: the Usage: lines
// (a continuation line is one that does not start with "vllm-guard"),
// then the rest.
func readCommand(binary string, c *command) error {
	if c.path == "help" {
		// `vllm-guard help --help` is the page's own top: the list line says it all.
		c.usage = []string{strings.TrimSpace("vllm-guard help " + c.synopsis)}
		return nil
	}
	text, err := runHelp(binary, append(strings.Fields(c.path), "--help")...)
	if err != nil {
		return err
	}
	ps := paragraphs(text)
	if len(ps) == 0 || !strings.HasPrefix(strings.ToLower(ps[0]), "usage:") {
		return fmt.Errorf("vllm-guard %s --help: the first paragraph is not its Usage: line", c.path)
	}
	for _, line := range strings.Split(ps[0][len("usage:"):], "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "vllm-guard") || len(c.usage) == 0 {
			c.usage = append(c.usage, line)
		} else {
			c.usage[len(c.usage)-1] += " " + line
		}
	}
	c.body = ps[1:]
	return nil
}

// exitRow is one row of the README's exit-code table.
type exitRow struct{ code, meaning string }

var exitTableRow = regexp.MustCompile("^\\|\\s*`([0-9]+)`\\s*\\|(.*)\\|\\s*$")

// readExitCodes reads the table under "### Exit codes" in the README, and
// the prose after it up to the next heading.
func readExitCodes(readme []byte) ([]exitRow, []string, error) {
	var rows []exitRow
	var after []string
	in := false
	for _, line := range strings.Split(string(readme), "\n") {
		switch {
		case strings.TrimSpace(line) == "### Exit codes":
			in = true
		case !in:
		case strings.HasPrefix(line, "#"):
			in = false
		case exitTableRow.MatchString(line):
			m := exitTableRow.FindStringSubmatch(line)
			rows = append(rows, exitRow{m[1], strings.TrimSpace(m[2])})
		case len(rows) > 0 && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "|"):
			after = append(after, strings.TrimSpace(line))
		}
	}
	if len(rows) == 0 {
		return nil, nil, fmt.Errorf("README.md: no exit-code table under \"### Exit codes\" (rows like | `0` | meaning |)")
	}
	return rows, after, nil
}

// roff escapes text for a roff text line: backslashes, hyphens as minus
// signs (so options copy and paste as typed), anything beyond ASCII as a
// named Unicode character, and a leading dot or quote that roff would read
// as a request.
func roff(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\e`)
		case r == '-':
			b.WriteString(`\-`)
		case r > '~' || (r < ' ' && r != '\t'):
			fmt.Fprintf(&b, `\[u%04X]`, r)
		default:
			b.WriteRune(r)
		}
	}
	out := b.String()
	if strings.HasPrefix(out, ".") || strings.HasPrefix(out, "'") {
		out = `\&` + out
	}
	return out
}

// roffArg is roff text as one quoted argument of a request or macro.
func roffArg(s string) string {
	return `"` + strings.ReplaceAll(roff(s), `"`, `\(dq`) + `"`
}

// markdown renders a line of the README: `code` in bold.
func markdown(s string) string {
	parts := strings.Split(s, "`")
	var b strings.Builder
	for i, p := range parts {
		if i%2 == 1 && i < len(parts)-1 {
			b.WriteString(`\fB` + strings.TrimPrefix(roff(p), `\&`) + `\fR`)
		} else {
			b.WriteString(strings.TrimPrefix(roff(p), `\&`))
		}
	}
	out := b.String()
	if strings.HasPrefix(out, ".") || strings.HasPrefix(out, "'") {
		out = `\&` + out
	}
	return out
}

var (
	// "  -config string" or "  -init" or "  -x\tusage": a flag in Go's
	// flag.PrintDefaults layout; its usage follows on "    \t" lines.
	flagLine  = regexp.MustCompile(`^  -([A-Za-z0-9][-A-Za-z0-9_]*)(?: ([A-Za-z0-9_]+))?(?:\t(.*))?$`)
	flagUsage = regexp.MustCompile(`^    \t(.*)$`)
)

// writeParagraph writes one paragraph of help: a flag list as tagged
// paragraphs, plain prose filled, anything indented as it was.
func writeParagraph(b *strings.Builder, p string) {
	lines := strings.Split(p, "\n")
	switch {
	case flagLine.MatchString(lines[0]):
		for _, line := range lines {
			if m := flagLine.FindStringSubmatch(line); m != nil {
				name := "--" + m[1]
				if len(m[1]) == 1 {
					name = "-" + m[1]
				}
				b.WriteString(".TP\n")
				if m[2] != "" {
					fmt.Fprintf(b, ".BI %s %s\n", roffArg(name+" "), roffArg(m[2]))
				} else {
					fmt.Fprintf(b, ".B %s\n", roffArg(name))
				}
				if m[3] != "" {
					b.WriteString(roff(m[3]) + "\n")
				}
			} else if m := flagUsage.FindStringSubmatch(line); m != nil {
				b.WriteString(roff(m[1]) + "\n")
			} else {
				b.WriteString(roff(strings.TrimSpace(line)) + "\n")
			}
		}
	case !indented(lines):
		b.WriteString(".PP\n")
		for _, line := range lines {
			b.WriteString(roff(line) + "\n")
		}
	default:
		b.WriteString(".PP\n.RS 2\n.nf\n")
		cut := commonIndent(lines)
		for _, line := range lines {
			if len(line) >= cut {
				line = line[cut:]
			}
			b.WriteString(roff(line) + "\n")
		}
		b.WriteString(".fi\n.RE\n")
	}
}

func indented(lines []string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, " ") || strings.HasPrefix(l, "\t") {
			return true
		}
	}
	return false
}

func commonIndent(lines []string) int {
	cut := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, " "))
		if cut < 0 || n < cut {
			cut = n
		}
	}
	return max(cut, 0)
}

// files are the paths the page's FILES section names.
var manFiles = []struct{ path, what string }{
	{"/etc/vllm-guard/vllm-guard.toml", "the configuration (`vllm-guard check` validates it); every key is in the commented example the package installs, mode 0640, group vllm (it may hold API keys)"},
	{"/etc/vllm-guard/NAME.toml", "the configuration of instance NAME (`--instance NAME`)"},
	{"/etc/vllm-guard/env, /etc/vllm-guard/NAME.env", "environment for the systemd units, such as HF_TOKEN (mode 0600)"},
	{"/run/vllm-guard/guard.sock, /run/vllm-guard/NAME.sock", "the control socket `status`, `restart` and `profile reset` talk to"},
	{"/var/lib/vllm-guard, /var/lib/vllm-guard/NAME", "the state: state.json (the rung in force) and incidents/"},
	{"vllm-guard.service, vllm-guard@.service", "the systemd units, in /lib/systemd/system (the .deb) or /usr/lib/systemd/system (the .rpm): one guard, or one per instance (`systemctl enable --now vllm-guard@NAME`); vllm-guard-nvidia-uvm.service, which they pull in, loads nvidia-uvm first as root"},
	{"/usr/share/doc/vllm-guard/README.md", "the full guide"},
}

// manPage writes vllm-guard(1) for this binary.
func manPage(binary, version string, date time.Time, readme []byte) ([]byte, error) {
	text, err := runHelp(binary, "--help")
	if err != nil {
		return nil, err
	}
	top, err := parseTop(text)
	if err != nil {
		return nil, err
	}
	for _, c := range top.commands {
		if err := readCommand(binary, c); err != nil {
			return nil, err
		}
	}
	codes, codesAfter, err := readExitCodes(readme)
	if err != nil {
		return nil, err
	}

	var b strings.Builder
	b.WriteString(`.\" vllm-guard(1), written by packaging/cmd/mkdist from the help of the` + "\n")
	b.WriteString(`.\" binary: change the help texts in cmd/vllm-guard, not this page.` + "\n")
	fmt.Fprintf(&b, ".TH VLLM\\-GUARD 1 %s %s %s\n", roffArg(date.UTC().Format("2006-01-02")),
		roffArg("vllm-guard "+version), roffArg("User Commands"))
	// Left-aligned and unhyphenated: paths, flags and names copy as typed.
	b.WriteString(".ad l\n.nh\n")

	b.WriteString(".SH NAME\n")
	name := "supervises vLLM"
	if len(top.intro) > 0 {
		first := strings.Join(strings.Fields(top.intro[0]), " ")
		first = strings.TrimPrefix(first, "vllm-guard ")
		if i := strings.IndexAny(first, ":."); i > 0 {
			first = first[:i]
		}
		name = first
	}
	b.WriteString(`vllm\-guard \- ` + roff(name) + "\n")

	b.WriteString(".SH SYNOPSIS\n")
	for _, c := range top.commands {
		for _, u := range c.usage {
			name, args := "vllm-guard", strings.TrimPrefix(u, "vllm-guard")
			if rest, ok := strings.CutPrefix(args, " "+c.path); ok {
				name, args = name+" "+c.path, rest
			}
			fmt.Fprintf(&b, ".SY %s\n%s\n.YS\n", roffArg(name), roff(strings.TrimSpace(args)))
		}
	}

	b.WriteString(".SH DESCRIPTION\n")
	for _, p := range append(append([]string{}, top.intro...), top.notes...) {
		writeParagraph(&b, p)
	}

	b.WriteString(".SH COMMANDS\n")
	for _, c := range top.commands {
		fmt.Fprintf(&b, ".SS %s\n", roffArg("vllm-guard "+c.path))
		if c.summary != "" {
			b.WriteString(".PP\n" + roff(upperFirst(c.summary)) + ".\n")
		}
		for _, p := range c.body {
			writeParagraph(&b, p)
		}
	}

	b.WriteString(".SH EXIT STATUS\n")
	for _, r := range codes {
		fmt.Fprintf(&b, ".TP\n.B %s\n%s\n", r.code, markdown(r.meaning))
	}
	if len(codesAfter) > 0 {
		b.WriteString(".PP\n")
		for _, l := range codesAfter {
			b.WriteString(markdown(l) + "\n")
		}
	}

	b.WriteString(".SH FILES\n")
	for _, f := range manFiles {
		fmt.Fprintf(&b, ".TP\n.I %s\n%s\n", roffArg(f.path), markdown(f.what))
	}

	b.WriteString(".SH SEE ALSO\n")
	b.WriteString(".BR systemctl (1),\n.BR journalctl (1),\n.BR systemd.service (5)\n")
	b.WriteString(".PP\n" + roff(homepage) + "\n")
	return []byte(b.String()), nil
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
