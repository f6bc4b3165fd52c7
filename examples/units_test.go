package examples

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// sectionKeys reads a unit's [name] section's key=value lines (a repeated
// key: its last value), comments skipped.
func sectionKeys(unit, name string) map[string]string {
	keys := map[string]string{}
	section := ""
	for l := range strings.Lines(unit) {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[") {
			section = l
			continue
		}
		if k, v, ok := strings.Cut(l, "="); ok && section == "["+name+"]" && !strings.HasPrefix(l, "#") {
			keys[k] = v
		}
	}
	return keys
}

// installUnits writes units (file name → text) into a scratch folder, each
// ExecStart's program replaced by exe[name] (verify insists that it
// exists), and returns the folder.
func installUnits(t *testing.T, units map[string]string, exe map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range units {
		text = regexp.MustCompile(`(?m)^ExecStart=\S+`).ReplaceAllLiteralString(text, "ExecStart="+exe[name])
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// nvidia-uvm is loaded before the guard by a root oneshot
// (nvidia-modprobe -u -c0): the guard's units forbid the setuid
// nvidia-modprobe (NoNewPrivileges=yes) and nvidia-persistenced does not
// load nvidia-uvm. Both guard units pull it in and start after it, and
// systemd-analyze verify passes on it beside each of them.
func TestSystemdNvidiaUVMUnit(t *testing.T) {
	const uvm = "vllm-guard-nvidia-uvm.service"
	text := read(t, uvm)
	svc := sectionKeys(text, "Service")
	for k, want := range map[string]string{"Type": "oneshot", "RemainAfterExit": "yes"} {
		if svc[k] != want {
			t.Errorf("%s: %s=%q, want %q", uvm, k, svc[k], want)
		}
	}
	if f := strings.Fields(svc["ExecStart"]); len(f) == 0 || filepath.Base(f[0]) != "nvidia-modprobe" || !strings.Contains(svc["ExecStart"], "-u") {
		t.Errorf("%s: ExecStart=%q; want nvidia-modprobe -u (nvidia-uvm and /dev/nvidia-uvm)", uvm, svc["ExecStart"])
	}
	// Privileged on purpose: loading a module takes root and CAP_SYS_MODULE.
	for _, k := range []string{"User", "DynamicUser", "NoNewPrivileges", "CapabilityBoundingSet", "ProtectKernelModules"} {
		if v, ok := svc[k]; ok {
			t.Errorf("%s: %s=%s would stop it loading the module", uvm, k, v)
		}
	}
	sa := tool(t, "systemd-analyze", "systemd")
	for _, c := range []struct{ src, as string }{{"vllm-guard.service", "vllm-guard.service"}, {"vllm-guard@.service", "vllm-guard@gpu0.service"}} {
		guard := read(t, c.src)
		unit := sectionKeys(guard, "Unit")
		if !strings.Contains(" "+unit["Wants"]+" ", " "+uvm+" ") || !strings.Contains(" "+unit["After"]+" ", " "+uvm+" ") {
			t.Errorf("%s: Wants=%q After=%q; want both to name %s", c.src, unit["Wants"], unit["After"], uvm)
		}
		dir := installUnits(t, map[string]string{c.src: guard, uvm: text},
			map[string]string{c.src: guardBinary(t), uvm: "/bin/true"})
		run(t, "", true, sa, "verify", filepath.Join(dir, c.as), filepath.Join(dir, uvm))
	}
}

// ProtectHome=yes hides /home and /root: each unit says what that does to a
// vLLM or a model there (a start that fails as a configuration error, exit
// 78) and offers ProtectHome=read-only as a drop-in; the drop-in as
// written verifies, and the unit with it still scores 3.3 or better.
func TestSystemdProtectHomeSaysWhatItHides(t *testing.T) {
	sa := tool(t, "systemd-analyze", "systemd")
	for _, c := range []struct{ src, as string }{{"vllm-guard.service", "vllm-guard.service"}, {"vllm-guard@.service", "vllm-guard@gpu0.service"}} {
		t.Run(c.src, func(t *testing.T) {
			unit := read(t, c.src)
			// The comment right above ProtectHome=.
			var comment []string
			for l := range strings.Lines(unit) {
				l = strings.TrimSpace(l)
				switch {
				case strings.HasPrefix(l, "#"):
					comment = append(comment, strings.TrimSpace(strings.TrimPrefix(l, "#")))
				case strings.HasPrefix(l, "ProtectHome="):
					goto found
				default:
					comment = nil
				}
			}
			t.Fatal("no ProtectHome= line")
		found:
			said := strings.Join(comment, "\n")
			for _, want := range []string{"/home", "/root", "virtualenv", "78", "[Service]\nProtectHome=read-only"} {
				if !strings.Contains(said, want) {
					t.Errorf("the comment above ProtectHome= does not say %q:\n%s", want, said)
				}
			}
			// The offered drop-in, as the comment writes it.
			i := strings.Index(said, "[Service]")
			if i < 0 {
				return
			}
			dropIn := said[i:] + "\n"
			dir := installUnits(t, map[string]string{c.src: unit}, map[string]string{c.src: guardBinary(t)})
			os.Mkdir(filepath.Join(dir, c.src+".d"), 0o755)
			if err := os.WriteFile(filepath.Join(dir, c.src+".d", "home.conf"), []byte(dropIn), 0o644); err != nil {
				t.Fatal(err)
			}
			run(t, "", true, sa, "verify", filepath.Join(dir, c.as))
			out, err := exec.Command(sa, "security", "--offline=yes", "--threshold=33", filepath.Join(dir, c.as)).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "Service has read-only access to home directories") {
				t.Errorf("systemd-analyze security with the drop-in: %v (want it applied, exposure 3.3 or better):\n%s", err, out)
			}
		})
	}
}

// A config may hold API keys: wherever we tell an operator to install one
// (the units' headers, the docs), it is 0640 root:vllm — the guard's
// group reads it — or 0600 (issue 41: the headers said 0644). A file
// installed for a guard that runs as vllm gets the group, after useradd
// has made it.
func TestConfigInstalledUnreadableToOthers(t *testing.T) {
	installRE := regexp.MustCompile(`install\b[^\n]*\.toml\s+/etc/vllm-guard/\S+`)
	files := []string{"vllm-guard.service", "vllm-guard@.service", "../README.md"}
	docs, _ := filepath.Glob("../docs/*.md")
	files = append(files, docs...)
	seen := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		for _, loc := range installRE.FindAllStringIndex(text, -1) {
			line := text[loc[0]:loc[1]]
			seen++
			mode := regexp.MustCompile(`-m\s+(\d+)`).FindStringSubmatch(line)
			if mode == nil || mode[1] != "0640" && mode[1] != "0600" {
				t.Errorf("%s: %q installs a config readable by others; write -m 0640 -g vllm (or -m 0600)", f, line)
			}
			if strings.HasSuffix(f, ".service") {
				if !strings.Contains(line, "-g vllm") {
					t.Errorf("%s: %q: the guard runs as vllm: give the file its group (-g vllm)", f, line)
				}
				if u := strings.Index(text, "useradd"); u < 0 || u > loc[0] {
					t.Errorf("%s: %q comes before useradd makes the group vllm", f, line)
				}
			}
		}
	}
	if seen < 4 {
		t.Errorf("found %d config installs in the units and docs; want the units' and the docs' (the pattern is stale)", seen)
	}
}
