package config

import (
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The policy decides with the defaults the operator reads in
// vllm-guard.toml (policy's own tests use the same values: defaultConfig
// in policy_test.go), and every setting it needs reaches it.
func TestPolicyIsTheDefaults(t *testing.T) {
	want := policy.Config{
		Profile: policy.Profile{MaxNumSeqs: 256, GPUMemoryUtilization: 0.85, MaxNumSeqsFactor: 0.5, MinMaxNumSeqs: 16,
			GPUMemoryUtilizationStep: 0.05, MinGPUMemoryUtilization: 0.70, Headroom: 0.15},
		Restart: policy.Restart{InitialDelay: 5 * time.Second, MaxDelay: 5 * time.Minute, Multiplier: 2, Jitter: 0.2,
			ResetAfter: 10 * time.Minute, GiveUpAfter: 10, GiveUpWindow: time.Hour},
		Thresholds: policy.Thresholds{WarnOverBudget: 0.03, CriticalOverBudget: 0.05},
	}
	if got := Default().Policy(); got != want {
		t.Fatalf("Default().Policy() = %+v, want %+v", got, want)
	}

	c := Default()
	c.Profile.RestoreAfter = Duration{Duration: 30 * time.Minute}
	c.GPU.WarnFraction, c.GPU.CriticalFraction = 0.9, 0.95
	c.Restart.GiveUpAfter = 3
	p := c.Policy()
	if p.Profile.RestoreAfter != 30*time.Minute || p.Thresholds.WarnFraction != 0.9 || p.Thresholds.CriticalFraction != 0.95 ||
		p.Restart.GiveUpAfter != 3 {
		t.Fatalf("settings lost on the way to the policy: %+v", p)
	}
	if w, cr := c.GPU.Thresholds(0.85); w != 0.9 || cr != 0.95 {
		t.Fatalf("fixed thresholds: %v %v, want 0.9 0.95", w, cr)
	}
}
