package helm

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"

	corev1 "k8s.io/api/core/v1"

	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
)

var release = Release{Name: "vllm", Namespace: "ml"}

func render(t *testing.T, set ...string) *Rendered {
	t.Helper()
	vals, err := Values(set)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Render(context.Background(), ChartDir, release, vals)
	if err != nil {
		t.Fatalf("--set %q: %v", set, err)
	}
	return r
}

// chartCases are the value sets the chart is rendered with, each with what
// it must change beyond what checkGuardPod checks for all.
var chartCases = []struct {
	name  string
	set   []string
	check func(t *testing.T, o objects, p guardPod)
}{
	{"defaults", nil, func(t *testing.T, o objects, p guardPod) {
		wantCommand(t, p, "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct")
		if p.gpus != 1 {
			t.Errorf("%d GPUs, want 1", p.gpus)
		}
		if p.grace != 45*time.Second || p.stop != 30*time.Second {
			t.Errorf("grace %s for a stop timeout of %s, want 45s for 30s (stopTimeoutSeconds 30 + margin 15)", p.grace, p.stop)
		}
		wantClaim(t, o, p.state, "vllm-state", "1Gi")
		if v := p.volumes["models"]; v.EmptyDir == nil {
			t.Error("the model cache is not an emptyDir by default")
		}
		if !p.nonRoot || *p.spec.SecurityContext.RunAsUser != 1000 || *p.spec.SecurityContext.FSGroup != 1000 {
			t.Error("not uid 1000 with fsGroup 1000 by default")
		}
		if len(o.podMonitors) != 0 {
			t.Error("a PodMonitor by default: it needs the Prometheus Operator's CRDs")
		}
		if len(o.netPolicies) != 0 {
			t.Error("a NetworkPolicy by default: which clients to allow is the operator's to say")
		}
		if p.dep.Spec.Template.Annotations["prometheus.io/scrape"] != "true" {
			t.Error("no prometheus.io/scrape annotation without a PodMonitor")
		}
		if p.cfg.Proxy.Listen != "0.0.0.0:8080" || p.cfg.VLLM.Host != "127.0.0.1" {
			t.Errorf("proxy %q, vLLM host %q: want the proxy on 8080 in front of a vLLM on loopback", p.cfg.Proxy.Listen, p.cfg.VLLM.Host)
		}
		if p.container.Image != "registry.example.com/vllm-guard:v1" {
			t.Errorf("image %q, want the chart's appVersion as its tag", p.container.Image)
		}
	}},
	// The optional NetworkPolicy (issue 41): checkGuardPod holds it to the
	// API and control ports; here, the sources each rule admits.
	{"NetworkPolicy", []string{"networkPolicy.enabled=true",
		"networkPolicy.controlFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring"}, func(t *testing.T, o objects, p guardPod) {
		if len(o.netPolicies) != 1 {
			t.Fatalf("%d NetworkPolicies with networkPolicy.enabled, want 1", len(o.netPolicies))
		}
		rules := o.netPolicies[0].Spec.Ingress
		if len(rules) != 2 {
			t.Fatalf("%d ingress rules, want 2 (API, control)", len(rules))
		}
		if len(rules[0].From) != 0 {
			t.Errorf("the API rule admits only %v; with apiFrom empty, want any source", rules[0].From)
		}
		if f := rules[1].From; len(f) != 1 || f[0].NamespaceSelector == nil ||
			f[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
			t.Errorf("the control rule admits %v; want the namespace monitoring (controlFrom)", f)
		}
	}},
	{"NetworkPolicy without the proxy", []string{"networkPolicy.enabled=true", "proxy=false",
		"networkPolicy.apiFrom[0].podSelector.matchLabels.role=gateway"}, func(t *testing.T, o objects, p guardPod) {
		if len(o.netPolicies) != 1 {
			t.Fatalf("%d NetworkPolicies with networkPolicy.enabled, want 1", len(o.netPolicies))
		}
		if f := o.netPolicies[0].Spec.Ingress[0].From; len(f) != 1 || f[0].PodSelector == nil || f[0].PodSelector.MatchLabels["role"] != "gateway" {
			t.Errorf("the API rule admits %v; want the pods role=gateway (apiFrom)", f)
		}
	}},
	{"PodMonitor", []string{"podMonitor.enabled=true", "podMonitor.labels.release=kube-prometheus-stack", "podMonitor.interval=15s"}, func(t *testing.T, o objects, p guardPod) {
		if len(o.podMonitors) != 1 {
			t.Fatalf("%d PodMonitors, want 1", len(o.podMonitors))
		}
		pm := o.podMonitors[0]
		if pm.Labels["release"] != "kube-prometheus-stack" {
			t.Errorf("PodMonitor labels %v: podMonitor.labels are missing", pm.Labels)
		}
		if ep := pm.Spec.PodMetricsEndpoints[0]; ep.Interval != "15s" || ep.Path != "/metrics" {
			t.Errorf("endpoint interval %q path %q, want 15s /metrics", ep.Interval, ep.Path)
		}
		if _, ok := p.dep.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
			t.Error("prometheus.io/scrape beside a PodMonitor: a Prometheus that honours both scrapes twice")
		}
	}},
	{"two GPUs and more TOML", []string{"gpus=2", "servedModelName=qwen-7b", "extraArgs={--max-model-len,8192}", "profile.maxNumSeqs=128",
		"guardConfig.readiness.stall_timeout=30m", "guardConfig.restart.give_up_after=5", "guardConfig.vllm.env.VLLM_LOGGING_LEVEL=DEBUG",
		"guardConfig.alerts.webhook=https://alerts.example.com/hook?team=ml&x=\"q\""}, func(t *testing.T, o objects, p guardPod) {
		if p.gpus != 2 {
			t.Errorf("%d GPUs, want 2", p.gpus)
		}
		wantCommand(t, p, "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--served-model-name", "qwen-7b", "--tensor-parallel-size", "2", "--max-model-len", "8192")
		c := p.cfg
		if c.ServedModelName() != "qwen-7b" {
			t.Errorf("the guard waits for model %q, want qwen-7b", c.ServedModelName())
		}
		if c.Readiness.StallTimeout.Duration != 30*time.Minute || c.Restart.GiveUpAfter != 5 || c.VLLM.Env["VLLM_LOGGING_LEVEL"] != "DEBUG" ||
			c.Profile.MaxNumSeqs != 128 || c.Alerts.Webhook != `https://alerts.example.com/hook?team=ml&x="q"` {
			t.Errorf("guardConfig and profile did not reach the guard:\n%s", p.toml)
		}
		if c.Profile.GPUMemoryUtilization != 0.85 || c.Log.Format != "json" {
			t.Errorf("a chart default was lost in the merge:\n%s", p.toml)
		}
	}},
	{"pipeline parallel", []string{"gpus=4", "tensorParallelSize=2", "extraArgs={--pipeline-parallel-size,2}"}, func(t *testing.T, o objects, p guardPod) {
		wantCommand(t, p, "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2")
		if p.gpus != 4 {
			t.Errorf("%d GPUs, want 4", p.gpus)
		}
	}},
	{"state on an emptyDir", []string{"persistence.state.enabled=false"}, func(t *testing.T, o objects, p guardPod) {
		if p.state.EmptyDir == nil || len(o.claims) != 0 {
			t.Errorf("state volume %+v and %d claims, want an emptyDir and none", p.state.VolumeSource, len(o.claims))
		}
	}},
	{"existing claims", []string{"persistence.state.existingClaim=guard-state", "persistence.modelCache.enabled=true", "persistence.modelCache.existingClaim=hf-cache"},
		func(t *testing.T, o objects, p guardPod) {
			if len(o.claims) != 0 {
				t.Errorf("%d claims created beside the existing ones", len(o.claims))
			}
			if cl := p.state.PersistentVolumeClaim; cl == nil || cl.ClaimName != "guard-state" {
				t.Errorf("state volume %+v, want claim guard-state", p.state.VolumeSource)
			}
			if cl := p.volumes["models"].PersistentVolumeClaim; cl == nil || cl.ClaimName != "hf-cache" {
				t.Errorf("model cache volume %+v, want claim hf-cache", p.volumes["models"].VolumeSource)
			}
		}},
	{"model cache claim", []string{"persistence.modelCache.enabled=true", "persistence.modelCache.storageClassName=fast"}, func(t *testing.T, o objects, p guardPod) {
		wantClaim(t, o, p.volumes["models"], "vllm-models", "100Gi")
		if sc := o.claims["vllm-models"].Spec.StorageClassName; sc == nil || *sc != "fast" {
			t.Errorf("storageClassName %v, want fast", sc)
		}
		wantClaim(t, o, p.state, "vllm-state", "1Gi")
	}},
	{"long shutdown timeout", []string{"shutdownTimeoutSeconds=120"}, func(t *testing.T, o objects, p guardPod) {
		wantCommand(t, p, "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--shutdown-timeout", "120")
		if p.stop != 130*time.Second || p.grace != 145*time.Second {
			t.Errorf("stop %s, grace %s: want 130s (--shutdown-timeout 120 + 10) and 145s", p.stop, p.grace)
		}
	}},
	{"short shutdown timeout", []string{"shutdownTimeoutSeconds=5", "stopTimeoutSeconds=60"}, func(t *testing.T, o objects, p guardPod) {
		if p.stop != 60*time.Second || p.grace != 75*time.Second {
			t.Errorf("stop %s, grace %s: want 60s (stop_timeout above 5 + 10) and 75s", p.stop, p.grace)
		}
	}},
	{"root", []string{"nonRoot.enabled=false"}, func(t *testing.T, o objects, p guardPod) {
		if p.nonRoot || p.spec.SecurityContext.RunAsUser != nil {
			t.Error("nonRoot.enabled=false still runs as non-root")
		}
		if slices.ContainsFunc(p.container.Env, func(e corev1.EnvVar) bool { return e.Name == "HOME" }) {
			t.Error("HOME moved for root, whose /root the image prepares")
		}
	}},
	{"no proxy", []string{"proxy=false"}, func(t *testing.T, o objects, p guardPod) {
		if p.cfg.Proxy.Listen != "" || p.cfg.VLLM.Host != "0.0.0.0" {
			t.Errorf("proxy %q, vLLM host %q: want no proxy and vLLM on all interfaces", p.cfg.Proxy.Listen, p.cfg.VLLM.Host)
		}
	}},
	{"API key from a Secret", []string{"apiKeySecret.name=vllm-key"}, func(t *testing.T, o objects, p guardPod) {
		var key *corev1.SecretKeySelector
		for _, e := range p.container.Env {
			if e.Name == "VLLM_API_KEY" && e.Value == "" && e.ValueFrom != nil {
				key = e.ValueFrom.SecretKeyRef
			}
		}
		if key == nil || key.Name != "vllm-key" || key.Key != "api-key" {
			t.Errorf("env %v: want VLLM_API_KEY from key api-key of Secret vllm-key", p.container.Env)
		}
		if strings.Contains(p.toml, "API_KEY") || slices.Contains(p.cfg.VLLM.Command, "--api-key") {
			t.Errorf("the key reaches the ConfigMap:\n%s", p.toml)
		}
	}},
	{"secret, env, scheduling", []string{"hfTokenSecret.name=hf", "env[0].name=VLLM_USE_V1", "env[0].value=1",
		"tolerations[0].key=nvidia.com/gpu", "tolerations[0].operator=Exists", "tolerations[0].effect=NoSchedule", "nodeSelector.gpu=h100"},
		func(t *testing.T, o objects, p guardPod) {
			var token, extra bool
			for _, e := range p.container.Env {
				token = token || (e.Name == "HF_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef.Name == "hf" && e.ValueFrom.SecretKeyRef.Key == "token")
				extra = extra || (e.Name == "VLLM_USE_V1" && e.Value == "1")
			}
			if !token || !extra {
				t.Errorf("env %v: want HF_TOKEN from secret hf and VLLM_USE_V1=1", p.container.Env)
			}
			if len(p.spec.Tolerations) != 1 || p.spec.NodeSelector["gpu"] != "h100" {
				t.Errorf("tolerations %v, nodeSelector %v", p.spec.Tolerations, p.spec.NodeSelector)
			}
		}},
}

func wantCommand(t *testing.T, p guardPod, want ...string) {
	t.Helper()
	if !slices.Equal(p.cfg.VLLM.Command, want) {
		t.Errorf("[vllm] command %q, want %q", p.cfg.VLLM.Command, want)
	}
}

func wantClaim(t *testing.T, o objects, v corev1.Volume, name, size string) {
	t.Helper()
	if v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != name {
		t.Errorf("volume %s: %+v, want claim %s", v.Name, v.VolumeSource, name)
		return
	}
	cl, ok := o.claims[name]
	if !ok {
		t.Errorf("no PersistentVolumeClaim %s", name)
		return
	}
	if st := cl.Spec.Resources.Requests[corev1.ResourceStorage]; st.String() != size {
		t.Errorf("claim %s requests %s, want %s", name, st.String(), size)
	}
	if !slices.Equal(cl.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
		t.Errorf("claim %s access modes %v, want ReadWriteOnce", name, cl.Spec.AccessModes)
	}
}

func TestChartRenders(t *testing.T) {
	for _, tc := range chartCases {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			o := decodeAll(t, r.Manifests)
			p := checkGuardPod(t, o)
			if t.Failed() {
				t.Logf("rendered:\n%s", r.YAML())
			}
			tc.check(t, o, p)
			// A changed TOML changes the pod, so the Deployment restarts it.
			if !strings.Contains(r.YAML(), "checksum/config: ") {
				t.Error("no checksum/config annotation: a changed TOML would not restart the pod")
			}
		})
	}
}

// The checksum follows the TOML: the same values give the same pod, a
// changed setting a new one.
func TestChartConfigChecksum(t *testing.T) {
	sum := func(set ...string) string {
		o := decodeAll(t, render(t, set...).Manifests)
		return o.deployments[0].Spec.Template.Annotations["checksum/config"]
	}
	a, b, c := sum(), sum(), sum("guardConfig.readiness.stall_timeout=20m")
	if a == "" || a != b || a == c {
		t.Errorf("checksums %q, %q for the same values and %q for another stall_timeout", a, b, c)
	}
}

// Helm's own linter (helm lint) finds nothing to warn about.
func TestChartLints(t *testing.T) {
	for _, tc := range chartCases {
		vals, err := Values(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		res := lint.RunAll(ChartDir, vals, release.Namespace)
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: %s", tc.name, m)
			}
		}
	}
}

// Values the chart must refuse, each with the words the error must say.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want []string
	}{
		{[]string{"gpus=0"}, []string{"/gpus", "minimum"}},
		{[]string{"gpus=two"}, []string{"/gpus"}},
		{[]string{"modell=x"}, []string{"modell"}},
		{[]string{"profile.gpuMemoryUtilization=1.5"}, []string{"/profile/gpuMemoryUtilization"}},
		{[]string{"stopTimeoutSeconds=30s"}, []string{"/stopTimeoutSeconds"}},
		{[]string{"persistence.state.size=lots"}, []string{"/persistence/state/size"}},
		{[]string{"guardConfig.readiness=5"}, []string{"/guardConfig/readiness"}},
		{[]string{"extraArgs={--shutdown-timeout=60}"}, []string{"extraArgs: --shutdown-timeout=60 is set by the chart", "shutdownTimeoutSeconds"}},
		{[]string{"extraArgs={--max_num_seqs,8}"}, []string{"extraArgs: --max_num_seqs is set by the chart", "profile.maxNumSeqs"}},
		{[]string{"extraArgs={-tp,2}"}, []string{"tensorParallelSize"}},
		{[]string{"tensorParallelSize=2"}, []string{"tensorParallelSize 2 is more than gpus 1"}},
		{[]string{"guardConfig.vllm.command={sh}"}, []string{"guardConfig.vllm.command is set by the chart", "extraArgs"}},
		{[]string{"guardConfig.vllm.stop_timeout=5m"}, []string{"guardConfig.vllm.stop_timeout is set by the chart", "stopTimeoutSeconds"}},
		{[]string{"guardConfig.control.http_listen=0.0.0.0:1"}, []string{"guardConfig.control.http_listen is set by the chart"}},
		{[]string{"guardConfig.control.state_dir=/tmp"}, []string{"guardConfig.control.state_dir is set by the chart"}},
		{[]string{"guardConfig.proxy.listen=:1"}, []string{"guardConfig.proxy.listen is set by the chart"}},
		{[]string{"guardConfig.gpu.devices[0].x=1"}, []string{"guardConfig.gpu.devices"}},
		// vLLM's API key only from a Secret: never in the values (the
		// release's history), the ConfigMap or the pod's command line.
		{[]string{"extraArgs={--api-key,sk-plain-0001}"}, []string{"extraArgs: --api-key is set by the chart", "apiKeySecret"}},
		{[]string{"extraArgs={--api_key=sk-plain-0001}"}, []string{"extraArgs: --api-key is set by the chart", "apiKeySecret"}},
		// Under every spelling vLLM reads as --api-key (issue 32 item 3).
		{[]string{"extraArgs={--api-ke,sk-plain-0001}"}, []string{"extraArgs: --api-ke (vLLM reads it as --api-key) is set by the chart", "apiKeySecret"}},
		{[]string{"extraArgs={--api_k=sk-plain-0001}"}, []string{"extraArgs: --api-k (vLLM reads it as --api-key) is set by the chart", "apiKeySecret"}},
		{[]string{"extraArgs={--max-num-se,8}"}, []string{"--max-num-se (vLLM reads it as --max-num-seqs) is set by the chart", "profile.maxNumSeqs"}},
		{[]string{"extraArgs={--shu=60}"}, []string{"--shu=60 (vLLM reads it as --shutdown-timeout) is set by the chart"}},
		{[]string{"env[0].name=VLLM_API_KEY", "env[0].value=sk-plain-0001"}, []string{"env: VLLM_API_KEY", "apiKeySecret"}},
		{[]string{"guardConfig.vllm.env.VLLM_API_KEY=sk-plain-0001"}, []string{"guardConfig.vllm.env.VLLM_API_KEY", "apiKeySecret"}},
	} {
		vals, err := Values(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Render(context.Background(), ChartDir, release, vals)
		if err == nil {
			t.Errorf("--set %q: rendered without an error", tc.set)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("--set %q: error does not say %q:\n%v", tc.set, w, err)
			}
		}
		if strings.Contains(err.Error(), "sk-plain-0001") {
			t.Errorf("--set %q: the error repeats the key: %v", tc.set, err)
		}
	}
}

// What guardConfig passes through, the guard itself checks: a misspelt
// key renders, and the guard refuses it by name (the pod would exit 78).
func TestChartGuardConfigTypoReachesTheGuard(t *testing.T) {
	o := decodeAll(t, render(t, "guardConfig.readiness.stall_timout=30m").Manifests)
	_, err := guardConfig(t, o.configMaps["vllm"].Data["vllm-guard.toml"])
	if err == nil || !strings.Contains(err.Error(), "did you mean stall_timeout") {
		t.Errorf("the guard's error for stall_timout: %v", err)
	}
}

// Values given as YAML or Go (numbers as float64, nested tables, strings
// that need escaping) reach the guard as written.
func TestChartGuardConfigValues(t *testing.T) {
	vals := map[string]any{
		"profile": map[string]any{"maxNumSeqs": float64(64), "gpuMemoryUtilization": 0.9},
		"guardConfig": map[string]any{
			"restart": map[string]any{"multiplier": float64(3), "jitter": 0.1},
			"vllm":    map[string]any{"env": map[string]any{"A_B": "tab\there \"quoted\" \\ back", "UNICODE": "héllo ✓"}},
			"alerts":  map[string]any{"command": []any{"/usr/local/bin/page", "--team", "in fra"}},
			"gpu":     map[string]any{"devices": []any{}},
		},
	}
	r, err := Render(context.Background(), ChartDir, release, vals)
	if err != nil {
		t.Fatal(err)
	}
	p := checkGuardPod(t, decodeAll(t, r.Manifests))
	c := p.cfg
	if c.Profile.MaxNumSeqs != 64 || c.Profile.GPUMemoryUtilization != 0.9 || c.Restart.Multiplier != 3 || c.Restart.Jitter != 0.1 {
		t.Errorf("numbers changed on the way:\n%s", p.toml)
	}
	if c.VLLM.Env["A_B"] != "tab\there \"quoted\" \\ back" || c.VLLM.Env["UNICODE"] != "héllo ✓" {
		t.Errorf("env %q: strings changed on the way", c.VLLM.Env)
	}
	if !slices.Equal(c.Alerts.Command, []string{"/usr/local/bin/page", "--team", "in fra"}) || len(c.GPU.Devices) != 0 {
		t.Errorf("arrays changed on the way:\n%s", p.toml)
	}
}

func TestChartNotes(t *testing.T) {
	notes := render(t, "shutdownTimeoutSeconds=120").Notes
	for _, want := range []string{"deployment/vllm", "-n ml", "vllm-guard status", "145s", "port-forward svc/vllm 8000:8000"} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
		}
	}
}

// An ambiguous prefix is not the key: vLLM refuses `--api` ("could match
// --api-server-count, --api-key"), and the chart renders it as given; a
// flag that only starts like an owned one is not that flag.
func TestChartLeavesAmbiguousAndOtherFlags(t *testing.T) {
	r := render(t, "extraArgs={--api,4,--gpu-memory-utilization-x,1,--api-server-count,2}")
	cmd := checkGuardPod(t, decodeAll(t, r.Manifests)).cfg.VLLM.Command
	for _, a := range []string{"--api", "--gpu-memory-utilization-x", "--api-server-count"} {
		if !slices.Contains(cmd, a) {
			t.Errorf("command %q lacks %s", cmd, a)
		}
	}
}

// The chart's shortest abbreviations are vllmargs': one reading of vLLM's
// flags for the guard and the chart.
func TestChartKnowsVLLMsAbbreviations(t *testing.T) {
	tpl, err := os.ReadFile(filepath.Join(ChartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(tpl), "{{- $shortest := dict")
	block, _, ok2 := strings.Cut(block, "-}}")
	pairs := regexp.MustCompile(`"(-[^"]*)" "(-[^"]*)"`).FindAllStringSubmatch(block, -1)
	if !ok || !ok2 || len(pairs) == 0 {
		t.Fatal("_helpers.tpl has no $shortest dict")
	}
	for _, p := range pairs {
		if want := vllmargs.ShortestAbbrev(p[1]); p[2] != want {
			t.Errorf("_helpers.tpl: $shortest %s is %q; vLLM reads every name from %q as %s", p[1], p[2], want, p[1])
		}
	}
	if !strings.Contains(block, `"--api-key" "--api-k"`) {
		t.Errorf("$shortest lacks --api-key:\n%s", block)
	}
}
