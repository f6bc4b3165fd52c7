package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
	"github.com/goreleaser/nfpm/v2/rpm"
)

//go:embed postinstall.sh
var postinstall []byte

// uvmUnit loads nvidia-uvm before the guard's units (they want it).
const uvmUnit = "vllm-guard-nvidia-uvm.service"

//go:embed preremove.sh
var preremove []byte

//go:embed postremove.sh
var postremove []byte

// packager is one of nfpm's formats, by the name its contents use.
type packager struct {
	format string
	nfpm.Packager
}

var packagers = []packager{{"deb", deb.Default}, {"rpm", rpm.DefaultRPM}}

// build writes the tarball, the .deb, the .rpm and SHA256SUMS into o.out
// and returns their paths.
func build(o options, mtime time.Time) ([]string, error) {
	if _, err := os.Stat(o.binary); err != nil {
		return nil, fmt.Errorf("%w: build it first (make bin/vllm-guard), or give its path with -binary", err)
	}
	got, err := stamped(o.binary)
	if err != nil {
		return nil, err
	}
	if o.version != "" && o.version != got {
		return nil, fmt.Errorf("%s says it is version %q, not %q: rebuild it (make bin/vllm-guard VERSION=%s)",
			o.binary, got, o.version, o.version)
	}
	version, err := packageVersion(got)
	if err != nil {
		return nil, err
	}
	arch, err := goArch(o.binary)
	if err != nil {
		return nil, err
	}
	in, err := readInputs(o.root, "LICENSE", "README.md", "vllm-guard.toml",
		"examples/vllm-guard.service", "examples/vllm-guard@.service", "examples/"+uvmUnit)
	if err != nil {
		return nil, err
	}
	binary, err := os.ReadFile(o.binary)
	if err != nil {
		return nil, err
	}
	man, err := manPage(o.binary, version, mtime, in["README.md"])
	if err != nil {
		return nil, err
	}
	bash, err := runHelp(o.binary, "completion", "bash")
	if err != nil {
		return nil, err
	}
	zsh, err := runHelp(o.binary, "completion", "zsh")
	if err != nil {
		return nil, err
	}

	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	// What the packages hold beyond the repository's own files, as files
	// for nfpm to read.
	stage, err := os.MkdirTemp(o.out, ".stage-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	staged := map[string][]byte{
		"vllm-guard.1.gz": gzipped(man),
		"vllm-guard.bash": []byte(bash),
		"_vllm-guard":     []byte(zsh),
		"postinstall.sh":  postinstall,
		"preremove.sh":    preremove,
		"postremove.sh":   postremove,
		"vllm-guard.toml": in["vllm-guard.toml"],
		"LICENSE":         in["LICENSE"],
		"README.md":       in["README.md"],
		"vllm-guard":      binary, // the very bytes the tarball has
	}
	for _, unit := range []string{"vllm-guard.service", "vllm-guard@.service"} {
		u, err := packagedUnit("examples/"+unit, in["examples/"+unit])
		if err != nil {
			return nil, err
		}
		staged[unit] = u
	}
	// The nvidia-uvm oneshot runs nvidia-modprobe, not the guard: as is.
	staged[uvmUnit] = in["examples/"+uvmUnit]
	for name, data := range staged {
		mode := os.FileMode(0o644)
		if name == "vllm-guard" || strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := writeFile(filepath.Join(stage, name), data, mode); err != nil {
			return nil, err
		}
	}

	var made []string
	base := fmt.Sprintf("vllm-guard_%s_linux_%s", version, arch)
	tarball := filepath.Join(o.out, base+".tar.gz")
	err = writeTarball(tarball, base, mtime, []tarEntry{
		{"vllm-guard", binary, 0o755},
		{"LICENSE", in["LICENSE"], 0o644},
		{"README.md", in["README.md"], 0o644},
		{"vllm-guard.toml", in["vllm-guard.toml"], 0o644},
		// As in the repository: their comments install the binary as /usr/local/bin/vllm-guard.
		{"vllm-guard.service", in["examples/vllm-guard.service"], 0o644},
		{"vllm-guard@.service", in["examples/vllm-guard@.service"], 0o644},
		{uvmUnit, in["examples/"+uvmUnit], 0o644},
		{"vllm-guard.1", man, 0o644},
	})
	if err != nil {
		return nil, err
	}
	made = append(made, tarball)

	for _, p := range packagers {
		info := packageInfo(p.format, version, arch, mtime, stage)
		path := filepath.Join(o.out, p.ConventionalFileName(packageInfo(p.format, version, arch, mtime, stage)))
		if err := writePackage(p, info, path); err != nil {
			return nil, err
		}
		made = append(made, path)
	}

	sums := filepath.Join(o.out, "SHA256SUMS")
	if err := writeSums(sums, made); err != nil {
		return nil, err
	}
	return append(made, sums), nil
}

// packageInfo is what nfpm needs to write the package in format: the
// metadata, the files from stage and where they go, the postinstall.
func packageInfo(format, version, arch string, mtime time.Time, stage string) *nfpm.Info {
	unitDir, zshDir := "/lib/systemd/system", "/usr/share/zsh/vendor-completions"
	license := &files.Content{Destination: "/usr/share/doc/vllm-guard/copyright"}
	readme := &files.Content{Destination: "/usr/share/doc/vllm-guard/README.md"}
	// useradd and getent for the postinstall: passwd (Priority: required,
	// but an image may lack it) and libc-bin on Debian.
	depends := []string{"libc6", "passwd"}
	if format == "rpm" {
		// /lib is a link to /usr/lib there, and rpm will not install through it.
		unitDir, zshDir = "/usr/lib/systemd/system", "/usr/share/zsh/site-functions"
		license = &files.Content{Destination: "/usr/share/licenses/vllm-guard/LICENSE", Type: files.TypeRPMLicense}
		readme.Type = files.TypeRPMDoc
		depends = []string{"glibc"}
	}
	license.Source = filepath.Join(stage, "LICENSE")
	readme.Source = filepath.Join(stage, "README.md")
	file := func(src, dst string, mode os.FileMode) *files.Content {
		return &files.Content{Source: filepath.Join(stage, src), Destination: dst, FileInfo: &files.ContentFileInfo{Mode: mode}}
	}
	// It may hold API keys: root's, readable by the guard's group. The
	// group may not exist yet when the files are unpacked (the postinstall
	// makes it): the postinstall gives it the file then.
	config := file("vllm-guard.toml", "/etc/vllm-guard/vllm-guard.toml", 0o640)
	config.FileInfo.Group = "vllm"
	config.Type = files.TypeConfigNoReplace // a conffile for dpkg; %config(noreplace) for rpm
	license.FileInfo = &files.ContentFileInfo{Mode: 0o644}
	readme.FileInfo = &files.ContentFileInfo{Mode: 0o644}

	info := &nfpm.Info{
		Name:          "vllm-guard",
		Arch:          arch,
		Platform:      "linux",
		Version:       version,
		VersionSchema: "none", // packageVersion made it valid for both already
		Section:       "admin",
		Priority:      "optional",
		Maintainer:    maintainer,
		Vendor:        "vllm-guard",
		Homepage:      homepage,
		License:       "Apache-2.0",
		Description:   description,
		MTime:         mtime,
		Overridables: nfpm.Overridables{
			Depends: depends,
			Contents: files.Contents{
				file("vllm-guard", "/usr/bin/vllm-guard", 0o755),
				file("vllm-guard.service", unitDir+"/vllm-guard.service", 0o644),
				file("vllm-guard@.service", unitDir+"/vllm-guard@.service", 0o644),
				file(uvmUnit, unitDir+"/"+uvmUnit, 0o644),
				config,
				file("vllm-guard.1.gz", "/usr/share/man/man1/vllm-guard.1.gz", 0o644),
				file("vllm-guard.bash", "/usr/share/bash-completion/completions/vllm-guard", 0o644),
				file("_vllm-guard", zshDir+"/_vllm-guard", 0o644),
				license,
				readme,
			},
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(stage, "postinstall.sh"),
				PreRemove:   filepath.Join(stage, "preremove.sh"),
				PostRemove:  filepath.Join(stage, "postremove.sh"),
			},
			RPM: nfpm.RPM{
				// What the postinstall runs, there before it runs.
				Requires:  nfpm.RPMRequires{Post: []string{"/usr/sbin/useradd", "/usr/bin/getent"}},
				Summary:   summary,
				BuildHost: "localhost", // the same package from the same inputs on any machine
			},
		},
	}
	if format == "rpm" {
		// The summary is a field of its own there.
		_, info.Description, _ = strings.Cut(description, "\n")
	}
	return nfpm.WithDefaults(info)
}

func writePackage(p packager, info *nfpm.Info, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := p.Package(info, f); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return f.Close()
}

// tarEntry is one file of the tarball.
type tarEntry struct {
	name string
	data []byte
	mode int64
}

// writeTarball writes the entries into folder dir of a gzipped tarball,
// owned by root, dated mtime.
func writeTarball(path, dir string, mtime time.Time, entries []tarEntry) error {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	hdr := func(name string, mode int64, size int64, typ byte) *tar.Header {
		return &tar.Header{Name: name, Mode: mode, Size: size, Typeflag: typ, ModTime: mtime,
			Uname: "root", Gname: "root", Format: tar.FormatPAX}
	}
	if err := tw.WriteHeader(hdr(dir+"/", 0o755, 0, tar.TypeDir)); err != nil {
		return err
	}
	for _, e := range entries {
		if err := tw.WriteHeader(hdr(dir+"/"+e.name, e.mode, int64(len(e.data)), tar.TypeReg)); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return writeFile(path, buf.Bytes(), 0o644)
}

// gzipped is data compressed the way man pages are shipped, with no name
// or time in the header so the same page gives the same bytes.
func gzipped(data []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression) // the level is valid
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

// writeSums writes "HASH  NAME" lines, as sha256sum does.
func writeSums(path string, made []string) error {
	var b bytes.Buffer
	for _, m := range made {
		f, err := os.Open(m)
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%x  %s\n", h.Sum(nil), filepath.Base(m))
	}
	return writeFile(path, b.Bytes(), 0o644)
}
