package helm

import (
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
)

// workerIndex is the label LeaderWorkerSet puts on each pod of a group (0:
// the leader); the templates do not carry it, LeaderWorkerSet adds it.
const workerIndex = "leaderworkerset.sigs.k8s.io/worker-index"

var multiHost = []string{"multiHost.enabled=true", "multiHost.secret.name=vllm-group"}

// asDeployment is a LeaderWorkerSet template as the single pod's checks
// read it: one replica of the template, with the labels LeaderWorkerSet
// gives the pod of that index.
func asDeployment(tmpl corev1.PodTemplateSpec, index string) *appsv1.Deployment {
	tmpl = *tmpl.DeepCopy()
	sel := maps.Clone(tmpl.Labels)
	tmpl.Labels[workerIndex] = index
	return &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1),
		Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
		Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: tmpl}}
}

// The guards read rank, size and the leader's address from LeaderWorkerSet's
// variables, as in the pod.
func lwsEnv(t *testing.T, rank string) {
	t.Setenv("LWS_WORKER_INDEX", rank)
	t.Setenv("LWS_GROUP_SIZE", "2")
	t.Setenv("LWS_LEADER_ADDRESS", "vllm-0.vllm.ml")
}

func TestChartMultiHost(t *testing.T) {
	r := render(t, append(multiHost, "apiKeySecret.name=vllm-key")...)
	o := decodeAll(t, r.Manifests)
	if len(o.deployments) != 0 || len(o.lws) != 1 {
		t.Fatalf("%d Deployments and %d LeaderWorkerSets with multiHost, want none and one", len(o.deployments), len(o.lws))
	}
	l := o.lws[0]
	lt := l.Spec.LeaderWorkerTemplate
	if l.Spec.StartupPolicy != lwsv1.LeaderCreatedStartupPolicy {
		t.Errorf("startupPolicy %q: want LeaderCreated (LeaderReady waits for a leader that is ready only once every worker loaded)", l.Spec.StartupPolicy)
	}
	if lt.RestartPolicy != lwsv1.RecreateGroupOnPodRestart {
		t.Errorf("restartPolicy %q: want RecreateGroupOnPodRestart (a dead pod or guard recreates the group)", lt.RestartPolicy)
	}
	if lt.Size == nil || *lt.Size != 2 || l.Spec.Replicas == nil || *l.Spec.Replicas != 1 {
		t.Errorf("size %v, replicas %v: want a group of 2, one group (the leader's state claim is one)", lt.Size, l.Spec.Replicas)
	}
	if lt.LeaderTemplate == nil {
		t.Fatal("no leaderTemplate: the leader and the workers run different TOML")
	}

	// The leader: every check of the single pod (the Service, the state
	// claim, the probes, the privileges), as rank 0.
	lwsEnv(t, "0")
	lo := o
	lo.deployments = []*appsv1.Deployment{asDeployment(*lt.LeaderTemplate, "0")}
	leader := checkGuardPod(t, lo)
	g := leader.cfg.Group
	if !g.Enabled || g.Rank != 0 || g.Size != 2 || g.LeaderAddress != "vllm-0.vllm.ml" || g.Parallelism != "tp" {
		t.Errorf("the leader's [group] %+v: want enabled, rank/size/leader from LWS_*, tp", g)
	}
	wantCommand(t, leader, "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--tensor-parallel-size", "2")
	if leader.cfg.Restart.OnGiveUp != "stay" {
		t.Errorf("on_give_up %q: a leader that exits on giving up makes LeaderWorkerSet recreate the group, again and again", leader.cfg.Restart.OnGiveUp)
	}
	wantClaim(t, o, leader.state, "vllm-state", "1Gi")
	secretMounted(t, "the leader", leader)
	if !slices.ContainsFunc(leader.container.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == int32(g.Port) }) {
		t.Errorf("the leader's container has no port %d: the workers' guards connect to it", g.Port)
	}
	svc := o.services[0]
	if svc.Spec.Selector[workerIndex] != "0" {
		t.Errorf("the Service's selector %v: want the leader only (%s=0)", svc.Spec.Selector, workerIndex)
	}
	workerLabels := maps.Clone(lt.WorkerTemplate.Labels)
	workerLabels[workerIndex] = "1"
	if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(workerLabels)) {
		t.Errorf("the Service's selector %v selects a worker (it serves no client)", svc.Spec.Selector)
	}

	// A worker: its own TOML (no proxy), its state on an emptyDir, no
	// API port.
	lwsEnv(t, "1")
	wo := o
	wo.deployments = []*appsv1.Deployment{asDeployment(lt.WorkerTemplate, "1")}
	ws := wo.deployments[0].Spec.Template.Spec
	c := ws.Containers[0]
	var cfgVol *corev1.Volume
	for i, v := range ws.Volumes {
		if v.Name == "config" {
			cfgVol = &ws.Volumes[i]
		}
	}
	file := c.Args[slices.Index(c.Args, "--config")+1]
	if cfgVol == nil || cfgVol.ConfigMap == nil || len(cfgVol.ConfigMap.Items) != 1 || cfgVol.ConfigMap.Items[0].Path != path.Base(file) {
		t.Fatalf("the worker's config volume %+v: want the worker's key at %s", cfgVol, file)
	}
	toml := o.configMaps[cfgVol.ConfigMap.Name].Data[cfgVol.ConfigMap.Items[0].Key]
	wc := loadGuardConfig(t, toml)
	if wc.Group.Rank != 1 || !wc.Group.Enabled || wc.Proxy.Listen != "" {
		t.Errorf("the worker's TOML: rank %d, group %v, proxy %q; want rank 1 from LWS_WORKER_INDEX, the group, no proxy:\n%s", wc.Group.Rank, wc.Group.Enabled, wc.Proxy.Listen, toml)
	}
	args, err := wc.VLLMArgs(nil)
	if err != nil {
		t.Fatalf("the worker's vLLM command: %v", err)
	}
	if flags, err := args.GroupFlags(wc.Group.VLLM()); err != nil || !slices.Contains(flags, "--headless") {
		t.Errorf("the worker's group flags %q, %v: want --headless", flags, err)
	}
	for _, p := range c.Ports {
		if p.Name == "http" {
			t.Errorf("the worker publishes an API port %d: its vLLM is headless, it serves no client", p.ContainerPort)
		}
	}
	for _, v := range ws.Volumes {
		if v.Name == "state" && v.EmptyDir == nil {
			t.Errorf("the worker's state volume %+v: want an emptyDir (the leader's claim is the leader's)", v.VolumeSource)
		}
	}
	worker := guardPod{container: c, cfg: wc, volumes: map[string]corev1.Volume{}, mounts: map[string]corev1.VolumeMount{}}
	for _, v := range ws.Volumes {
		worker.volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		worker.mounts[m.MountPath] = m
	}
	secretMounted(t, "a worker", worker)
	if t.Failed() {
		t.Logf("rendered:\n%s", r.YAML())
	}
}

// secretMounted: [group] secret_file is a key of the group's Secret,
// mounted read-only.
func secretMounted(t *testing.T, who string, p guardPod) {
	t.Helper()
	f := p.cfg.Group.SecretFile
	m, ok := p.mounts[path.Dir(f)]
	if !ok || !m.ReadOnly {
		t.Errorf("%s: secret_file %s is in no read-only mount", who, f)
		return
	}
	s := p.volumes[m.Name].Secret
	if s == nil || s.SecretName != "vllm-group" || path.Base(f) != "secret" {
		t.Errorf("%s: secret_file %s is not key secret of Secret vllm-group (volume %+v)", who, f, p.volumes[m.Name].VolumeSource)
	}
}

func TestChartMultiHostRefuses(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want []string
	}{
		{[]string{"multiHost.enabled=true"}, []string{"multiHost.secret.name is empty"}},
		{append(multiHost, "guardConfig.restart.on_give_up=exit"), []string{"guardConfig.restart.on_give_up \"exit\" with multiHost", "recreates the group"}},
		{append(multiHost, "guardConfig.group.rank=1"), []string{"guardConfig.group.rank is set by the chart", "LWS_WORKER_INDEX"}},
		{append(multiHost, "guardConfig.group.secret_file=/x"), []string{"guardConfig.group.secret_file is set by the chart"}},
		{append(multiHost, "tensorParallelSize=4"), []string{"tensorParallelSize 4 is more than the group's 2 GPUs"}},
		{append(multiHost, "multiHost.size=1"), []string{"/multiHost/size"}},
		{append(multiHost, "multiHost.parallelism=ray"), []string{"/multiHost/parallelism"}},
	} {
		vals, err := Values(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Render(t.Context(), ChartDir, release, vals)
		if err == nil {
			t.Errorf("--set %q: rendered without an error", tc.set)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("--set %q: error does not say %q:\n%v", tc.set, w, err)
			}
		}
	}
}

// Pipeline parallel across the hosts: each pod's GPUs are its tensor
// parallel ranks; the group's own settings pass through guardConfig.
func TestChartMultiHostPipelineAndGroupSettings(t *testing.T) {
	r := render(t, append(multiHost, "gpus=2", "multiHost.parallelism=pp", "extraArgs={--pipeline-parallel-size,2}",
		"guardConfig.group.heartbeat_interval=500ms", "guardConfig.restart.give_up_after=3")...)
	o := decodeAll(t, r.Manifests)
	lwsEnv(t, "0")
	lo := o
	lo.deployments = []*appsv1.Deployment{asDeployment(*o.lws[0].Spec.LeaderWorkerTemplate.LeaderTemplate, "0")}
	p := checkGuardPod(t, lo)
	wantCommand(t, p, "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2")
	if p.cfg.Group.Parallelism != "pp" || p.cfg.Group.HeartbeatInterval.String() != "500ms" || p.cfg.Restart.GiveUpAfter != 3 || p.cfg.Restart.OnGiveUp != "stay" {
		t.Errorf("[group] %+v, [restart] %+v: want pp, heartbeats every 500ms, give up after 3, stay", p.cfg.Group, p.cfg.Restart)
	}
}

// The NetworkPolicy lets the group's pods reach each other (the guards'
// port, vLLM's rendezvous and its random ports) and no one else beyond the
// API and control ports.
func TestChartMultiHostNetworkPolicy(t *testing.T) {
	o := decodeAll(t, render(t, append(multiHost, "networkPolicy.enabled=true")...).Manifests)
	rules := o.netPolicies[0].Spec.Ingress
	if len(rules) != 3 {
		t.Fatalf("%d ingress rules, want 3 (API, control, the group)", len(rules))
	}
	g := rules[2]
	if len(g.Ports) != 0 || len(g.From) != 1 || g.From[0].PodSelector == nil {
		t.Fatalf("the group's rule %+v: want every port, from the release's pods", g)
	}
	sel, _ := metav1.LabelSelectorAsSelector(g.From[0].PodSelector)
	tmpl := o.lws[0].Spec.LeaderWorkerTemplate
	if !sel.Matches(labels.Set(tmpl.WorkerTemplate.Labels)) || !sel.Matches(labels.Set(tmpl.LeaderTemplate.Labels)) {
		t.Errorf("the group's rule admits %v, which is not the group's pods", sel)
	}
}

func TestChartMultiHostNotes(t *testing.T) {
	notes := render(t, multiHost...).Notes
	for _, want := range []string{"leaderworkerset/vllm", "exec vllm-0 -- vllm-guard status", "leaderworkerset.sigs.k8s.io/name=vllm"} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "deploy/") {
		t.Errorf("NOTES.txt names a Deployment the multiHost mode does not make:\n%s", notes)
	}
}

// Helm's linter finds nothing to warn about in the multiHost mode.
func TestChartMultiHostLints(t *testing.T) {
	vals, err := Values(append(multiHost, "networkPolicy.enabled=true", "podMonitor.enabled=true"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range lint.RunAll(ChartDir, vals, release.Namespace).Messages {
		if m.Severity >= support.WarningSev {
			t.Error(m)
		}
	}
}
