package main

import (
	"bytes"
	"strings"
	"testing"
)

// What install refuses before it reaches a cluster (test/k8s/run.sh
// installs into a real one).
func TestInstallRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--chart", "../../vllm-guard", "--set", "gpus"}, 2, "--set gpus"},
		{[]string{"gpus=2"}, 2, "give values with --set key=value"},
		{[]string{"--chart", "no-such-chart"}, 1, "no-such-chart"},
		{[]string{"--chart", "../../vllm-guard", "--kubeconfig", "no-such-kubeconfig"}, 1, "no-such-kubeconfig"},
	} {
		var out, errs bytes.Buffer
		code := run(tc.args, &out, &errs)
		if code != tc.code || !strings.Contains(errs.String(), tc.want) || out.Len() != 0 {
			t.Errorf("%q: exit %d, stderr %q, %d bytes out; want exit %d saying %q and nothing out", tc.args, code, errs.String(), out.Len(), tc.code, tc.want)
		}
	}
}
