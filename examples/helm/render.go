// Package helm renders the vllm-guard chart (examples/helm/vllm-guard) with
// Helm's own Go library, as `helm template` does: the chart's values.yaml,
// the user's --set assignments over it, values.schema.json checked, every
// template rendered. Its tests decode each rendered object strictly into the
// Kubernetes API types, and the plain manifests in examples/kubernetes too.
//
// It is a Go module of its own so that Helm and the Kubernetes API types stay
// out of the guard's module.
package helm

import (
	"context"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
)

// ChartDir is the chart, relative to this module's root.
const ChartDir = "vllm-guard"

// Release names the release a chart is rendered for, as `helm install NAME`.
type Release struct {
	Name, Namespace string
}

// Manifest is one rendered YAML document that holds an object.
type Manifest struct {
	Source string // its template, e.g. "vllm-guard/templates/deployment.yaml"
	Text   string
}

// Rendered is what `helm install --dry-run` would send and print.
type Rendered struct {
	Manifests []Manifest // sorted by template
	Notes     string     // templates/NOTES.txt, rendered
}

// SetFlags collects every --set of a command line, as helm does
// (flag.Var(&set, "set", …)); Values reads them.
type SetFlags []string

func (s *SetFlags) String() string     { return strings.Join(*s, ",") }
func (s *SetFlags) Set(v string) error { *s = append(*s, v); return nil }

// Values reads --set assignments ("gpus=2", "podMonitor.enabled=true",
// "extraArgs={--max-model-len,8192}") into a values tree, as helm does.
func Values(set []string) (map[string]any, error) {
	vals := map[string]any{}
	for _, s := range set {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	return vals, nil
}

// Render loads the chart in dir and renders it for rel with vals over the
// chart's values.yaml. A value the schema refuses or a template's fail
// (a key the chart owns set in guardConfig, say) is an error.
func Render(ctx context.Context, dir string, rel Release, vals map[string]any) (*Rendered, error) {
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("load the chart %s: %w", dir, err)
	}
	return RenderChart(ctx, ch, rel, vals)
}

// RenderChart renders a loaded chart (see Render).
func RenderChart(ctx context.Context, ch *chart.Chart, rel Release, vals map[string]any) (*Rendered, error) {
	if rel.Namespace == "" {
		rel.Namespace = "default"
	}
	top, err := util.ToRenderValuesWithSchemaValidation(ch, vals,
		common.ReleaseOptions{Name: rel.Name, Namespace: rel.Namespace, Revision: 1, IsInstall: true}, common.DefaultCapabilities, false)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	// Strict: a template that reads a value values.yaml does not define
	// fails, so every value the chart uses is documented there.
	files, err := engine.Engine{Strict: true}.RenderWithContext(ctx, ch, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	out := &Rendered{}
	for _, src := range slices.Sorted(maps.Keys(files)) {
		switch base := path.Base(src); {
		case base == "NOTES.txt":
			out.Notes = files[src]
		case strings.HasPrefix(base, "_"):
			// helpers: they hold no objects
		default:
			for _, doc := range documents(files[src]) {
				out.Manifests = append(out.Manifests, Manifest{Source: src, Text: doc})
			}
		}
	}
	return out, nil
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// documents splits a template's output at its "---" lines, leaving out
// documents of only comments and blank lines (a template its values turned
// off, say).
func documents(text string) []string {
	var docs []string
	for _, doc := range separator.Split(text, -1) {
		for l := range strings.Lines(doc) {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				docs = append(docs, strings.TrimSpace(doc)+"\n")
				break
			}
		}
	}
	return docs
}

// YAML is the manifests as `helm template` prints them: one document each,
// headed by its source.
func (r *Rendered) YAML() string {
	var b strings.Builder
	for _, m := range r.Manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s", m.Source, m.Text)
	}
	return b.String()
}
