// Command render prints the vllm-guard chart rendered with Helm's library,
// as `helm template` would, for a machine without the helm binary:
//
//	go run ./cmd/render --set gpus=2 --set podMonitor.enabled=true
//
// (run in examples/helm; `make helm-template ARGS='--set gpus=2'` from the
// repository's root). A value the chart refuses exits 1 with the reason.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/vllm-guard/vllm-guard/examples/helm"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var set helm.SetFlags
	fs.Var(&set, "set", "a value, `key=value` as helm's --set (repeat it)")
	dir := fs.String("chart", helm.ChartDir, "the chart's folder")
	name := fs.String("name", "vllm", "the release name")
	namespace := fs.String("namespace", "default", "the release namespace")
	notes := fs.Bool("notes", false, "print NOTES.txt after the manifests")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "render: unexpected argument %q; give values with --set key=value\n", fs.Arg(0))
		return 2
	}
	vals, err := helm.Values(set)
	if err != nil {
		fmt.Fprintf(stderr, "render: %v\n", err)
		return 2
	}
	r, err := helm.Render(context.Background(), *dir, helm.Release{Name: *name, Namespace: *namespace}, vals)
	if err != nil {
		fmt.Fprintf(stderr, "render: %v\n", err)
		return 1
	}
	io.WriteString(stdout, r.YAML())
	if *notes {
		fmt.Fprintf(stdout, "\n# NOTES.txt\n%s\n", r.Notes)
	}
	return 0
}
