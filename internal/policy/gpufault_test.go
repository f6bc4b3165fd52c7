package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

const gpu0 = "GPU-aaaa1111-2222-3333-4444-555555555555"

// TestOnGPUFault: reset → give up with the GPU-fault code; survivable →
// same rung, and a second within the window → give up.
func TestOnGPUFault(t *testing.T) {
	cfg := testConfig()
	p := New(cfg, State{}, nil)
	now := time.Unix(1_000_000, 0)
	reset := cause.Verdict{Cause: cause.CauseGPUFault, GPU: &cause.GPUFault{Device: 0, UUID: gpu0, XID: 79, Meaning: cause.XIDMeaning(79), Reset: true}}
	d := p.OnFailure(now, reset)
	if d.Action != ActionGiveUp || d.ExitCode != exitcode.GPUFault || !strings.Contains(d.Reason, "GPU 0") || !strings.Contains(d.Reason, "XID 79") ||
		!strings.Contains(d.Reason, "nvidia-smi -r -i 0") {
		t.Fatalf("XID 79: %+v", d)
	}

	p = New(cfg, State{}, nil)
	soft := cause.Verdict{Cause: cause.CauseGPUFault, GPU: &cause.GPUFault{Device: 0, UUID: gpu0, XID: 94, Meaning: cause.XIDMeaning(94)}}
	d = p.OnFailure(now, soft)
	if d.Action != ActionRestart || d.Rung.Index != 0 || !strings.Contains(d.Reason, "XID 94") || !strings.Contains(d.Reason, "same rung") {
		t.Fatalf("first XID 94: %+v", d)
	}
	d = p.OnFailure(now.Add(time.Minute), soft)
	if d.Action != ActionGiveUp || d.ExitCode != exitcode.GPUFault || !strings.Contains(d.Reason, "second GPU fault") {
		t.Fatalf("second XID 94 within the window: %+v", d)
	}
	// Outside the window, a survivable fault is a first one again.
	p = New(cfg, State{}, nil)
	p.OnFailure(now, soft)
	d = p.OnFailure(now.Add(cfg.Restart.GiveUpWindow+time.Minute), soft)
	if d.Action != ActionRestart {
		t.Fatalf("XID 94 after the window: %+v", d)
	}
}
