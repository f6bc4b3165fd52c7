// Command mkdist packages a built vllm-guard for release (`make dist`):
//
//	dist/vllm-guard_VERSION_linux_ARCH.tar.gz   the binary, LICENSE, README.md, the two
//	                                            unit files, vllm-guard.toml, the man page
//	dist/vllm-guard_VERSION_ARCH.deb            installs to /usr/bin, /lib/systemd/system,
//	dist/vllm-guard-VERSION-1.RPMARCH.rpm       /etc/vllm-guard, /usr/share/{man,doc,...}
//	dist/SHA256SUMS                             for `sha256sum -c`
//
// VERSION is the package version packageVersion makes of the version the
// binary is stamped with; ARCH is the one it was built for. The man page
// is written from the binary's own help, so the binary must run here.
//
// Usage (from packaging/):
//
//	go run ./cmd/mkdist -binary ../bin/vllm-guard -root .. -out ../dist [-version v1.2.3]
package main

import (
	"debug/buildinfo"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	homepage    = "https://github.com/vllm-guard/vllm-guard"
	maintainer  = "vllm-guard maintainers <vllm-guard@users.noreply.github.com>"
	summary     = "keeps vLLM serving: readiness, GPU memory watch, restarts on a lighter profile"
	description = summary + `
vllm-guard runs vllm serve as its child, says ready only when the model has
loaded and answers a completion, watches GPU memory through NVML and warns
before it runs out, and when vLLM dies it finds out why, cleans up the whole
process tree, waits for the GPU memory to come back and restarts it with
backoff, on a lighter profile after an out-of-memory. Bad configuration
stops at once (exit 78); a crash loop gives up after a bounded number of
tries. Ships systemd units for one guard or one per GPU.`
)

func main() {
	log := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "mkdist: "+format+"\n", args...) }
	if err := run(os.Args[1:], log); err != nil {
		log("%v", err)
		os.Exit(1)
	}
}

// options are mkdist's flags.
type options struct {
	binary  string // the built vllm-guard
	root    string // the repository: LICENSE, README.md, vllm-guard.toml, examples/
	out     string // where the packages go
	version string // what the binary must say it is (empty: whatever it says)
}

func run(args []string, log func(string, ...any)) error {
	fs := flag.NewFlagSet("mkdist", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.binary, "binary", "../bin/vllm-guard", "the built vllm-guard (make bin/vllm-guard)")
	fs.StringVar(&o.root, "root", "..", "the repository's top folder")
	fs.StringVar(&o.out, "out", "../dist", "where to write the packages")
	fs.StringVar(&o.version, "version", "", "the version the binary was stamped with (the Makefile's VERSION); checked against its --version")
	if err := fs.Parse(args); err == flag.ErrHelp {
		return nil
	} else if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: every input is a flag (mkdist -h)", fs.Arg(0))
	}
	made, err := build(o, buildTime())
	if err != nil {
		return err
	}
	for _, f := range made {
		log("wrote %s", f)
	}
	return nil
}

// buildTime is the time every file in the packages carries:
// $SOURCE_DATE_EPOCH (the Makefile sets the commit's), else now.
func buildTime() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Now().UTC().Truncate(time.Second)
}

// stamped is the version the binary reports: the first line of
// `vllm-guard --version` is "vllm-guard VERSION".
func stamped(binary string) (string, error) {
	out, err := runHelp(binary, "--version")
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(out, "\n")
	v, ok := strings.CutPrefix(first, "vllm-guard ")
	if !ok || strings.TrimSpace(v) == "" {
		return "", fmt.Errorf("%s --version: first line %q is not \"vllm-guard VERSION\"", binary, first)
	}
	return strings.TrimSpace(v), nil
}

// goArch is the architecture the binary was built for, as Go names it
// (amd64, arm64); the packagers turn it into theirs.
func goArch(binary string) (string, error) {
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		return "", fmt.Errorf("%s: not a Go binary: %w (build it with make bin/vllm-guard)", binary, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if goos := settings["GOOS"]; goos != "linux" {
		return "", fmt.Errorf("%s is built for GOOS=%q: the packages are for linux", binary, goos)
	}
	if settings["GOARCH"] == "" {
		return "", fmt.Errorf("%s: its build information names no GOARCH", binary)
	}
	return settings["GOARCH"], nil
}

// packagedUnit is a unit file from examples/ as the packages install it:
// the binary is /usr/bin/vllm-guard there, not /usr/local/bin/vllm-guard
// as installed by hand.
func packagedUnit(name string, unit []byte) ([]byte, error) {
	lines := strings.Split(string(unit), "\n")
	found := false
	for i, l := range lines {
		key, value, ok := strings.Cut(l, "=")
		if !ok || strings.TrimSpace(key) != "ExecStart" {
			continue
		}
		value = strings.Replace(value, "/usr/local/bin/vllm-guard", "/usr/bin/vllm-guard", 1)
		lines[i] = key + "=" + value
		if strings.HasPrefix(strings.TrimLeft(value, "-@:+!"), "/usr/bin/vllm-guard ") {
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: no ExecStart= runs /usr/local/bin/vllm-guard (or /usr/bin/vllm-guard): "+
			"the package installs the binary as /usr/bin/vllm-guard", name)
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// readInputs reads the repository's files the packages hold.
func readInputs(root string, names ...string) (map[string][]byte, error) {
	in := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(root, n))
		if err != nil {
			return nil, fmt.Errorf("%w (is -root the repository's top folder?)", err)
		}
		in[n] = b
	}
	return in, nil
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, data, mode); err != nil {
		return err
	}
	return os.Chmod(path, mode) // whatever the umask
}
