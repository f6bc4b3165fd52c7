// Command install installs the vllm-guard chart into a cluster as `helm
// install` does, through Helm's library (the release recorded in a Secret,
// the objects applied server-side), for a machine without the helm binary:
//
//	go run ./cmd/install --kubeconfig FILE --name vllm --set apiKeySecret.name=vllm-api-key
//
// (run in examples/helm). test/k8s/run.sh installs the chart this way into
// the cluster it starts. It does not wait for the pod: the caller does.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/vllm-guard/vllm-guard/examples/helm"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var set helm.SetFlags
	fs.Var(&set, "set", "a value, `key=value` as helm's --set (repeat it)")
	dir := fs.String("chart", helm.ChartDir, "the chart's folder")
	name := fs.String("name", "vllm", "the release name")
	namespace := fs.String("namespace", "default", "the release namespace")
	kubeconfig := fs.String("kubeconfig", "", "the cluster's kubeconfig (empty: KUBECONFIG, else ~/.kube/config)")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long the install may take")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "install: unexpected argument %q; give values with --set key=value\n", fs.Arg(0))
		return 2
	}
	vals, err := helm.Values(set)
	if err != nil {
		fmt.Fprintf(stderr, "install: %v\n", err)
		return 2
	}
	ch, err := loader.LoadDir(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "install: load the chart %s: %v\n", *dir, err)
		return 1
	}
	flags := genericclioptions.NewConfigFlags(false)
	flags.Namespace = namespace
	if *kubeconfig != "" {
		flags.KubeConfig = kubeconfig
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err := cfg.Init(flags, *namespace, "secret"); err != nil {
		fmt.Fprintf(stderr, "install: reach the cluster: %v\n", err)
		return 1
	}
	inst := action.NewInstall(cfg)
	inst.ReleaseName, inst.Namespace, inst.Timeout = *name, *namespace, *timeout
	inst.WaitStrategy = kube.HookOnlyStrategy // the caller waits for the pod itself
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if _, err := inst.RunWithContext(ctx, ch, vals); err != nil {
		fmt.Fprintf(stderr, "install: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "release %q installed in namespace %s\n", *name, *namespace)
	return 0
}
