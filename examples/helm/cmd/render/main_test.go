package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRender(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run([]string{"--chart", "../../vllm-guard", "--name", "llm", "--set", "gpus=2", "--set", "podMonitor.enabled=true", "--notes"}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	for _, want := range []string{"# Source: vllm-guard/templates/deployment.yaml\n", "kind: PodMonitor", `nvidia.com/gpu: "2"`,
		`"--tensor-parallel-size", "2"`, "name: llm\n", "# NOTES.txt\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRenderRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--chart", "../../vllm-guard", "--set", "gpus=0"}, 1, "/gpus"},
		{[]string{"--chart", "../../vllm-guard", "--set", "extraArgs={--shutdown-timeout,9}"}, 1, "shutdownTimeoutSeconds"},
		{[]string{"--chart", "no-such-chart"}, 1, "no-such-chart"},
		{[]string{"--set", "gpus"}, 2, "--set gpus"},
		{[]string{"gpus=2"}, 2, "give values with --set key=value"},
	} {
		var out, errs bytes.Buffer
		code := run(tc.args, &out, &errs)
		if code != tc.code || !strings.Contains(errs.String(), tc.want) || out.Len() != 0 {
			t.Errorf("%q: exit %d, stderr %q, %d bytes out; want exit %d saying %q and nothing out", tc.args, code, errs.String(), out.Len(), tc.code, tc.want)
		}
	}
}
