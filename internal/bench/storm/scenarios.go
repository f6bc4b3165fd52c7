package main

import (
	"fmt"
	"strconv"
	"time"
)

// Scale maps scenario time (what an operator would see on a real GPU) to
// the time the benchmark really runs: 0.05 runs 20 minutes in one.
type Scale float64

// D is the real duration of d in scenario time.
func (s Scale) D(d time.Duration) time.Duration { return time.Duration(float64(d) * float64(s)) }

// Back is the scenario duration of a real duration.
func (s Scale) Back(d time.Duration) time.Duration { return time.Duration(float64(d) / float64(s)) }

// Scenario is one failing vLLM, the same for every supervisor. Durations
// are in scenario time; rates per scenario second.
type Scenario struct {
	Name   string
	Title  string
	Load   time.Duration // nominal time from launch to ready
	Length time.Duration // how long each supervisor gets
	Env    map[string]string
	Timed  map[string]time.Duration // FAKEVLLM_* durations, scaled when launched
	Leak   float64                  // MiB per scenario second while serving
	Args   []string                 // extra `vllm serve` arguments
	Marker bool                     // faults fire once per run (FAKEVLLM_FAULT_MARKER)
	Fault  string                   // FAKEVLLM_FAULT; "KEY=DUR" parts are scaled
	FaultD time.Duration            // the DUR of Fault
}

// The profile every supervisor starts with: the guard's rung 0, and what
// the baselines run forever (they never change vLLM's flags).
const (
	baseMaxNumSeqs = 256
	// guardHeadroom is [profile] headroom as the guard runs here (the
	// default); deviceTotal the stand-in GPU's memory.
	guardHeadroom = 0.15
	deviceTotal   = 85899345920
	baseUtil      = 0.85
)

// scenarios is the benchmark's scenario list (issue 7).
func scenarios() []Scenario {
	const length = 20 * time.Minute
	return []Scenario{
		{Name: "oversubscription", Title: "over-subscription: background demand rung 0 cannot hold, rung 1 can",
			Load: time.Minute, Length: length,
			Env:   map[string]string{"FAKEVLLM_SEQ_COST_MIB": "64", "FAKEVLLM_BACKGROUND_SEQS": "200"},
			Timed: map[string]time.Duration{"FAKEVLLM_BACKGROUND_AFTER": 30 * time.Second, "FAKEVLLM_BACKGROUND_RAMP": time.Minute}},
		{Name: "slow-load", Title: "slow load: 10 min to ready, longer than the usual probe delays",
			Load: 10 * time.Minute, Length: length},
		{Name: "orphan", Title: "orphan: the API server is SIGKILLed 2 min after ready, EngineCore keeps its memory",
			Load: time.Minute, Length: length, Marker: true, Fault: "orphan_after", FaultD: 2 * time.Minute},
		{Name: "leak", Title: "leak: 40 MiB/s while serving, OOM after a while on any rung",
			Load: time.Minute, Length: length, Leak: 40},
		{Name: "bad-flag", Title: "bad flag: --max-model-lenn (a typo) in the command",
			Load: time.Minute, Length: length, Args: []string{"--max-model-lenn", "4096"}},
	}
}

// simEnv is the simulator's environment for one run, durations scaled.
func (sc Scenario) simEnv(s Scale, gpuDir, marker string) map[string]string {
	env := map[string]string{
		"FAKEVLLM_ERA":         "v1",
		"FAKENVML_STATE":       gpuDir,
		"FAKEVLLM_ORPHAN_TTL":  dur(s.D(time.Hour)), // longer than any scenario: orphans hold on
		"FAKEVLLM_WEIGHTS_GIB": "15",
	}
	// The load, split into vLLM's phases as a 7B model spends it.
	for k, f := range map[string]float64{"FAKEVLLM_LOAD_WEIGHTS": 0.5, "FAKEVLLM_COMPILE": 0.3,
		"FAKEVLLM_KV_PROFILE": 0.05, "FAKEVLLM_GRAPHS": 0.1, "FAKEVLLM_SERVER": 0.05} {
		env[k] = dur(s.D(time.Duration(f * float64(sc.Load))))
	}
	for k, v := range sc.Env {
		env[k] = v
	}
	for k, v := range sc.Timed {
		env[k] = dur(s.D(v))
	}
	if sc.Leak > 0 {
		env["FAKEVLLM_LEAK_MIB_PER_S"] = strconv.FormatFloat(sc.Leak/float64(s), 'f', -1, 64)
	}
	if sc.Fault != "" {
		env["FAKEVLLM_FAULT"] = sc.Fault
		if sc.FaultD > 0 {
			env["FAKEVLLM_FAULT"] = fmt.Sprintf("%s=%s", sc.Fault, dur(s.D(sc.FaultD)))
		}
	}
	if sc.Marker {
		env["FAKEVLLM_FAULT_MARKER"] = marker
	}
	return env
}

// dur writes a duration the simulator and the guard's TOML both parse.
func dur(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return d.Round(time.Millisecond).String()
}
