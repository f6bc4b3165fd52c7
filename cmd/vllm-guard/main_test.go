package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func call(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = dispatch(args, &out, &errb)
	return code, out.String(), errb.String()
}

// Every way of asking for help prints it on stdout and exits 0.
func TestHelpOnStdoutExit0(t *testing.T) {
	asks := [][]string{{"--help"}, {"-h"}, {"help"}, {"profile", "--help"}, {"profile", "reset", "--help"}, {"help", "profile"}}
	for _, name := range commandNames() {
		asks = append(asks, []string{name, "--help"}, []string{name, "-h"}, []string{"help", name})
	}
	for _, args := range asks {
		code, out, errs := call(args...)
		if code != 0 || errs != "" || !strings.Contains(strings.ToLower(out), "usage") {
			t.Errorf("vllm-guard %s: exit %d, stderr %q, stdout %q; want the usage on stdout, exit 0",
				strings.Join(args, " "), code, errs, out)
		}
	}
}

// Usage errors go to stderr with exit 2 (exitcode.Usage), never 3 (no
// guard) or 0.
func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{}, {"nosuch"}, {"help", "nosuch"}, {"profile"}, {"profile", "rest"}, {"completion"}, {"completion", "fish"},
		{"run", "--bogus"}, {"check", "--bogus"}, {"status", "--bogus"}, {"incidents", "--bogus"}, {"restart", "--bogus"},
		{"profile", "reset", "--bogus"}, {"diagnose", "--bogus"}, {"drill", "--bogus"}, {"gpus", "--bogus"}, {"version", "--bogus"},
		{"run", "--instance", "../etc"}, {"check", "--instance", "a/b"}, {"status", "--instance", ".x"}, {"gpus", "--instance", "a b"},
		{"diagnose", "--instance", "../x"},
	} {
		code, out, errs := call(args...)
		if code != 2 || out != "" || errs == "" {
			t.Errorf("vllm-guard %s: exit %d, stdout %q, stderr %q; want exit 2 with the error on stderr", strings.Join(args, " "), code, out, errs)
		}
	}
}

func TestVersionFlag(t *testing.T) {
	code, want, _ := call("version")
	if code != 0 || !regexp.MustCompile(`^vllm-guard \S+\nrevision \S+\ngo1\.`).MatchString(want) {
		t.Fatalf("version: exit %d\n%s", code, want)
	}
	for _, flag := range []string{"--version", "-version", "-v"} {
		if code, got, _ := call(flag); code != 0 || got != want {
			t.Errorf("%s: exit %d, %q; want the same as `version`: %q", flag, code, got, want)
		}
	}
}

// The instance's config file is the default, and the error names it.
func TestInstanceConfigIsTheDefault(t *testing.T) {
	t.Setenv("VLLM_GUARD_CONFIG", "")
	code, _, errs := call("check", "--instance", "nosuch-vg-test")
	if code != 78 || !strings.Contains(errs, "/etc/vllm-guard/nosuch-vg-test.toml") {
		t.Errorf("check --instance: exit %d, want 78 naming the instance's file\n%s", code, errs)
	}
	t.Setenv("VLLM_GUARD_INSTANCE", "nosuch-vg-env")
	if code, _, errs := call("check"); code != 78 || !strings.Contains(errs, "/etc/vllm-guard/nosuch-vg-env.toml") {
		t.Errorf("check with $VLLM_GUARD_INSTANCE: exit %d\n%s", code, errs)
	}
	// --config still wins, and the instance's defaults show in the
	// effective settings.
	cfg := filepath.Join(t.TempDir(), "a.toml")
	os.WriteFile(cfg, []byte("[vllm]\ncommand = [\"vllm\", \"serve\", \"m\"]\n"), 0o600)
	code, out, errs := call("check", "--config", cfg, "--instance", "gpu1")
	if code != 0 || !strings.Contains(out, `"/run/vllm-guard/gpu1.sock"`) || !strings.Contains(out, `"/var/lib/vllm-guard/gpu1"`) {
		t.Errorf("check --config --instance: exit %d, want the instance's socket and state folder\n%s\n%s", code, out, errs)
	}
	if strings.Contains(out, "warning: instance") {
		t.Errorf("a file that leaves socket and state_dir to the instance is warned about:\n%s", out)
	}
	// A copy of the example (it writes every key, the single guard's
	// socket and state folder included) would make instances collide.
	code, out, _ = call("check", "--config", filepath.Join("..", "..", "vllm-guard.toml"), "--instance", "gpu1")
	if code != 0 || !strings.Contains(out, "warning: instance gpu1: [control] socket is /run/vllm-guard/guard.sock") ||
		!strings.Contains(out, "warning: instance gpu1: [control] state_dir is /var/lib/vllm-guard,") {
		t.Errorf("check of the example as an instance: exit %d, want warnings for socket and state_dir\n%s", code, out)
	}
}

// helpFlags are the flags a command's --help lists: the flag package's
// "  -name" lines, else (drill) the --name words of its synopsis.
func helpFlags(t *testing.T, args ...string) []string {
	t.Helper()
	_, out, _ := call(append(args, "--help")...)
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)`).FindAllStringSubmatch(out, -1) {
		got = append(got, m[1])
	}
	if len(got) == 0 {
		synopsis, _, _ := strings.Cut(out, "\n\n")
		for _, m := range regexp.MustCompile(`--([a-z-]+)`).FindAllStringSubmatch(synopsis, -1) {
			got = append(got, m[1])
		}
	}
	for i, f := range got {
		if len(f) == 1 {
			got[i] = "-" + f
		} else {
			got[i] = "--" + f
		}
	}
	slices.Sort(got)
	return slices.Compact(got)
}

// Completion offers exactly the flags each command takes.
func TestCompletionMatchesTheCommands(t *testing.T) {
	for _, c := range completions {
		if c.name == "profile" || c.name == "completion" || c.name == "help" {
			continue
		}
		want := helpFlags(t, c.name)
		got := slices.Sorted(slices.Values(c.words))
		if !slices.Equal(got, want) {
			t.Errorf("completion of %s offers %v; its --help lists %v", c.name, got, want)
		}
	}
	if got, want := slices.Sorted(slices.Values(profileResetFlags)), helpFlags(t, "profile", "reset"); !slices.Equal(got, want) {
		t.Errorf("completion of profile reset offers %v; its --help lists %v", got, want)
	}
	for _, name := range []string{"run", "check", "status", "incidents", "restart", "diagnose", "drill", "gpus"} {
		if !strings.Contains(usage, "\n  vllm-guard "+name+" ") {
			t.Errorf("vllm-guard --help does not list %s", name)
		}
	}
}

func script(t *testing.T, shell string) string {
	t.Helper()
	code, out, errs := call("completion", shell)
	if code != 0 || errs != "" {
		t.Fatalf("completion %s: exit %d\n%s", shell, code, errs)
	}
	p := filepath.Join(t.TempDir(), "vllm-guard."+shell)
	if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func shellRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found in PATH: install Debian's package %s, or run scripts/setup.sh", name, name)
	}
	out, err := exec.Command(p, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The bash script parses, and completing it in a real bash offers the
// command names, a command's flags, and profile's subcommand.
func TestBashCompletion(t *testing.T) {
	p := script(t, "bash")
	shellRun(t, "bash", "-n", p)
	for _, c := range []struct {
		words string
		want  []string
	}{
		{"vllm-guard st", []string{"status"}},
		{"vllm-guard ''", commandNames()},
		{"vllm-guard status --a", []string{"--all"}},
		{"vllm-guard run --i", []string{"--init", "--instance"}},
		{"vllm-guard profile r", []string{"reset"}},
		{"vllm-guard profile reset --s", []string{"--socket"}},
		{"vllm-guard help dr", []string{"drill"}},
		{"vllm-guard completion ''", []string{"bash", "zsh"}},
	} {
		prog := "source " + p + "\nCOMP_WORDS=(" + c.words + ")\nCOMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n_vllm_guard\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
		got := strings.Fields(shellRun(t, "bash", "-c", prog))
		for _, w := range c.want {
			if !slices.Contains(got, w) {
				t.Errorf("completing %q: %v lacks %q", c.words, got, w)
			}
		}
		if strings.HasSuffix(c.words, "st") && len(got) != 1 {
			t.Errorf("completing %q: %v, want only status", c.words, got)
		}
	}
	if !strings.Contains(shellRun(t, "bash", "-c", "source "+p+"\ncomplete -p vllm-guard"), "-F _vllm_guard") {
		t.Error("the script does not register _vllm_guard for vllm-guard")
	}
}

// The zsh script parses, and run with compadd stubbed (zsh's completion
// builtins exist only inside a completion widget) it offers the same.
func TestZshCompletion(t *testing.T) {
	p := script(t, "zsh")
	shellRun(t, "zsh", "-n", p)
	for _, c := range []struct {
		words string
		want  []string
	}{
		{"vllm-guard st", commandNames()}, // zsh's compadd filters by the prefix itself
		{"vllm-guard status --a", []string{"--all", "--watch"}},
		{"vllm-guard profile r", []string{"reset"}},
		{"vllm-guard profile reset --s", []string{"--socket", "--instance"}},
	} {
		prog := "compadd() { shift; print -rl -- \"$@\" }\ncompdef() { }\n_files() { }\nsource " + p + "\nwords=(" + c.words + ")\nCURRENT=${#words}\n_vllm_guard\n"
		got := strings.Fields(shellRun(t, "zsh", "-f", "-c", prog))
		for _, w := range c.want {
			if !slices.Contains(got, w) {
				t.Errorf("completing %q: %v lacks %q", c.words, got, w)
			}
		}
	}
}

// A build stamped as the Makefile and the Dockerfile stamp it says so in
// --version (a -X on a variable that does not exist would be ignored).
func TestStampedBuildSaysItsVersion(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	bin := filepath.Join(t.TempDir(), "vllm-guard")
	const pkg = "github.com/vllm-guard/vllm-guard/internal/buildinfo"
	build := exec.Command(goBin, "build", "-ldflags", "-X "+pkg+".Version=v9.8.7-test -X "+pkg+".Revision=0123abcd", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "vllm-guard v9.8.7-test\nrevision 0123abcd\n") {
		t.Errorf("--version of a stamped build: %v\n%s", err, out)
	}
}

// TestCheckReadsVLLMsCommandLineAsVLLMDoes: the stop timeout in every
// spelling from the extra arguments, and a --config YAML with a nested map
// (issue 23: "SIGKILL after 30s" for -- --shutdown_timeout=120; exit 78
// for a compilation config).
func TestCheckReadsVLLMsCommandLineAsVLLMDoes(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "g.toml")
	os.WriteFile(cfg, []byte("[vllm]\ncommand = [\"vllm\", \"serve\", \"--config\", \"c.yaml\"]\nworkdir = \""+dir+"\"\n"+
		"[control]\nstate_dir = \""+dir+"/state\"\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("model: org/m\nserved-model-name: [alpha, beta]\ncompilation-config:\n  level: 3\n"), 0o600)
	code, out, errs := call("check", "--config", cfg, "--", "--shutdown_timeout=120")
	if code != 0 {
		t.Fatalf("check: exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(out, "effective stop timeout: 130s") {
		t.Errorf("check -- --shutdown_timeout=120: want an effective stop timeout of 130s\n%s", out)
	}
	if !strings.Contains(out, `served names:   "alpha", "beta"`) {
		t.Errorf("check with a nested --config map: want the names from the file\n%s", out)
	}
}

// With [group], check shows the command run runs, the group's flags
// added, and refuses extra arguments that contradict the group (issue 44).
func TestCheckShowsTheGroupsFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "g.toml")
	os.WriteFile(cfg, []byte("[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"-tp\", \"2\"]\n"+
		"[control]\nstate_dir = \""+dir+"/state\"\n[group]\nenabled = true\nrank = 1\nsize = 2\nleader_address = \"10.0.0.1\"\nsecret_file = \"/s\"\n"), 0o600)
	code, out, errs := call("check", "--config", cfg)
	if code != 0 {
		t.Fatalf("check: exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(out, "--nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29501 --headless") {
		t.Errorf("check does not show the group's flags:\n%s", out)
	}
	code, _, errs = call("check", "--config", cfg, "--", "--node-rank", "0")
	if code != 78 || !strings.Contains(errs, "--node-rank 0, and the group ([group] rank) needs 1") {
		t.Errorf("check -- --node-rank 0 on rank 1: exit %d, %s; want 78 naming the flag", code, errs)
	}
}

// vLLM reads --api-ke as --api-key (argparse's abbreviations): `check`
// masks it wherever it prints the command line, from the config and from
// the extra arguments (issue 32 item 3).
func TestCheckMasksAnAbbreviatedAPIKey(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "g.toml")
	os.WriteFile(cfg, []byte("[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"--api-ke\", \"sk-abbrev-cmd-0001\"]\n"+
		"[control]\nstate_dir = \""+dir+"/state\"\n"), 0o600)
	code, out, errs := call("check", "--config", cfg, "--", "--hf_tok=hf-abbrev-extra-0002")
	if code != 0 {
		t.Fatalf("check: exit %d\n%s\n%s", code, out, errs)
	}
	for _, s := range []string{"sk-abbrev-cmd-0001", "hf-abbrev-extra-0002"} {
		if strings.Contains(out+errs, s) {
			t.Errorf("check prints %q:\n%s%s", s, out, errs)
		}
	}
	if !strings.Contains(out, `"--api-ke", "***"`) || !strings.Contains(out, "--api-ke *** --hf_tok=***") {
		t.Errorf("check output does not show the masked flags:\n%s", out)
	}
}

// check prints no secret (issue 41 item 7): not one in an environment
// variable whose name says nothing (MY_CREDS, found by its shape), not the
// second value of a flag that takes two (--api-key k1 k2 in vLLM's
// command, an alert command's, the extra arguments').
func TestCheckMasksEverySecret(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "g.toml")
	secrets := []string{"Zx9pQ7rT2mVb8LkW4nHs6YdC3fJa1GeU", "hunter2-cred", "first-cmd-key-01", "second-cmd-key-02",
		"first-alert-key-03", "second-alert-key-04", "second-extra-key-05", "lorapass-06", "Qm7xT2vK9pL4wZ8nR3bY6hJ1"}
	os.WriteFile(cfg, []byte(`[vllm]
command = ["vllm", "serve", "m", "--api-key", "first-cmd-key-01", "second-cmd-key-02", "--port", "8000"]
env = { MY_CREDS = "Zx9pQ7rT2mVb8LkW4nHs6YdC3fJa1GeU", DB_CREDENTIALS = "hunter2-cred", CUDA_VISIBLE_DEVICES = "0,1" }
[alerts]
command = ["notify", "--api-key", "first-alert-key-03", "second-alert-key-04"]
[control]
state_dir = "`+dir+`/state"
`), 0o600)
	code, out, errs := call("check", "--config", cfg, "--", "--api-key", "first-extra", "second-extra-key-05",
		"--lora-modules", "a=https://user:lorapass-06@hub.example/a", "--middleware", "m.Auth:Qm7xT2vK9pL4wZ8nR3bY6hJ1")
	if code != 0 {
		t.Fatalf("check: exit %d\n%s\n%s", code, out, errs)
	}
	for _, s := range secrets {
		if strings.Contains(out+errs, s) {
			t.Errorf("check prints %q", s)
		}
	}
	for _, want := range []string{`MY_CREDS = "***"`, `CUDA_VISIBLE_DEVICES = "0,1"`, `"--api-key", "***", "***", "--port"`,
		`command = ["notify", "--api-key", "***", "***"]`, "--api-key *** *** --port 8000 --api-key *** ***"} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("check's output:\n%s%s", out, errs)
	}
}

// check shows the weight cache daemon's command as `run` derives it
// (secrets masked), vLLM's with --load-format ipc_cache added for cache =
// "daemon"; a vLLM command the daemon's cannot be derived from is exit 78.
func TestCheckShowsTheWeightCacheDaemon(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "g.toml")
	os.WriteFile(cfg, []byte("[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"-tp\", \"2\", \"--hf-token\", \"hf-daemon-secret-0007\"]\n"+
		"[control]\nstate_dir = \""+dir+"/state\"\n[weights]\ncache = \"daemon\"\n"), 0o600)
	code, out, errs := call("check", "--config", cfg)
	if code != 0 {
		t.Fatalf("check: exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(out, "vllm preload --model m --tensor-parallel-size 2 --hf-token ***") ||
		!strings.Contains(out, "--load-format ipc_cache --max-num-seqs") || strings.Contains(out+errs, "hf-daemon-secret-0007") {
		t.Errorf("check with [weights] cache = \"daemon\":\n%s", out)
	}
	os.WriteFile(cfg, []byte("[vllm]\ncommand = [\"./start.sh\", \"m\"]\n[control]\nstate_dir = \""+dir+"/state\"\n[weights]\ncache = \"daemon\"\n"), 0o600)
	if code, out, errs := call("check", "--config", cfg); code != 78 || !strings.Contains(errs, "[weights] cache: cannot tell how to run `vllm preload`") {
		t.Errorf("an underivable command: exit %d\n%s\n%s", code, out, errs)
	}
}
