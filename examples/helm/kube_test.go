package helm

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"
	"sigs.k8s.io/yaml"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/supervisor"
)

// kinds are the objects the chart and the manifests may hold, by
// apiVersion and kind, each with its Go type from the Kubernetes API (and
// the Prometheus Operator's for PodMonitor).
var kinds = map[string]func() any{
	"v1 ConfigMap":                                func() any { return new(corev1.ConfigMap) },
	"v1 Service":                                  func() any { return new(corev1.Service) },
	"v1 PersistentVolumeClaim":                    func() any { return new(corev1.PersistentVolumeClaim) },
	"apps/v1 Deployment":                          func() any { return new(appsv1.Deployment) },
	"monitoring.coreos.com/v1 PodMonitor":         func() any { return new(monitoringv1.PodMonitor) },
	"networking.k8s.io/v1 NetworkPolicy":          func() any { return new(networkingv1.NetworkPolicy) },
	"leaderworkerset.x-k8s.io/v1 LeaderWorkerSet": func() any { return new(lwsv1.LeaderWorkerSet) },
}

// decodeStrict decodes one YAML document into its API type as the API
// server's strict field validation does: field names match case and all
// (encoding/json would take readonly for readOnly); an unknown field, a
// duplicate key, a wrong type or a kind not in kinds is an error.
func decodeStrict(doc []byte) (any, error) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
		return nil, err
	}
	newObj, ok := kinds[tm.APIVersion+" "+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q kind %q is none of the kinds these tests know (add its API type to kinds)", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	strict, err := kjson.UnmarshalStrict(j, obj)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	return obj, nil
}

// objects is what a chart render or a folder of manifests holds.
type objects struct {
	configMaps  map[string]*corev1.ConfigMap
	claims      map[string]*corev1.PersistentVolumeClaim
	services    []*corev1.Service
	deployments []*appsv1.Deployment
	podMonitors []*monitoringv1.PodMonitor
	netPolicies []*networkingv1.NetworkPolicy
	lws         []*lwsv1.LeaderWorkerSet
}

// decodeAll decodes every manifest strictly; it fails the test for each
// one that does not decode.
func decodeAll(t *testing.T, ms []Manifest) objects {
	t.Helper()
	o := objects{configMaps: map[string]*corev1.ConfigMap{}, claims: map[string]*corev1.PersistentVolumeClaim{}}
	for _, m := range ms {
		obj, err := decodeStrict([]byte(m.Text))
		if err != nil {
			t.Errorf("%s: %v", m.Source, err)
			continue
		}
		meta := obj.(metav1.Object)
		for _, msg := range validation.IsDNS1123Subdomain(meta.GetName()) {
			t.Errorf("%s: name %q: %s", m.Source, meta.GetName(), msg)
		}
		checkLabels(t, m.Source+": metadata.labels", meta.GetLabels())
		switch x := obj.(type) {
		case *corev1.ConfigMap:
			o.configMaps[x.Name] = x
		case *corev1.PersistentVolumeClaim:
			o.claims[x.Name] = x
		case *corev1.Service:
			o.services = append(o.services, x)
		case *appsv1.Deployment:
			o.deployments = append(o.deployments, x)
		case *monitoringv1.PodMonitor:
			o.podMonitors = append(o.podMonitors, x)
		case *networkingv1.NetworkPolicy:
			o.netPolicies = append(o.netPolicies, x)
		case *lwsv1.LeaderWorkerSet:
			o.lws = append(o.lws, x)
		}
	}
	return o
}

func checkLabels(t *testing.T, what string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			t.Errorf("%s: %s=%s: %s", what, k, v, msg)
		}
	}
}

// guardPod is the Deployment running the guard, with what the checks
// found in it, for a test to assert on its value set.
type guardPod struct {
	dep       *appsv1.Deployment
	spec      corev1.PodSpec
	container corev1.Container
	cfg       *config.Config
	toml      string
	grace     time.Duration // terminationGracePeriodSeconds
	stop      time.Duration // the guard's effective stop timeout
	gpus      int64
	state     corev1.Volume // the volume at state_dir
	nonRoot   bool
	mounts    map[string]corev1.VolumeMount // by mount path
	volumes   map[string]corev1.Volume      // by name
}

// checkGuardPod checks what every way of running the guard on Kubernetes
// must get right, and returns the pod for more checks.
func checkGuardPod(t *testing.T, o objects) guardPod {
	t.Helper()
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments, want 1", len(o.deployments))
	}
	p := guardPod{dep: o.deployments[0], spec: o.deployments[0].Spec.Template.Spec,
		mounts: map[string]corev1.VolumeMount{}, volumes: map[string]corev1.Volume{}}
	dep := p.dep
	if dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q: want Recreate (a rolling update needs a second set of GPUs and shares the state volume)", dep.Spec.Strategy.Type)
	}
	if r := dep.Spec.Replicas; r != nil && *r != 1 {
		t.Errorf("replicas %d: want 1, the state volume belongs to one guard", *r)
	}
	podLabels := labels.Set(dep.Spec.Template.Labels)
	checkLabels(t, "pod labels", podLabels)
	selects(t, "the Deployment's selector", dep.Spec.Selector, podLabels)
	if len(p.spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1: the guard (vLLM is its child)", len(p.spec.Containers))
	}
	c := p.spec.Containers[0]
	p.container = c
	ports := map[string]int32{}
	for _, cp := range c.Ports {
		for _, msg := range validation.IsValidPortName(cp.Name) {
			t.Errorf("container port %q: %s", cp.Name, msg)
		}
		ports[cp.Name] = cp.ContainerPort
	}

	// Volumes: every mount has its volume, every volume is mounted.
	for _, v := range p.spec.Volumes {
		p.volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		if _, ok := p.volumes[m.Name]; !ok {
			t.Errorf("volumeMount %s: no volume %q", m.MountPath, m.Name)
		}
		p.mounts[m.MountPath] = m
	}
	for name := range p.volumes {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == name }) {
			t.Errorf("volume %q is mounted nowhere", name)
		}
	}

	// The guard's TOML: the file --config names, in the ConfigMap mounted
	// there, is one the guard's own config package accepts.
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("args %q: no --config FILE", c.Args)
	}
	file := c.Args[i+1]
	m, ok := p.mounts[path.Dir(file)]
	if !ok || p.volumes[m.Name].ConfigMap == nil {
		t.Fatalf("--config %s: no ConfigMap volume mounted at %s", file, path.Dir(file))
	}
	cm, ok := o.configMaps[p.volumes[m.Name].ConfigMap.Name]
	if !ok {
		t.Fatalf("ConfigMap %q (volume %s) is not among the objects", p.volumes[m.Name].ConfigMap.Name, m.Name)
	}
	p.toml, ok = cm.Data[path.Base(file)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s for --config %s", cm.Name, path.Base(file), file)
	}
	p.cfg = loadGuardConfig(t, p.toml)
	if _, err := p.cfg.VLLMArgs(nil); err != nil {
		t.Errorf("vLLM's command line %q: %v", p.cfg.VLLM.Command, err)
	}

	// Probes ask the guard's control port, and need no start-up hacks:
	// /livez is 200 while vLLM loads.
	host, portText, err := net.SplitHostPort(p.cfg.Control.HTTPListen)
	if err != nil || (host != "" && host != "0.0.0.0" && host != "::") {
		t.Errorf("[control] http_listen %q: the kubelet's probes and Prometheus need it on all interfaces", p.cfg.Control.HTTPListen)
	}
	controlPort, _ := strconv.Atoi(portText)
	for _, pr := range []struct {
		what, path string
		probe      *corev1.Probe
	}{{"livenessProbe", "/livez", c.LivenessProbe}, {"readinessProbe", "/readyz", c.ReadinessProbe}} {
		switch {
		case pr.probe == nil || pr.probe.HTTPGet == nil:
			t.Errorf("no %s httpGet", pr.what)
		case pr.probe.HTTPGet.Path != pr.path:
			t.Errorf("%s path %q, want %s", pr.what, pr.probe.HTTPGet.Path, pr.path)
		case portNumber(pr.probe.HTTPGet.Port, ports) != controlPort:
			t.Errorf("%s port %s is not the guard's control port %d ([control] http_listen)", pr.what, pr.probe.HTTPGet.Port.String(), controlPort)
		case pr.probe.InitialDelaySeconds != 0:
			t.Errorf("%s initialDelaySeconds %d: /livez and /readyz answer from the start, no delay is needed", pr.what, pr.probe.InitialDelaySeconds)
		}
	}
	if c.StartupProbe != nil {
		t.Error("a startupProbe: /livez is 200 while vLLM loads, so it is not needed")
	}

	// The kubelet waits longer than the guard's stop takes.
	if p.spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds: Kubernetes' default 30s kills vLLM mid-shutdown")
	}
	p.grace = time.Duration(*p.spec.TerminationGracePeriodSeconds) * time.Second
	var drain time.Duration
	if args, err := p.cfg.VLLMArgs(nil); err == nil {
		drain = args.ShutdownTimeout
	}
	p.stop = supervisor.EffectiveStopTimeout(p.cfg.VLLM.StopTimeout.Duration, drain)
	if p.grace < p.stop+5*time.Second { // the margin `vllm-guard check` asks for
		t.Errorf("terminationGracePeriodSeconds %s is not 5s above the guard's stop timeout %s", p.grace, p.stop)
	}

	// GPUs: the device plugin's resource, requests equal to limits.
	gpu, ok := c.Resources.Limits["nvidia.com/gpu"]
	if !ok || gpu.Value() < 1 {
		t.Errorf("limits nvidia.com/gpu %q: want a whole number of GPUs, at least 1", gpu.String())
	}
	p.gpus = gpu.Value()
	if req, ok := c.Resources.Requests["nvidia.com/gpu"]; ok && !req.Equal(gpu) {
		t.Errorf("requests nvidia.com/gpu %s differs from limits %s (Kubernetes refuses that)", req.String(), gpu.String())
	}

	// Where the guard writes: state_dir, the socket's folder; /dev/shm for
	// vLLM's workers.
	state, ok := p.mounts[p.cfg.Control.StateDir]
	if !ok || state.ReadOnly {
		t.Errorf("state_dir %s is not on a writable volume", p.cfg.Control.StateDir)
	}
	p.state = p.volumes[state.Name]
	if cl := p.state.PersistentVolumeClaim; cl != nil && cl.ReadOnly {
		t.Errorf("state_dir's claim %s is mounted read-only", cl.ClaimName)
	}
	if p.state.PersistentVolumeClaim == nil && p.state.EmptyDir == nil {
		t.Errorf("state_dir's volume %q is neither a PersistentVolumeClaim nor an emptyDir", p.state.Name)
	}
	// The socket's folder is one the guard makes itself, inside a writable
	// volume: a volume's own root is the kubelet's (an emptyDir is 0777,
	// 02777 with fsGroup), writable by anyone, and the guard exits 78 there.
	sockDir := path.Dir(p.cfg.Control.Socket)
	if m, ok := p.mounts[sockDir]; ok {
		t.Errorf("the socket's folder %s is the root of volume %s, which the kubelet makes writable by anyone (0777, 02777 with fsGroup): the guard refuses it and exits 78; put the socket in a subfolder the guard makes", sockDir, m.Name)
	} else if m, ok := p.mounts[path.Dir(sockDir)]; !ok || m.ReadOnly {
		t.Errorf("the socket's folder %s is not in a writable volume: the guard makes it, so %s must be one", sockDir, path.Dir(sockDir))
	}
	if m, ok := p.mounts["/dev/shm"]; !ok || p.volumes[m.Name].EmptyDir == nil || p.volumes[m.Name].EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Error("/dev/shm is not a memory emptyDir: vLLM's workers share tensors through it")
	}
	for name := range o.claims {
		if !slices.ContainsFunc(p.spec.Volumes, func(v corev1.Volume) bool {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == name
		}) {
			t.Errorf("PersistentVolumeClaim %s is used by no volume", name)
		}
		if st := o.claims[name].Spec.Resources.Requests[corev1.ResourceStorage]; st.Sign() <= 0 {
			t.Errorf("PersistentVolumeClaim %s requests no storage", name)
		}
	}

	// No privileges: what vLLM and the guard need is a writable HOME at most.
	sc, psc := c.SecurityContext, p.spec.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("the container may gain privileges: set securityContext.allowPrivilegeEscalation false")
	}
	if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		t.Error("the container keeps capabilities: drop ALL and add none")
	}
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		t.Error("the container is privileged")
	}
	seccomp := func(p *corev1.SeccompProfile) bool {
		return p != nil && p.Type == corev1.SeccompProfileTypeRuntimeDefault
	}
	if !(sc != nil && seccomp(sc.SeccompProfile)) && !(psc != nil && seccomp(psc.SeccompProfile)) {
		t.Error("no RuntimeDefault seccomp profile")
	}
	p.nonRoot = (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
	if p.nonRoot {
		if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
			t.Error("runAsNonRoot with no runAsUser: vLLM's image names root as its user, so the pod would not start")
		}
	}
	for _, e := range c.Env {
		if (e.Name == "HOME" || e.Name == "HF_HOME") && !underWritableMount(e.Value, c.VolumeMounts) {
			t.Errorf("%s=%s is on no writable volume", e.Name, e.Value)
		}
	}
	if p.nonRoot && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "HOME" }) {
		t.Error("running as non-root with the image's HOME (/root, not the user's): vLLM's caches would not be writable")
	}
	// Non-root runs on a read-only root file system: then every place
	// the guard and vLLM write must be a writable volume.
	readOnly := sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	if p.nonRoot && !readOnly {
		t.Error("running as non-root with a writable root file system: set securityContext.readOnlyRootFilesystem")
	}
	if readOnly {
		dirs := []string{"/tmp", "/dev/shm", p.cfg.Control.StateDir}
		if p.cfg.Control.Socket != "" {
			dirs = append(dirs, filepath.Dir(p.cfg.Control.Socket))
		}
		for _, dir := range dirs {
			if !underWritableMount(dir, c.VolumeMounts) {
				t.Errorf("%s is on no writable volume, and the root file system is read-only", dir)
			}
		}
	}

	// The Service reaches the pod by name, the API port on whatever
	// serves clients (the guard's proxy, else vLLM).
	if len(o.services) != 1 {
		t.Fatalf("%d Services, want 1", len(o.services))
	}
	svc := o.services[0]
	for _, msg := range validation.IsDNS1035Label(svc.Name) {
		t.Errorf("Service name %q: %s", svc.Name, msg)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("the Service's selector %v does not select the pod (labels %v)", svc.Spec.Selector, podLabels)
	}
	serving := p.cfg.VLLM.Port
	if p.cfg.Proxy.Listen != "" {
		_, pp, _ := net.SplitHostPort(p.cfg.Proxy.Listen)
		serving, _ = strconv.Atoi(pp)
	}
	var api bool
	for _, sp := range svc.Spec.Ports {
		n := portNumber(sp.TargetPort, ports)
		if sp.TargetPort.Type == intstr.String && n == 0 {
			t.Errorf("Service port %s: targetPort %q names no container port", sp.Name, sp.TargetPort.StrVal)
		}
		api = api || n == serving
		if n == controlPort {
			// The probes and scrapes reach the pod's address; published,
			// any client of the Service could hold the port's few
			// connections and fail /livez (issue 24).
			t.Errorf("Service port %s publishes the guard's control port %d; only the kubelet and Prometheus need it, on the pod's address", sp.Name, controlPort)
		}
	}
	if !api {
		t.Errorf("no Service port reaches the port clients use (%d: the proxy's listen, else [vllm] port)", serving)
	}
	if p.cfg.Proxy.Listen == "" {
		if h := p.cfg.VLLM.Host; h != "0.0.0.0" && h != "::" {
			t.Errorf("no proxy, and [vllm] host %q: the Service cannot reach vLLM", h)
		}
	}

	// PodMonitors scrape the guard's /metrics.
	for _, pm := range o.podMonitors {
		selects(t, "PodMonitor "+pm.Name+"'s selector", &pm.Spec.Selector, podLabels)
		if len(pm.Spec.PodMetricsEndpoints) == 0 {
			t.Errorf("PodMonitor %s has no endpoint", pm.Name)
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port == nil || ports[*ep.Port] != int32(controlPort) {
				t.Errorf("PodMonitor %s: port %v is not the container port of the guard's control port %d", pm.Name, ep.Port, controlPort)
			}
			if ep.Path != "" && ep.Path != "/metrics" {
				t.Errorf("PodMonitor %s: path %q, the guard serves /metrics", pm.Name, ep.Path)
			}
		}
	}

	// Nothing in the pod talks to the Kubernetes API: no token is mounted
	// for vLLM, or a model's remote code, to find (issue 41).
	if a := p.spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the pod mounts a service-account token (automountServiceAccountToken is not false); nothing in it needs one")
	}
	// A NetworkPolicy opens the API port and the guard's control port, and
	// nothing else: every rule names its ports, all of them the pod's.
	for _, np := range o.netPolicies {
		selects(t, "NetworkPolicy "+np.Name+"'s podSelector", &np.Spec.PodSelector, podLabels)
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("NetworkPolicy %s: policyTypes %v, want [Ingress] (egress left open: vLLM downloads weights)", np.Name, np.Spec.PolicyTypes)
		}
		open := map[int]bool{}
		for i, rule := range np.Spec.Ingress {
			if len(rule.Ports) == 0 {
				t.Errorf("NetworkPolicy %s: ingress rule %d names no port: it opens every port", np.Name, i)
			}
			for _, rp := range rule.Ports {
				n := 0
				if rp.Port != nil {
					n = portNumber(*rp.Port, ports)
				}
				if n == 0 || rp.Protocol == nil || *rp.Protocol != corev1.ProtocolTCP {
					t.Errorf("NetworkPolicy %s: port %v (%v) is not a TCP port of the container", np.Name, rp.Port, rp.Protocol)
				}
				open[n] = true
			}
		}
		if want := map[int]bool{serving: true, controlPort: true}; !maps.Equal(open, want) {
			t.Errorf("NetworkPolicy %s opens ports %v; want the API port %d and the control port %d", np.Name, open, serving, controlPort)
		}
	}
	return p
}

func selects(t *testing.T, what string, sel *metav1.LabelSelector, set labels.Set) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if s.Empty() || !s.Matches(set) {
		t.Errorf("%s %v does not select the pod (labels %v)", what, sel, set)
	}
}

// portNumber resolves a port by number or by the container port's name (0
// when the name is unknown).
func portNumber(p intstr.IntOrString, named map[string]int32) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	return int(named[p.StrVal])
}

func underWritableMount(dir string, mounts []corev1.VolumeMount) bool {
	return slices.ContainsFunc(mounts, func(m corev1.VolumeMount) bool {
		return !m.ReadOnly && (dir == m.MountPath || strings.HasPrefix(dir, strings.TrimSuffix(m.MountPath, "/")+"/"))
	})
}

// loadGuardConfig reads TOML as the guard does: strictly, with its checks.
func loadGuardConfig(t *testing.T, toml string) *config.Config {
	t.Helper()
	cfg, err := guardConfig(t, toml)
	if err != nil {
		t.Fatalf("the guard refuses its TOML: %v\n%s", err, toml)
	}
	return cfg
}

func guardConfig(t *testing.T, toml string) (*config.Config, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "vllm-guard.toml")
	if err := os.WriteFile(file, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	return config.Load(file)
}

// Strict decoding is what makes the checks above worth anything: a
// misspelt field, a duplicate key or an unknown kind must fail.
func TestDecodeStrictRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: x\n          livenesProbe: {}\n",
		"duplicate key":    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
		"wrong type":       "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: eighty}]}\n",
		"bad quantity":     "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: x}\nspec: {resources: {requests: {storage: lots}}}\n",
		"unknown kind":     "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
		"old apiVersion":   "apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata: {name: x}\n",
		"PodMonitor field": "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\nspec: {selector: {}, podMetricsEndpoints: [{prot: guard}]}\n",
	} {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
	if _, err := decodeStrict([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")); err != nil {
		t.Errorf("a plain ConfigMap: %v", err)
	}
}
