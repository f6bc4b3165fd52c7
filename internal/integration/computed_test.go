package integration

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A true per-sequence cost the halving ladder handles badly: the safe
// maximum is 75 % of rung 0. The guard learns the cost while vLLM serves,
// and after exactly one OOM lands within 90–100 % of the true safe maximum,
// where halving alone would give 50 % of rung 0.
//
// The arithmetic (80 GiB device, 0.5 GiB reserved, the API process 0.25 GiB,
// utilization held at 0.85, headroom 2 %): room for sequences at the
// headroom = 0.98·80 − 0.85·80 − 0.75 = 9.65 GiB; at 51.47 MiB a sequence
// that is 192 sequences (75 % of 256). Rung 0 runs out of memory when the
// background demand passes 11.25 GiB / 51.47 MiB ≈ 223 sequences.
func TestComputedRungAfterOneOOM(t *testing.T) {
	t.Parallel()
	s := newScene(t)
	const seqCostMiB = 51.47
	s.env["FAKEVLLM_SEQ_COST_MIB"] = "51.47"
	s.env["FAKEVLLM_BACKGROUND_SEQS"] = "256"
	s.env["FAKEVLLM_BACKGROUND_RAMP"] = "4s"
	s.extra = `
[profile]
max_num_seqs = 256
gpu_memory_utilization = 0.85
min_gpu_memory_utilization = 0.85
headroom = 0.02
[restart]
initial_delay = "200ms"
[gpu]
sample_interval = "100ms"
`
	s.start()
	f := s.WaitEvent("the OOM", 1, 60*time.Second, isExited)
	if f.Failure.Verdict.Cause != "oom" {
		t.Fatalf("failure %+v, want oom", f.Failure)
	}
	if reason := f.Failure.Decision.Reason; !strings.Contains(reason, "computed from the cost model") {
		t.Fatalf("the next rung was not computed: %q", reason)
	}
	trueSafe := math.Floor((0.98*80 - 0.85*80 - 0.75) * 1024 / seqCostMiB)
	got := float64(f.Failure.Decision.Rung.MaxNumSeqs)
	if got < 0.9*trueSafe || got > trueSafe {
		t.Fatalf("computed max_num_seqs %v, want within 90–100%% of the true safe maximum %v (halving would give 128)", got, trueSafe)
	}
	s.WaitEvent("ready on the computed rung", 2, 60*time.Second, isReady)
	launch := s.WaitEvent("the second launch", 2, time.Second, isStarting)
	if argv := strings.Join(launch.Argv, " "); !strings.Contains(argv, "--max-num-seqs "+formatInt(got)) {
		t.Fatalf("second launch %q does not use the computed max_num_seqs %v", argv, got)
	}
	// The background demand (256) fills every slot of the computed rung:
	// once that full batch runs, the simulator's truth says it holds.
	m := s.waitFullBatch(int(got), 60*time.Second)
	if safe := m["fakevllm_true_safe_max_num_seqs"]; safe < got {
		t.Fatalf("the computed max_num_seqs %v does not hold a full batch: the simulator's safe maximum is %v", got, safe)
	}
	if n := s.CountEvents(isExited); n != 1 {
		t.Fatalf("%d failures, want exactly 1", n)
	}
}

func formatInt(f float64) string { return strconv.Itoa(int(f)) }
