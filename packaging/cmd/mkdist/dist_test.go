package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// The packages are built from a freshly built binary stamped with a
// version as `git describe` prints one 4 commits after a tag, on a tree
// with changes.
const (
	testStamped = "v1.2.3-4-gabc1234-dirty"
	testVersion = "1.2.3+4.gabc1234.dirty"
)

// built is one run of mkdist, shared by the tests below.
type built struct {
	repo, binary, out string
	goarch            string
}

func buildDist(t *testing.T) *built {
	t.Helper()
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if mod, err := os.ReadFile(filepath.Join(repo, "go.mod")); err != nil || !bytes.HasPrefix(mod, []byte("module github.com/vllm-guard/vllm-guard\n")) {
		t.Fatalf("%s is not the vllm-guard repository: %v", repo, err)
	}
	dir := t.TempDir()
	b := &built{repo: repo, binary: filepath.Join(dir, "vllm-guard"), out: filepath.Join(dir, "dist")}
	const pkg = "github.com/vllm-guard/vllm-guard/internal/buildinfo"
	cmd := exec.Command("go", "build", "-ldflags", "-X "+pkg+".Version="+testStamped+" -X "+pkg+".Revision=abc1234",
		"-o", b.binary, "./cmd/vllm-guard")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/vllm-guard: %v\n%s", err, out)
	}
	if b.goarch, err = goArch(b.binary); err != nil {
		t.Fatal(err)
	}
	// mkdist runs as `make dist` runs it: a command of its own, built
	// without the race detector (compressing the binary under it takes
	// minutes; mkdist starts no goroutine).
	mkdist := filepath.Join(dir, "mkdist")
	if out, err := exec.Command("go", "build", "-o", mkdist, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/mkdist: %v\n%s", err, out)
	}
	cmd = exec.Command(mkdist, "-binary", b.binary, "-root", repo, "-out", b.out, "-version", testStamped)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mkdist: %v\n%s", err, out)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		made, ok := strings.CutPrefix(l, "mkdist: wrote "+b.out+"/")
		if !ok {
			t.Errorf("mkdist said %q; want only mkdist: wrote PATH lines", l)
		}
		names = append(names, made)
	}
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[b.goarch]
	want := []string{
		"vllm-guard_" + testVersion + "_linux_" + b.goarch + ".tar.gz",
		"vllm-guard_" + testVersion + "_" + b.goarch + ".deb",
		"vllm-guard-" + testVersion + "-1." + rpmArch + ".rpm",
		"SHA256SUMS",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("mkdist wrote %q; want %q", names, want)
	}
	entries, _ := os.ReadDir(b.out)
	if len(entries) != len(want) {
		t.Errorf("%s holds %d entries; want only the %d it wrote (no staging left behind)", b.out, len(entries), len(want))
	}
	return b
}

func (b *built) path(t *testing.T, kind string) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(b.out, "*"+kind))
	if len(matches) != 1 {
		t.Fatalf("%s holds %d files *%s; want one", b.out, len(matches), kind)
	}
	return matches[0]
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// packagedFiles is every file the .deb and .rpm install, with its mode.
func packagedFiles(format string) map[string]os.FileMode {
	units, zsh, license := "/lib/systemd/system", "/usr/share/zsh/vendor-completions", "/usr/share/doc/vllm-guard/copyright"
	if format == "rpm" {
		units, zsh, license = "/usr/lib/systemd/system", "/usr/share/zsh/site-functions", "/usr/share/licenses/vllm-guard/LICENSE"
	}
	return map[string]os.FileMode{
		"/usr/bin/vllm-guard":                               0o755,
		units + "/vllm-guard.service":                       0o644,
		units + "/vllm-guard@.service":                      0o644,
		units + "/vllm-guard-nvidia-uvm.service":            0o644,
		"/etc/vllm-guard/vllm-guard.toml":                   0o640,
		"/usr/share/man/man1/vllm-guard.1.gz":               0o644,
		"/usr/share/bash-completion/completions/vllm-guard": 0o644,
		zsh + "/_vllm-guard":                                0o644,
		license:                                             0o644,
		"/usr/share/doc/vllm-guard/README.md":               0o644,
	}
}

func TestDist(t *testing.T) {
	b := buildDist(t)
	t.Run("checksums", func(t *testing.T) {
		cmd := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
		cmd.Dir = b.out
		if out, err := cmd.CombinedOutput(); err != nil || strings.Count(string(out), ": OK\n") != 3 {
			t.Errorf("sha256sum --check: %v\n%s", err, out)
		}
	})
	t.Run("tarball", func(t *testing.T) { checkTarball(t, b) })
	t.Run("deb", func(t *testing.T) { checkDeb(t, b) })
	t.Run("rpm", func(t *testing.T) { checkRPM(t, b) })
	t.Run("man page", func(t *testing.T) { checkManPage(t, b) })
}

func checkTarball(t *testing.T, b *built) {
	f, err := os.Open(b.path(t, ".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := "vllm-guard_" + testVersion + "_linux_" + b.goarch + "/"
	want := map[string]int64{
		dir: 0o755, dir + "vllm-guard": 0o755, dir + "LICENSE": 0o644, dir + "README.md": 0o644,
		dir + "vllm-guard.toml": 0o644, dir + "vllm-guard.service": 0o644, dir + "vllm-guard@.service": 0o644,
		dir + "vllm-guard-nvidia-uvm.service": 0o644,
		dir + "vllm-guard.1":                  0o644,
	}
	got := map[string]int64{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h.Mode
		if h.Uname != "root" || h.Gname != "root" {
			t.Errorf("%s is owned by %s:%s; want root:root", h.Name, h.Uname, h.Gname)
		}
		data, _ := io.ReadAll(tr)
		switch strings.TrimPrefix(h.Name, dir) {
		case "vllm-guard":
			if same(t, data, b.binary) != nil {
				t.Errorf("the tarball's binary is not the one built")
			}
		case "vllm-guard.service", "vllm-guard@.service", "vllm-guard-nvidia-uvm.service", "vllm-guard.toml", "LICENSE", "README.md":
			src := strings.TrimPrefix(h.Name, dir)
			if strings.HasSuffix(src, ".service") {
				src = "examples/" + src
			}
			if err := same(t, data, filepath.Join(b.repo, src)); err != nil {
				t.Errorf("%s differs from the repository's %s", h.Name, src)
			}
		}
	}
	for name, mode := range want {
		if m, ok := got[name]; !ok || m != mode {
			t.Errorf("tarball: %s has mode %o (listed: %v); want %o", name, m, ok, mode)
		}
	}
	if len(got) != len(want) {
		t.Errorf("tarball holds %d entries, want %d: %v", len(got), len(want), got)
	}
}

// same is nil when data is what the file at path holds.
func same(t *testing.T, data []byte, path string) error {
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, want) {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// installDeb installs the .deb into root with dpkg, the way a root being
// filled without a chroot is: the maintainer scripts run here with
// DPKG_ROOT set, and must leave this machine alone.
func installDeb(t *testing.T, root, deb string) string {
	t.Helper()
	return mustRun(t, "dpkg", "--root="+root, "--force-not-root", "--force-script-chrootless", "--force-depends",
		"--log=/dev/null", "--no-triggers", "--install", deb)
}

// newRoot makes an empty system root: dpkg's database and the account
// files useradd --prefix extends.
func newRoot(t *testing.T) string {
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{
		"var/lib/dpkg/status":    "",
		"var/lib/dpkg/available": "",
		"etc/passwd":             "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":              "root:x:0:\n",
		"etc/shadow":             "root:*:19000:0:99999:7:::\n",
		"etc/gshadow":            "root:*::\n",
	} {
		mode := os.FileMode(0o644)
		if strings.Contains(name, "shadow") {
			mode = 0o640
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func checkDeb(t *testing.T, b *built) {
	deb := b.path(t, ".deb")
	fields := mustRun(t, "dpkg-deb", "--show", "--showformat",
		"${Package}|${Version}|${Architecture}|${Depends}|${Maintainer}|${Homepage}\n", deb)
	if want := "vllm-guard|" + testVersion + "|" + b.goarch + "|libc6, passwd|" + maintainer + "|" + homepage + "\n"; fields != want {
		t.Errorf("control fields %q; want %q", fields, want)
	}

	passwd, _ := os.ReadFile("/etc/passwd")
	root := newRoot(t)
	installDeb(t, root, deb)

	// Every file where it belongs, with its mode, and nothing else.
	want := packagedFiles("deb")
	for path, mode := range want {
		fi, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Errorf("installed: %v", err)
		} else if fi.Mode() != mode {
			t.Errorf("installed %s has mode %v; want %v", path, fi.Mode(), mode)
		}
	}
	var listed []string
	for _, l := range strings.Split(mustRun(t, "dpkg-query", "--admindir="+root+"/var/lib/dpkg", "--listfiles", "vllm-guard"), "\n") {
		if fi, err := os.Stat(filepath.Join(root, l)); err == nil && !fi.IsDir() {
			listed = append(listed, l)
		}
	}
	if len(listed) != len(want) {
		t.Errorf("dpkg lists %d files: %q; want %d", len(listed), listed, len(want))
	}

	status := mustRun(t, "dpkg-query", "--admindir="+root+"/var/lib/dpkg", "--show", "--showformat",
		"${Status}|${Version}|${Conffiles}\n", "vllm-guard")
	if !regexp.MustCompile(`^install ok installed\|` + regexp.QuoteMeta(testVersion) +
		`\|\s*/etc/vllm-guard/vllm-guard.toml [0-9a-f]{32}\s*$`).MatchString(status) {
		t.Errorf("dpkg status %q; want installed, the version, the config listed as a conffile", status)
	}

	for _, unit := range []string{"vllm-guard.service", "vllm-guard@.service"} {
		data, _ := os.ReadFile(filepath.Join(root, "lib/systemd/system", unit))
		execs := regexp.MustCompile(`(?m)^ExecStart=(\S+)`).FindAllStringSubmatch(string(data), -1)
		if len(execs) != 1 || execs[0][1] != "/usr/bin/vllm-guard" {
			t.Errorf("%s: ExecStart runs %q; want /usr/bin/vllm-guard", unit, execs)
		}
	}

	// The postinstall made the system user in the root, not on this machine.
	if got := accountLine(t, filepath.Join(root, "etc/passwd"), "vllm"); !regexp.MustCompile(
		`^vllm:x:[0-9]+:[0-9]+::/var/lib/vllm-guard:/usr/sbin/nologin$`).MatchString(got) {
		t.Errorf("the root's passwd has %q for vllm; want a system user with home /var/lib/vllm-guard and no login", got)
	}
	if accountLine(t, filepath.Join(root, "etc/group"), "vllm") == "" {
		t.Errorf("the root's group file has no vllm group")
	}
	if now, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(now, passwd) {
		t.Errorf("installing into %s changed this machine's /etc/passwd", root)
	}
	// The config may hold API keys: root's, read by the guard's group.
	checkConfigOwner(t, root)
	// The removal scripts are in the package (TestRemoveScripts runs them).
	control := mustRun(t, "sh", "-c", `dpkg-deb --ctrl-tarfile "$1" | tar -t`, "sh", deb)
	for _, script := range []string{"./postinst", "./prerm", "./postrm"} {
		if !slices.Contains(strings.Fields(control), script) {
			t.Errorf("the .deb's control archive lacks %s: %q", script, control)
		}
	}

	out := mustRun(t, filepath.Join(root, "usr/bin/vllm-guard"), "--version")
	if first, _, _ := strings.Cut(out, "\n"); first != "vllm-guard "+testStamped {
		t.Errorf("the installed vllm-guard --version says %q; want %q", first, "vllm-guard "+testStamped)
	}
	bash, _ := os.ReadFile(filepath.Join(root, "usr/share/bash-completion/completions/vllm-guard"))
	if string(bash) != mustRun(t, b.binary, "completion", "bash") {
		t.Errorf("the bash completion is not what vllm-guard completion bash prints")
	}
	zsh, _ := os.ReadFile(filepath.Join(root, "usr/share/zsh/vendor-completions/_vllm-guard"))
	if string(zsh) != mustRun(t, b.binary, "completion", "zsh") {
		t.Errorf("the zsh completion is not what vllm-guard completion zsh prints")
	}

	// Installed again over itself (an upgrade): the user exists, the
	// operator's edit of the config stays.
	config := filepath.Join(root, "etc/vllm-guard/vllm-guard.toml")
	edited := []byte("# edited by the operator\n")
	if err := os.WriteFile(config, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	installDeb(t, root, deb)
	if got, _ := os.ReadFile(config); !bytes.Equal(got, edited) {
		t.Errorf("installing again replaced the operator's config")
	}
	data, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if n := strings.Count(string(data), "\nvllm:"); n != 1 {
		t.Errorf("after a second install the root's passwd has %d vllm users; want 1", n)
	}

	// Removed: the files go, the scripts leave this machine alone.
	mustRun(t, "dpkg", "--root="+root, "--force-not-root", "--force-script-chrootless", "--log=/dev/null", "--no-triggers", "--remove", "vllm-guard")
	if _, err := os.Stat(filepath.Join(root, "usr/bin/vllm-guard")); !os.IsNotExist(err) {
		t.Errorf("after dpkg --remove the binary is still there: %v", err)
	}

	// An account vllm that was there before (a person's, say) is used, and
	// the install says so instead of taking it over in silence.
	root = newRoot(t)
	f, _ := os.OpenFile(filepath.Join(root, "etc/passwd"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("vllm:x:1000:1000:Val L. Lm:/home/vllm:/bin/bash\n")
	f.Close()
	f, _ = os.OpenFile(filepath.Join(root, "etc/group"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("vllm:x:1000:\n")
	f.Close()
	out = installDebSaying(t, root, deb)
	if !strings.Contains(out, "the account vllm already exists (vllm:x:1000:1000:Val L. Lm:/home/vllm:/bin/bash)") || !strings.Contains(out, "User=") {
		t.Errorf("installing over an existing account vllm said:\n%s\nwant it named, and how to choose another user", out)
	}
	checkConfigOwner(t, root)
	if out := installDebSaying(t, root, deb); strings.Contains(out, "already exists") {
		t.Errorf("an upgrade said again that the account exists:\n%s", out)
	}

	// A group vllm without a user vllm is not the package's (another
	// program's, or people's): the guard is not put in it, where its
	// members would read the config's keys and use the socket (issue 41).
	// The install says so and what to do; no user is made; the config
	// stays root's.
	root = newRoot(t)
	f, _ = os.OpenFile(filepath.Join(root, "etc/group"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("vllm:x:1001:alice,bob\n")
	f.Close()
	out = installDebSaying(t, root, deb)
	for _, want := range []string{"a group vllm already exists (vllm:x:1001:alice,bob)", "created no user vllm", "systemctl edit vllm-guard", "useradd --system --user-group"} {
		if !strings.Contains(out, want) {
			t.Errorf("installing over a foreign group vllm said:\n%s\nwant %q", out, want)
		}
	}
	if got := accountLine(t, filepath.Join(root, "etc/passwd"), "vllm"); got != "" {
		t.Errorf("installing over a foreign group vllm made the user %q", got)
	}
	fi, err := os.Stat(filepath.Join(root, "etc/vllm-guard/vllm-guard.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 || fi.Mode().Perm() != 0o640 {
		t.Errorf("over a foreign group vllm the config is uid %d gid %d mode %v; want 0640 root:root", st.Uid, st.Gid, fi.Mode().Perm())
	}
	// The operator chose: the warning is not repeated at an upgrade.
	if err := os.Chown(filepath.Join(root, "etc/vllm-guard/vllm-guard.toml"), 0, 1002); err != nil {
		t.Fatal(err)
	}
	if out := installDebSaying(t, root, deb); strings.Contains(out, "already exists") {
		t.Errorf("an upgrade after the operator chose a group warned again:\n%s", out)
	}
}

// installDebSaying is installDeb, returning what dpkg and the scripts
// wrote on both streams.
func installDebSaying(t *testing.T, root, deb string) string {
	t.Helper()
	cmd := exec.Command("dpkg", "--root="+root, "--force-not-root", "--force-script-chrootless", "--force-depends",
		"--log=/dev/null", "--no-triggers", "--install", deb)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg --install: %v\n%s", err, out)
	}
	return string(out)
}

// checkConfigOwner: the installed config is root's, mode 0640, group the
// root's vllm group.
func checkConfigOwner(t *testing.T, root string) {
	t.Helper()
	fi, err := os.Stat(filepath.Join(root, "etc/vllm-guard/vllm-guard.toml"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	group := strings.Split(accountLine(t, filepath.Join(root, "etc/group"), "vllm"), ":")
	if len(group) < 3 || fmt.Sprint(st.Gid) != group[2] || st.Uid != 0 || fi.Mode().Perm() != 0o640 {
		t.Errorf("the config is uid %d gid %d mode %v; want root, the vllm group (%v), 0640", st.Uid, st.Gid, fi.Mode().Perm(), group)
	}
}

// accountLine is NAME's line in a passwd or group file, or "".
func accountLine(t *testing.T, path, name string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, name+":") {
			return l
		}
	}
	return ""
}

func checkRPM(t *testing.T, b *built) {
	rpm := b.path(t, ".rpm")
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[b.goarch]
	fields := mustRun(t, "rpm", "-qp", "--queryformat", "%{NAME}|%{VERSION}|%{RELEASE}|%{ARCH}|%{LICENSE}|%{URL}\n", rpm)
	if want := "vllm-guard|" + testVersion + "|1|" + rpmArch + "|Apache-2.0|" + homepage + "\n"; fields != want {
		t.Errorf("rpm fields %q; want %q", fields, want)
	}
	want := packagedFiles("rpm")
	flags := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(mustRun(t, "rpm", "-qp", "--queryformat",
		"[%{FILEMODES:perms} %{FILEFLAGS:fflags} %{FILENAMES}\n]", rpm)), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 { // no flags
			f = []string{f[0], "", f[1]}
		}
		mode, ok := want[f[2]]
		if !ok {
			t.Errorf("the rpm holds %s, which it should not", f[2])
			continue
		}
		if f[0] != "-"+mode.String()[1:] {
			t.Errorf("rpm: %s has mode %s; want %v", f[2], f[0], mode)
		}
		flags[f[2]] = f[1]
	}
	if len(flags) != len(want) {
		t.Errorf("the rpm holds %d files: %v; want %d", len(flags), flags, len(want))
	}
	if got := flags["/etc/vllm-guard/vllm-guard.toml"]; got != "cn" {
		t.Errorf("rpm: the config has flags %q; want cn (%%config(noreplace))", got)
	}
	if owner := mustRun(t, "rpm", "-qp", "--queryformat", "[%{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]", rpm); !strings.Contains(owner, "root:vllm /etc/vllm-guard/vllm-guard.toml\n") {
		t.Errorf("rpm owners:\n%s\nwant the config root:vllm", owner)
	}
	scripts := mustRun(t, "rpm", "-qp", "--scripts", rpm)
	for _, want := range []string{"postinstall scriptlet", "useradd", "preuninstall scriptlet", "disable --now vllm-guard.service", "postuninstall scriptlet", "daemon-reload"} {
		if !strings.Contains(scripts, want) {
			t.Errorf("rpm scripts lack %q:\n%s", want, scripts)
		}
	}
	// useradd and getent are there before the postinstall runs: Requires(post).
	reqs := mustRun(t, "rpm", "-qp", "--queryformat", "[%{REQUIRENAME} %{REQUIREFLAGS:deptype}\n]", rpm)
	for _, want := range []string{"/usr/sbin/useradd post", "/usr/bin/getent post"} {
		if !strings.Contains(reqs, want+"\n") {
			t.Errorf("rpm requires:\n%s\nwant %q", reqs, want)
		}
	}
}

// The man page renders without a warning and has a section for every
// command the binary lists.
func checkManPage(t *testing.T, b *built) {
	root := newRoot(t)
	cmd := exec.Command("dpkg-deb", "--extract", b.path(t, ".deb"), root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --extract: %v %s", err, out)
	}
	f, err := os.Open(filepath.Join(root, "usr/share/man/man1/vllm-guard.1.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	render := exec.Command("groff", "-man", "-Tutf8", "-ww", "-rLL=80n")
	render.Stdin = bytes.NewReader(page)
	var warnings bytes.Buffer
	render.Stderr = &warnings
	out, err := render.Output()
	if err != nil || warnings.Len() > 0 {
		t.Fatalf("groff -man -Tutf8 -ww: %v\n%s", err, warnings.Bytes())
	}
	text := regexp.MustCompile(".\b").ReplaceAllString(string(out), "") // no overstrike bold
	for _, section := range []string{"NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXIT STATUS", "FILES", "SEE ALSO"} {
		if !strings.Contains(text, "\n"+section+"\n") {
			t.Errorf("the man page has no %s section", section)
		}
	}
	top, err := parseTop(mustRun(t, b.binary, "--help"))
	if err != nil {
		t.Fatal(err)
	}
	if len(top.commands) < 10 {
		t.Fatalf("vllm-guard --help lists %d commands; want the dozen it has", len(top.commands))
	}
	for _, c := range top.commands {
		if !strings.Contains(text, "\n   vllm-guard "+c.path+"\n") {
			t.Errorf("the man page has no section for vllm-guard %s", c.path)
		}
	}
	for _, code := range []string{"0", "1", "2", "3", "78"} {
		if !regexp.MustCompile(`\n {7}` + code + ` +\S`).MatchString(text) {
			t.Errorf("EXIT STATUS does not explain %s", code)
		}
	}
	if !strings.Contains(text, "vllm-guard "+testVersion) {
		t.Errorf("the man page does not name the version %s", testVersion)
	}
	// man-db (what `man` runs) reads it too.
	man := exec.Command("man", "--warnings", "--local-file", "-")
	man.Stdin = bytes.NewReader(page)
	man.Env = append(os.Environ(), "MANPAGER=cat", "MANWIDTH=80", "LANG=C.UTF-8")
	var manWarnings bytes.Buffer
	man.Stderr = &manWarnings
	if out, err := man.Output(); err != nil || manWarnings.Len() > 0 || !strings.Contains(string(out), "vllm-guard profile reset") {
		t.Errorf("man --warnings -l: %v\n%s", err, manWarnings.Bytes())
	}
}
