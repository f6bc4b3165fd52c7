package helm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// manifestsDir holds the plain manifests (kubectl apply -f), beside the chart.
const manifestsDir = "../kubernetes"

// readManifests reads every YAML file under dir, one Manifest a document.
func readManifests(t *testing.T, dir string) []Manifest {
	t.Helper()
	var ms []Manifest
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, doc := range documents(string(b)) {
			ms = append(ms, Manifest{Source: path, Text: doc})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// The plain manifests pass the checks the chart passes, decoded as strictly.
func TestKubernetesManifests(t *testing.T) {
	o := decodeAll(t, readManifests(t, manifestsDir))
	p := checkGuardPod(t, o)
	if p.state.PersistentVolumeClaim == nil {
		t.Error("state_dir is not on a PersistentVolumeClaim: a rescheduled pod would forget the rung")
	} else if _, ok := o.claims[p.state.PersistentVolumeClaim.ClaimName]; !ok {
		t.Errorf("the state claim %s is not in the manifests", p.state.PersistentVolumeClaim.ClaimName)
	}
	if !p.nonRoot {
		t.Error("the manifests run the guard and vLLM as root")
	}
	// vLLM's API key only ever from a Secret.
	key := false
	for _, e := range p.container.Env {
		if e.Name == "VLLM_API_KEY" {
			key = e.Value == "" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
		}
	}
	if !key || strings.Contains(p.toml, "api-key") || strings.Contains(p.toml, "API_KEY") {
		t.Errorf("VLLM_API_KEY is not taken from a Secret (env %v), or a key is in the ConfigMap", p.container.Env)
	}
	if len(o.podMonitors) != 1 {
		t.Errorf("%d PodMonitors in %s, want 1 (monitoring/podmonitor.yaml)", len(o.podMonitors), manifestsDir)
	}
	if len(o.configMaps) != 1 {
		t.Errorf("%d ConfigMaps, want the guard's one", len(o.configMaps))
	}
	// `vllm-guard check` warns when a config's stop would outlast the
	// example's 60s (cmd/vllm-guard: exampleGracePeriodInK8s).
	if p.grace != 60*time.Second {
		t.Errorf("terminationGracePeriodSeconds %s: `vllm-guard check` compares configs with the example's 60s; change both together", p.grace)
	}
}
