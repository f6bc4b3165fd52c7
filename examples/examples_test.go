package examples

import (
	"encoding/json"
	"fmt"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/metrics"
	"github.com/vllm-guard/vllm-guard/internal/testbin"
	"github.com/vllm-guard/vllm-guard/internal/vllmstats"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// guardBinary is the shipped build of the guard, for the units' ExecStart.
func guardBinary(t *testing.T) string {
	t.Helper()
	bin, err := testbin.GuardPlain()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tool finds a program the test needs, or fails saying which Debian
// package brings it (scripts/setup.sh installs them).
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found in PATH: install Debian's package %s (apt-get install %s), or run scripts/setup.sh", name, pkg, pkg)
	}
	return p
}

// run fails the test unless the command exits 0; quiet also requires it to
// print nothing (systemd-analyze only warns about unknown keys).
func run(t *testing.T, dir string, quiet bool, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || (quiet && len(strings.TrimSpace(string(out))) > 0) {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestSystemdUnitVerifies(t *testing.T) {
	verifyUnit(t, "vllm-guard.service", "vllm-guard.service")
}

// The template unit verifies as an instance of it would be started
// (systemd-analyze instantiates vllm-guard@gpu0.service from the template).
func TestSystemdTemplateUnitVerifies(t *testing.T) {
	verifyUnit(t, "vllm-guard@.service", "vllm-guard@gpu0.service")
}

// verifyUnit runs systemd-analyze verify on the unit file src, installed in
// a scratch folder under its own name, as the unit name verify is asked for.
func verifyUnit(t *testing.T, src, as string) {
	t.Helper()
	sa := tool(t, "systemd-analyze", "systemd")
	unit := read(t, src)
	// As installed: ExecStart's program is the built guard (verify insists
	// that it exists), the unit's own arguments kept.
	exe := guardBinary(t)
	re := regexp.MustCompile(`(?m)^ExecStart=\S+`)
	if !re.MatchString(unit) {
		t.Fatalf("%s has no ExecStart=", src)
	}
	unit = re.ReplaceAllLiteralString(unit, "ExecStart="+exe)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, src), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "", true, sa, "verify", filepath.Join(dir, as))
}

// serviceLines yields the [Service] section's key=value lines, comments
// skipped, in order.
func serviceLines(unit string) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		section := ""
		for l := range strings.Lines(unit) {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "[") {
				section = l
				continue
			}
			if k, v, ok := strings.Cut(l, "="); ok && section == "[Service]" && !strings.HasPrefix(l, "#") {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// unitKeys reads the [Service] section's key=value lines (a repeated key:
// its last value).
func unitKeys(unit string) map[string]string {
	keys := map[string]string{}
	for k, v := range serviceLines(unit) {
		keys[k] = v
	}
	return keys
}

// timespan parses the systemd time spans the unit uses ("90s", "5min", "2h").
func timespan(t *testing.T, s string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`^(\d+)(ms|s|min|h)$`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("time span %q: write it as <n>ms, <n>s, <n>min or <n>h", s)
	}
	n, _ := strconv.Atoi(m[1])
	unit := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour}[m[2]]
	return time.Duration(n) * unit
}

func TestSystemdUnitSettings(t *testing.T) {
	keys := unitKeys(read(t, "vllm-guard.service"))
	for k, want := range map[string]string{"Type": "notify", "NotifyAccess": "main", "Restart": "on-failure",
		"RestartPreventExitStatus": "78 69", "KillMode": "mixed", "OOMPolicy": "continue"} {
		if keys[k] != want {
			t.Errorf("%s=%q, want %q", k, keys[k], want)
		}
	}
	if !strings.Contains(keys["ExecStart"], "vllm-guard run") {
		t.Errorf("ExecStart=%q does not run the guard", keys["ExecStart"])
	}
	if timespan(t, keys["RestartSec"]) <= 0 {
		t.Error("RestartSec must be set: restarting at once storms")
	}
	// The supervisor proves itself once a second; WatchdogSec/2 must leave room.
	if w := timespan(t, keys["WatchdogSec"]); w < 4*time.Second {
		t.Errorf("WatchdogSec=%s: under 4s a healthy guard may be killed", w)
	}
	if s := timespan(t, keys["TimeoutStartSec"]); s <= 0 {
		t.Errorf("TimeoutStartSec=%s: EXTEND_TIMEOUT_USEC needs a finite start timeout", s)
	}
	cfg, err := config.Load(filepath.Join("..", "vllm-guard.toml"))
	if err != nil {
		t.Fatalf("the repository's vllm-guard.toml (the unit's config): %v", err)
	}
	if stop := timespan(t, keys["TimeoutStopSec"]); stop <= cfg.VLLM.StopTimeout.Duration+5*time.Second {
		t.Errorf("TimeoutStopSec=%s is not above [vllm] stop_timeout %s with a margin", stop, cfg.VLLM.StopTimeout)
	}
}

// The template unit runs instance %i on the paths the guard derives from an
// instance name, and behaves as the plain unit does otherwise.
func TestSystemdTemplateUnitSettings(t *testing.T) {
	plain := unitKeys(read(t, "vllm-guard.service"))
	tmpl := unitKeys(read(t, "vllm-guard@.service"))
	for _, k := range []string{"Type", "NotifyAccess", "ExecReload", "User", "Group", "TimeoutStartSec", "KillMode", "TimeoutStopSec",
		"WatchdogSec", "Restart", "RestartSec", "RestartPreventExitStatus", "OOMPolicy", "RuntimeDirectory", "RuntimeDirectoryMode", "LimitNOFILE",
		"NoNewPrivileges", "ProtectSystem", "ReadWritePaths", "CacheDirectory", "PrivateTmp", "ProtectHome", "PrivateMounts", "DevicePolicy",
		"ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups", "RestrictNamespaces", "CapabilityBoundingSet",
		"RestrictAddressFamilies", "UMask"} {
		if tmpl[k] != plain[k] {
			t.Errorf("%s=%q in the template, %q in vllm-guard.service: keep them alike", k, tmpl[k], plain[k])
		}
	}
	if !strings.HasSuffix(tmpl["ExecStart"], "vllm-guard run --instance %i") {
		t.Errorf("ExecStart=%q does not run instance %%i", tmpl["ExecStart"])
	}
	// Every instance shares /run/vllm-guard: one stopping must not remove
	// the others' sockets.
	if tmpl["RuntimeDirectoryPreserve"] != "yes" {
		t.Errorf("RuntimeDirectoryPreserve=%q: stopping one instance would remove every instance's socket", tmpl["RuntimeDirectoryPreserve"])
	}
	if got := "/run/" + tmpl["RuntimeDirectory"] + "/%i.sock"; got != config.InstanceSocket("%i") {
		t.Errorf("the unit's socket %s is not the guard's default for the instance, %s", got, config.InstanceSocket("%i"))
	}
	state := strings.Fields(tmpl["StateDirectory"])
	if len(state) == 0 || "/var/lib/"+state[0] != config.InstanceStateDir("%i") {
		t.Errorf("StateDirectory=%q: its first folder must be the instance's state folder %s", tmpl["StateDirectory"], config.InstanceStateDir("%i"))
	}
}

// unitValues lists every value of a [Service] key that may repeat
// (DeviceAllow=, Environment=), each Environment= line split into its
// assignments.
func unitValues(unit, key string) []string {
	var out []string
	for k, v := range serviceLines(unit) {
		switch {
		case k != key:
		case key == "Environment":
			out = append(out, strings.Fields(v)...)
		default:
			out = append(out, v)
		}
	}
	return out
}

// Both units carry the hardening vLLM tolerates (issue 17 item 2): a
// read-only system but for the folders the guard and vLLM write, only
// NVIDIA's devices, no privileges; and systemd-analyze security scores
// them no worse than docs/operations.md says.
func TestSystemdHardening(t *testing.T) {
	for _, c := range []struct{ src, as string }{{"vllm-guard.service", "vllm-guard.service"}, {"vllm-guard@.service", "vllm-guard@gpu0.service"}} {
		t.Run(c.src, func(t *testing.T) {
			unit := read(t, c.src)
			keys := unitKeys(unit)
			for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
				"ProtectHome": "yes", "DevicePolicy": "closed", "CapabilityBoundingSet": ""} {
				if v, ok := keys[k]; !ok || v != want {
					t.Errorf("%s=%q, want %q", k, v, want)
				}
			}
			if u := keys["User"]; u == "" || u == "root" || u == "0" {
				t.Errorf("User=%q: run as a dedicated user", u)
			}
			devs := strings.Join(unitValues(unit, "DeviceAllow"), " ")
			for _, d := range []string{"char-nvidia-frontend rw", "char-nvidia-uvm rw", "char-nvidia-caps rw"} {
				if !strings.Contains(devs, d) {
					t.Errorf("DeviceAllow= lacks %q: vLLM cannot open the GPU (%s)", d, devs)
				}
			}
			// Every folder the unit points vLLM at for writing is writable.
			writable := strings.Fields(keys["ReadWritePaths"])
			for _, env := range unitValues(unit, "Environment") {
				name, dir, _ := strings.Cut(env, "=")
				if name != "HF_HOME" && name != "XDG_CACHE_HOME" && name != "TRITON_CACHE_DIR" {
					continue
				}
				ok := false
				for _, w := range writable {
					ok = ok || dir == w || strings.HasPrefix(dir, w+"/")
				}
				if !ok {
					t.Errorf("%s is not under ReadWritePaths=%v: vLLM could not write it under ProtectSystem=strict", env, writable)
				}
			}
			if !strings.Contains(keys["ReadWritePaths"], "/var/lib/vllm-guard") {
				t.Errorf("ReadWritePaths=%q: the state folder must be writable", keys["ReadWritePaths"])
			}
			sa := tool(t, "systemd-analyze", "systemd")
			dir := t.TempDir()
			unit = regexp.MustCompile(`(?m)^ExecStart=\S+`).ReplaceAllLiteralString(unit, "ExecStart="+guardBinary(t))
			if err := os.WriteFile(filepath.Join(dir, c.src), []byte(unit), 0o644); err != nil {
				t.Fatal(err)
			}
			// --threshold is the exposure × 10 above which it fails: 3.2 here.
			out, err := exec.Command(sa, "security", "--offline=yes", "--threshold=32", filepath.Join(dir, c.as)).CombinedOutput()
			if err != nil {
				t.Errorf("systemd-analyze security: %v (exposure above 3.2, docs/operations.md's figure):\n%s", err, out)
			}
		})
	}
}

func TestPrometheusRules(t *testing.T) {
	promtool := tool(t, "promtool", "prometheus")
	out := run(t, "prometheus", false, promtool, "check", "rules", "vllm-guard-rules.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules:\n%s", out)
	}
	// The unit tests fire the memory alert (and every other one).
	out = run(t, "prometheus", false, promtool, "test", "rules", "vllm-guard-rules.test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}
	tests := read(t, filepath.Join("prometheus", "vllm-guard-rules.test.yml"))
	for _, alert := range regexp.MustCompile(`(?m)^\s+- alert: (\S+)`).FindAllStringSubmatch(read(t, filepath.Join("prometheus", "vllm-guard-rules.yml")), -1) {
		if !strings.Contains(tests, "alertname: "+alert[1]+"\n") {
			t.Errorf("alert %s has no unit test", alert[1])
		}
	}
}

// exported is every family metrics.New serves, with a GPU sampled while
// its memory climbs and vLLM read, so the series that exist only then
// (seconds to critical, vLLM's gauges) are there too.
func exported(t *testing.T) map[string]string {
	t.Helper()
	m := metrics.New(metrics.Sources{GPU: sampledGPU{}, VLLM: readVLLM{}})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range fams {
		out[f.GetName()] = f.GetType().String()
	}
	return out
}

// sampledGPU is a GPU monitor whose memory climbs and whose every health
// counter is reported.
type sampledGPU struct{}

func (sampledGPU) Snapshot() gpumon.Snapshot {
	return gpumon.Snapshot{Up: true, Devices: []gpumon.Device{{UUID: "GPU-x", Used: 1, Total: 2, Fraction: 0.5,
		Trend: gpumon.TrendClimbing, SecondsToCritical: 300}}}
}

func (sampledGPU) Health() gpumon.Health {
	pending := false
	return gpumon.Health{Known: true, Devices: []gpumon.DeviceHealth{{UUID: "GPU-x", XIDCounts: map[uint64]uint64{79: 1},
		ECC: &gpumon.ECCCounts{}, Remap: &gpumon.RemappedRows{}, RetiredPagesPending: &pending, ThrottleKnown: true}}}
}

// readVLLM is a scraper of vLLM's /metrics that reads it.
type readVLLM struct{}

func (readVLLM) Latest() vllmstats.Stats {
	return vllmstats.Stats{Up: true, Running: 3, Waiting: 1, KVUsage: 0.5}
}

var seriesRe = regexp.MustCompile(`\bvllm_guard_[a-z0-9_]+`)

// checkSeries fails for each vllm_guard_ name in text that the guard does
// not export, and returns the families referenced.
func checkSeries(t *testing.T, what, text string, fams map[string]string) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	for _, name := range seriesRe.FindAllString(text, -1) {
		fam := name
		if _, ok := fams[fam]; !ok {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(name, suf); cut && fams[base] == "HISTOGRAM" {
					fam = base
				}
			}
		}
		if _, ok := fams[fam]; !ok {
			t.Errorf("%s uses %s, which the guard does not export", what, name)
			continue
		}
		used[fam] = true
	}
	return used
}

func TestRulesUseExportedSeries(t *testing.T) {
	fams := exported(t)
	if len(checkSeries(t, "vllm-guard-rules.yml", read(t, filepath.Join("prometheus", "vllm-guard-rules.yml")), fams)) < 5 {
		t.Error("the rules reference almost none of the guard's series")
	}
}

type gridPos struct{ X, Y, W, H int }

type dashPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	GridPos    gridPos        `json:"gridPos"`
	Datasource map[string]any `json:"datasource"`
	Targets    []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func TestGrafanaDashboard(t *testing.T) {
	raw := read(t, filepath.Join("grafana", "vllm-guard-dashboard.json"))
	var dash struct {
		UID, Title string
		Panels     []dashPanel
		Templating struct {
			List []struct{ Name, Type string }
		}
	}
	if err := json.Unmarshal([]byte(raw), &dash); err != nil {
		t.Fatalf("vllm-guard-dashboard.json is not JSON: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard needs a uid, a title and panels: uid %q title %q, %d panels", dash.UID, dash.Title, len(dash.Panels))
	}
	if !slices.ContainsFunc(dash.Templating.List, func(v struct{ Name, Type string }) bool { return v.Name == "datasource" && v.Type == "datasource" }) {
		t.Error("no datasource variable: the dashboard would be tied to one Prometheus")
	}
	ids := map[int]bool{}
	var exprs strings.Builder
	for i, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		for _, q := range dash.Panels[:i] {
			if overlap(p.GridPos, q.GridPos) {
				t.Errorf("panels %q and %q overlap", p.Title, q.Title)
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource["uid"] != "${datasource}" {
			t.Errorf("panel %q: datasource %v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			exprs.WriteString(q.Expr + "\n")
		}
	}
	fams := exported(t)
	used := checkSeries(t, "the dashboard", raw, fams)
	for name := range fams {
		if strings.HasPrefix(name, metrics.Namespace+"_") && !used[name] {
			t.Errorf("the dashboard shows nothing of %s", name)
		}
	}
	if len(checkSeries(t, "the dashboard's panels", exprs.String(), fams)) == 0 {
		t.Error("no panel queries a guard series")
	}
}

func overlap(a, b gridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// buildinfoPkg holds the variables every build path stamps.
const buildinfoPkg = "github.com/vllm-guard/vllm-guard/internal/buildinfo"

// The Makefile stamps the version and revision into the package that
// holds them (a -X on a missing variable is silently ignored by the linker).
func TestMakefileStampsTheBuild(t *testing.T) {
	mk := read(t, filepath.Join("..", "Makefile"))
	for _, want := range []string{"BUILDINFO := " + buildinfoPkg, "-X $(BUILDINFO).Version=$(VERSION)", "-X $(BUILDINFO).Revision=$(REVISION)",
		`$(GO) build -ldflags "$(LDFLAGS)" -o $@ ./cmd/vllm-guard`} {
		if !strings.Contains(mk, want) {
			t.Errorf("the Makefile lacks %q", want)
		}
	}
	src := read(t, filepath.Join("..", "internal", "buildinfo", "buildinfo.go"))
	for _, v := range []string{"\tVersion  = ", "\tRevision = "} {
		if !strings.Contains(src, v) {
			t.Errorf("internal/buildinfo has no variable %q for -X to set", strings.TrimSpace(v))
		}
	}
}

func TestDockerfile(t *testing.T) {
	df := read(t, "Dockerfile")
	for _, re := range []string{
		`(?m)^ARG VLLM_IMAGE=vllm/vllm-openai:v[0-9.]+$`,
		`(?m)^FROM \$\{VLLM_IMAGE\}$`,
		`(?m)^COPY --from=build /out/vllm-guard /usr/local/bin/vllm-guard$`,
		`(?m)^ENTRYPOINT \["vllm-guard", "run"\]$`,
		`(?m)^CMD \["--config", "/etc/vllm-guard/vllm-guard.toml"\]$`,
		`(?m)^ARG VERSION=dev$`,
		`(?m)^ARG REVISION=unknown$`,
		`-X ` + regexp.QuoteMeta(buildinfoPkg) + `\.Version=\$\{VERSION\} -X ` + regexp.QuoteMeta(buildinfoPkg) + `\.Revision=\$\{REVISION\}`,
		`org\.opencontainers\.image\.version="\$\{VERSION\}"`,
	} {
		if !regexp.MustCompile(re).MatchString(df) {
			t.Errorf("Dockerfile does not match %s", re)
		}
	}
}
