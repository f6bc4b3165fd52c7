package config

import "github.com/vllm-guard/vllm-guard/internal/policy"

// Policy is the share of the settings the policy decides with: [profile],
// [restart] and [gpu]'s memory thresholds, as plain values (the policy
// never reads the configuration itself).
func (c *Config) Policy() policy.Config {
	p, r := c.Profile, c.Restart
	return policy.Config{
		Profile: policy.Profile{
			MaxNumSeqs:               p.MaxNumSeqs,
			GPUMemoryUtilization:     p.GPUMemoryUtilization,
			MaxNumSeqsFactor:         p.MaxNumSeqsFactor,
			MinMaxNumSeqs:            p.MinMaxNumSeqs,
			GPUMemoryUtilizationStep: p.GPUMemoryUtilizationStep,
			MinGPUMemoryUtilization:  p.MinGPUMemoryUtilization,
			RestoreAfter:             p.RestoreAfter.Duration,
			Headroom:                 p.Headroom,
		},
		Restart: policy.Restart{
			InitialDelay: r.InitialDelay.Duration,
			MaxDelay:     r.MaxDelay.Duration,
			Multiplier:   r.Multiplier,
			Jitter:       r.Jitter,
			ResetAfter:   r.ResetAfter.Duration,
			GiveUpAfter:  r.GiveUpAfter,
			GiveUpWindow: r.GiveUpWindow.Duration,
		},
		Thresholds: c.GPU.policyThresholds(),
	}
}

func (g GPU) policyThresholds() policy.Thresholds {
	return policy.Thresholds{WarnFraction: g.WarnFraction, CriticalFraction: g.CriticalFraction,
		WarnOverBudget: g.WarnOverBudget, CriticalOverBudget: g.CriticalOverBudget}
}
