package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// shippedRules is the alert rules file operators load into Prometheus.
const shippedRules = "../../examples/prometheus/vllm-guard-rules.yml"

// forScale divides time in the live test: every rule's `for:` and every
// range of its expression ([1h] runs as [1m]). The shipped durations are
// minutes and hours (VLLMGuardNotReady waits 10m, VLLMGuardOOM looks back
// 1h), the test runs them as seconds and minutes. Names, labels,
// annotations and the expressions but for their ranges are the shipped
// ones, as Prometheus itself parsed them.
const forScale = 60

var rangeSelector = regexp.MustCompile(`\[(\d+[smhdwy])\]`)

// scaleRanges divides every range selector of a PromQL expression by
// forScale.
func scaleRanges(t testing.TB, expr string) string {
	return rangeSelector.ReplaceAllStringFunc(expr, func(sel string) string {
		d, err := model.ParseDuration(sel[1 : len(sel)-1])
		if err != nil {
			t.Fatalf("range %s in %q: %v", sel, expr, err)
		}
		return "[" + (d / forScale).String() + "]"
	})
}

// A real Prometheus (Debian's package) scrapes a guard over the simulator
// every second and evaluates the shipped rules, time divided by 60. A
// second tenant takes 24 GiB of the GPU under a serving vLLM, which dies
// of OOM; the guard waits for the memory while vLLM is down; the tenant
// leaves and the guard starts vLLM again on rung 1. Through Prometheus's
// HTTP API: VLLMGuardOOM fires after the OOM and clears once the OOM has
// left its window (an hour, here a minute), VLLMGuardNotReady fires while
// vLLM is down and clears once it is ready again, VLLMGuardDown never
// fires (a scrape missed under load may make it pending) and
// VLLMGuardGaveUp is never even pending. promtool check metrics finds nothing wrong
// with a scrape taken while ready and one taken while down. The alert
// timeline is logged, never asserted on (it moves with the machine's speed).
func TestLivePrometheus(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	guardAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	s.httpListen = guardAddr
	s.extra = "\n[restart]\ninitial_delay = \"200ms\"\n[gpu]\nsample_interval = \"100ms\"\n"

	p := startPrometheus(t, guardAddr)
	shipped := p.rules()
	derived := p.loadScaledRules(shipped)
	for _, name := range []string{"VLLMGuardOOM", "VLLMGuardNotReady", "VLLMGuardDown", "VLLMGuardGaveUp"} {
		if _, ok := derived[name]; !ok {
			t.Fatalf("the shipped rules have no alert %s; this test follows them by name", name)
		}
	}
	w := p.watch()

	s.start()
	s.WaitEvent("ready", 1, 2*time.Minute, isReady)
	metricsURL := "http://" + guardAddr + "/metrics"
	checkMetrics(t, metricsURL, "ready", "vllm_guard_ready 1")
	// The OOM counter is sampled at 0 and vLLM is seen ready before the OOM:
	// increase() has its baseline and no alert is left from the first load.
	p.waitQuery(`vllm_guard_ready`, 1, 2*time.Minute)
	p.waitQuery(`vllm_guard_exits_total{cause="oom"}`, 0, 2*time.Minute)
	w.waitState("VLLMGuardNotReady", "inactive", 2*time.Minute)
	w.waitState("VLLMGuardOOM", "inactive", 2*time.Minute)

	// A second tenant takes 24 GiB: vLLM (68 GiB at rung 0) dies of OOM,
	// and rung 1 (64 GiB) does not fit beside the tenant either, so vLLM
	// stays down until the tenant leaves.
	tenant := holdGPU(t, s, 24<<30)
	oom := s.WaitEvent("the OOM", 1, 2*time.Minute, isExited)
	if oom.Failure.Verdict.Cause != "oom" || oom.Failure.Decision.Rung.Index != 1 {
		t.Fatalf("failure %+v: want cause oom and next rung 1", oom.Failure)
	}
	// vLLM is down because the guard waits for the memory, naming the tenant.
	tenantPID := fmt.Sprintf("pid %d", tenant.Process.Pid)
	s.WaitEvent("the wait for the tenant's memory", 1, 2*time.Minute, after(oom, func(e events.Event) bool {
		return e.Kind == events.KindState && e.State == "waiting_gpu" && strings.Contains(e.Reason, tenantPID)
	}))
	w.waitState("VLLMGuardOOM", "firing", 2*time.Minute)
	w.waitState("VLLMGuardNotReady", "firing", 2*time.Minute)
	if n := s.CountEvents(isReady); n != 1 {
		t.Fatalf("vLLM was ready again (%d readies) before VLLMGuardNotReady fired: the alert did not fire while vLLM was down", n)
	}
	checkMetrics(t, metricsURL, "down", "vllm_guard_ready 0")

	tenant.Process.Kill()
	tenant.Wait()
	ready := s.WaitEvent("ready on rung 1", 2, 2*time.Minute, isReady)
	if rungOf(ready) != 1 {
		t.Fatalf("ready again on rung %d, want 1", rungOf(ready))
	}
	w.waitState("VLLMGuardNotReady", "inactive", 2*time.Minute)
	// increase(...[1h]), run as [1m]: the OOM leaves the window and the
	// alert clears, with vLLM serving.
	w.waitState("VLLMGuardOOM", "inactive", 3*time.Minute)
	w.close()
	// VLLMGuardGaveUp reads a value the guard publishes: it may not even be
	// pending. VLLMGuardDown reads up == 0, which one scrape that missed its
	// 1 s timeout on a loaded machine sets: pending is that, and is logged
	// in the timeline; firing takes every scrape failing for its whole
	// `for:` (5 s here), which a guard that answers cannot cause.
	for _, c := range w.changes {
		if c.alert == "VLLMGuardGaveUp" || (c.alert == "VLLMGuardDown" && c.state == "firing") {
			t.Errorf("%s went %s: the guard answered the scrapes and never gave up", c.alert, c.state)
		}
	}

	// The timeline: every alert change polled, and the guard's two events.
	timeline := []alertChange{
		{oom.Time, "vLLM died of OOM (the tenant took 24 GiB)", ""},
		{ready.Time, "vLLM ready again on rung 1 (the tenant left)", ""},
	}
	timeline = append(timeline, w.changes...)
	slices.SortStableFunc(timeline, func(a, b alertChange) int { return a.at.Compare(b.at) })
	var lines []string
	for _, c := range timeline {
		lines = append(lines, strings.TrimRight(fmt.Sprintf("%+6.1fs  %-26s %s", c.at.Sub(oom.Time).Seconds(), c.alert, c.state), " "))
	}
	gs, err := p.groups()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		for _, r := range g.Rules {
			if r.Health != "ok" {
				t.Errorf("rule %s: health %q: %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	t.Logf("alert timeline, seconds since the OOM (the shipped rules, every for: and range divided by %d; states polled from /api/v1/rules every 100ms):\n%s",
		forScale, strings.Join(lines, "\n"))
}

// checkMetrics scrapes the guard's /metrics and requires `promtool check
// metrics` to find nothing, and the scrape to hold want (what says when).
func checkMetrics(t *testing.T, url, when, want string) {
	t.Helper()
	scrape := get(t, url, 200)
	if !strings.Contains(scrape, "\n"+want+"\n") {
		t.Fatalf("the scrape while %s lacks %q", when, want)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found in PATH: install Debian's package prometheus (apt-get install prometheus), or run scripts/setup.sh")
	}
	lint := exec.Command(promtool, "check", "metrics")
	lint.Stdin = strings.NewReader(scrape)
	if out, err := lint.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("promtool check metrics on the scrape while %s: %v\n%s", when, err, out)
	}
}

// promServer is a real Prometheus server in a scratch folder.
type promServer struct {
	t      *testing.T
	base   string // http://127.0.0.1:PORT
	dir    string
	target string // the guard's http_listen
	cmd    *exec.Cmd
	exited chan struct{}
}

// startPrometheus runs Debian's prometheus on a free loopback port,
// scraping target every second and evaluating the shipped rules every
// second, its storage in a temporary folder. It is stopped (and waited
// for) at cleanup.
func startPrometheus(t *testing.T, target string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found in PATH: install Debian's package prometheus (apt-get install prometheus), or run scripts/setup.sh")
	}
	rules, err := filepath.Abs(shippedRules)
	if err != nil {
		t.Fatal(err)
	}
	p := &promServer{t: t, dir: t.TempDir(), target: target, exited: make(chan struct{})}
	p.writeConfig(rules)
	addr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	p.base = "http://" + addr
	logf, err := os.Create(filepath.Join(p.dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(bin, "--config.file="+filepath.Join(p.dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(p.dir, "data"), "--web.listen-address="+addr)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	// Killed with the test binary even if the test dies before its cleanup.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(p.dir, "prometheus.log"))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("prometheus log (last %d lines):\n%s", min(40, len(lines)), strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	p.poll("prometheus ready", 2*time.Minute, func() (bool, string) {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	return p
}

// writeConfig writes prometheus.yml: the guard as job vllm-guard, every
// second, and one rules file.
func (p *promServer) writeConfig(rules string) {
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: vllm-guard
    static_configs:
      - targets: [%q]
`, rules, p.target)
	if err := os.WriteFile(filepath.Join(p.dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// poll calls check until it says done; it fails the test at timeout (a
// bound, not a measurement) or when Prometheus exits.
func (p *promServer) poll(what string, timeout time.Duration, check func() (bool, string)) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		done, last := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
		}
		select {
		case <-p.exited:
			p.t.Fatalf("prometheus exited (%v) before %s", p.cmd.ProcessState, what)
		case <-tick.C:
		}
	}
}

// apiGet decodes the data of a Prometheus HTTP API answer.
func (p *promServer) apiGet(path string, data any) error {
	resp, err := http.Get(p.base + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var answer struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return fmt.Errorf("GET %s: %d, not an API answer: %.200s", path, resp.StatusCode, body)
	}
	if answer.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", path, answer.Status, answer.Error)
	}
	return json.Unmarshal(answer.Data, data)
}

// promRule is one rule as /api/v1/rules reports it.
type promRule struct {
	Type        string            `json:"type"` // alerting | recording
	Name        string            `json:"name"`
	Query       string            `json:"query"`
	Duration    float64           `json:"duration"` // for:, in seconds
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // inactive | pending | firing
	Health      string            `json:"health"`
	LastError   string            `json:"lastError"`
}

type promGroup struct {
	Name  string     `json:"name"`
	File  string     `json:"file"`
	Rules []promRule `json:"rules"`
}

func (p *promServer) groups() ([]promGroup, error) {
	var data struct {
		Groups []promGroup `json:"groups"`
	}
	err := p.apiGet("/api/v1/rules", &data)
	return data.Groups, err
}

// rules waits until Prometheus has loaded a rules file and returns its groups.
func (p *promServer) rules() []promGroup {
	p.t.Helper()
	var gs []promGroup
	p.poll("the rules loaded", 2*time.Minute, func() (bool, string) {
		var err error
		gs, err = p.groups()
		if err != nil {
			return false, err.Error()
		}
		return len(gs) > 0, "no rule groups"
	})
	return gs
}

// loadScaledRules writes the shipped rules, as Prometheus parsed them, with
// every `for:` divided by forScale (nothing else changed), reloads
// Prometheus on them (SIGHUP) and checks that it reports the same names,
// expressions, labels and annotations. It returns the loaded alerting
// rules by name.
func (p *promServer) loadScaledRules(shipped []promGroup) map[string]promRule {
	p.t.Helper()
	type rule struct {
		Alert       string            `json:"alert,omitempty"`
		Record      string            `json:"record,omitempty"`
		Expr        string            `json:"expr"`
		For         string            `json:"for,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	type group struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	}
	var file struct {
		Groups []group `json:"groups"`
	}
	for _, g := range shipped {
		out := group{Name: g.Name}
		for _, r := range g.Rules {
			switch r.Type {
			case "alerting":
				d := time.Duration(r.Duration*float64(time.Second)) / forScale
				f := ""
				if d > 0 {
					f = fmt.Sprintf("%dms", d.Milliseconds())
				}
				out.Rules = append(out.Rules, rule{Alert: r.Name, Expr: scaleRanges(p.t, r.Query), For: f, Labels: r.Labels, Annotations: r.Annotations})
			case "recording":
				out.Rules = append(out.Rules, rule{Record: r.Name, Expr: scaleRanges(p.t, r.Query), Labels: r.Labels})
			default:
				p.t.Fatalf("rule %s: unknown type %q in /api/v1/rules", r.Name, r.Type)
			}
		}
		file.Groups = append(file.Groups, out)
	}
	// JSON is YAML: Prometheus reads it as a rules file.
	text, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		p.t.Fatal(err)
	}
	path := filepath.Join(p.dir, "vllm-guard-rules.scaled.json")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.writeConfig(path)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		p.t.Fatal(err)
	}
	var loaded []promGroup
	p.poll("the scaled rules loaded (SIGHUP)", 2*time.Minute, func() (bool, string) {
		gs, err := p.groups()
		if err != nil {
			return false, err.Error()
		}
		loaded = gs
		return len(gs) > 0 && gs[0].File == path, "still the shipped file: a failed reload is in the prometheus log"
	})
	if len(loaded) != len(shipped) {
		p.t.Fatalf("%d rule groups after the reload, %d shipped", len(loaded), len(shipped))
	}
	byName := map[string]promRule{}
	for i, g := range loaded {
		if g.Name != shipped[i].Name || len(g.Rules) != len(shipped[i].Rules) {
			p.t.Fatalf("group %q with %d rules after the reload, shipped %q with %d", g.Name, len(g.Rules), shipped[i].Name, len(shipped[i].Rules))
		}
		for j, r := range g.Rules {
			want := shipped[i].Rules[j]
			if r.Name != want.Name || r.Type != want.Type || r.Query != scaleRanges(p.t, want.Query) ||
				!mapsEqual(r.Labels, want.Labels) || !mapsEqual(r.Annotations, want.Annotations) ||
				math.Abs(r.Duration-want.Duration/forScale) > 0.001 {
				p.t.Fatalf("rule after the reload differs from the shipped one beyond time/%d:\n got  %+v\n want %+v", forScale, r, want)
			}
			if r.Type == "alerting" {
				byName[r.Name] = r
			}
		}
	}
	return byName
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// waitQuery waits until the instant query returns one series whose value
// is want.
func (p *promServer) waitQuery(query string, want float64, timeout time.Duration) {
	p.t.Helper()
	p.poll(fmt.Sprintf("%s = %v in prometheus", query, want), timeout, func() (bool, string) {
		var data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		}
		if err := p.apiGet("/api/v1/query?query="+url.QueryEscape(query), &data); err != nil {
			return false, err.Error()
		}
		if len(data.Result) != 1 {
			return false, fmt.Sprintf("%d series", len(data.Result))
		}
		text, _ := data.Result[0].Value[1].(string)
		v, err := strconv.ParseFloat(text, 64)
		return err == nil && v == want, "value " + text
	})
}

// alertChange is one alert changing state, as polled.
type alertChange struct {
	at           time.Time
	alert, state string
}

// alertWatch polls /api/v1/rules in the background and keeps every
// alerting rule's state and the changes, in order.
type alertWatch struct {
	p       *promServer
	mu      sync.Mutex
	state   map[string]string
	changes []alertChange
	lastErr error
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

func (p *promServer) watch() *alertWatch {
	w := &alertWatch{p: p, state: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.pollOnce()
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
				w.pollOnce()
			}
		}
	}()
	p.t.Cleanup(func() {
		w.close()
		if p.t.Failed() {
			for _, c := range w.changes {
				p.t.Logf("alert %s went %s at %s", c.alert, c.state, c.at.Format("15:04:05.000"))
			}
		}
	})
	return w
}

func (w *alertWatch) pollOnce() {
	gs, err := w.p.groups()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastErr = err
	for _, g := range gs {
		for _, r := range g.Rules {
			if r.Type != "alerting" {
				continue
			}
			prev, seen := w.state[r.Name]
			if !seen {
				prev = "inactive"
			}
			if r.State != prev {
				w.changes = append(w.changes, alertChange{now, r.Name, r.State})
			}
			w.state[r.Name] = r.State
		}
	}
}

// close stops the polling and waits for it.
func (w *alertWatch) close() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// waitState waits until alert is in state.
func (w *alertWatch) waitState(alert, state string, timeout time.Duration) {
	w.p.t.Helper()
	w.p.poll(alert+" "+state, timeout, func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.state[alert] == state, fmt.Sprintf("%s %q, poll error %v", alert, w.state[alert], w.lastErr)
	})
}
