package vllmlog

import (
	"fmt"
	"strings"
	"testing"
)

func TestLoadBar(t *testing.T) {
	for _, c := range []struct {
		line string
		want Bar
		ok   bool
	}{
		// vLLM 0.32.0's bytes (docs/standby-facts.md), as the splitter cuts them.
		{"Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]", Bar{PhaseWeights, "shards", 0, 1, 0}, true},
		{"Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 361.36it/s]", Bar{PhaseWeights, "shards", 1, 1, 100}, true},
		{"Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:41<00:20, 20.50s/it]", Bar{PhaseWeights, "shards", 2, 3, 67}, true},
		{"Loading safetensors checkpoint shards (eager):  50% Completed | 1/2 [00:01<00:01,  1.00it/s]", Bar{PhaseWeights, "shards", 1, 2, 50}, true},
		{"Loading pt checkpoint shards:  25% Completed | 1/4 [00:01<00:03,  1.00it/s]", Bar{PhaseWeights, "shards", 1, 4, 25}, true},
		// An older era's process prefix, and ANSI already stripped.
		{"(EngineCore_0 pid=42) Loading safetensors checkpoint shards:  33% Completed | 1/3 [00:05<00:10,  5.00s/it]", Bar{PhaseWeights, "shards", 1, 3, 33}, true},
		{"Loading safetensors using Runai Model Streamer:  10% Completed | 29/291 [00:02<00:18, 14.50it/s]", Bar{PhaseWeights, "tensors", 29, 291, 10}, true},
		// tqdm's default format (CUDA graphs).
		{"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67 [00:01<00:01, 30.77it/s]", Bar{PhaseGraphs, "graphs", 30, 67, 45}, true},
		{"Capturing CUDA graph shapes: 100%|██████████| 35/35 [00:02<00:00, 15.00it/s]", Bar{PhaseGraphs, "graphs", 35, 35, 100}, true},
		// Not a load's progress.
		{"Fetching 3 files: 100%|██████████| 3/3 [00:00<00:00, 1.00it/s]", Bar{}, false},
		{"Loading safetensors checkpoint shards: 67% done", Bar{}, false},
		{"Loading safetensors checkpoint shards:  67% Completed | 4/3 [00:00<?, ?it/s]", Bar{}, false},
		{"Loading safetensors checkpoint shards: 167% Completed | 1/3 [00:00<?, ?it/s]", Bar{}, false},
		{"Loading safetensors checkpoint shards:  67% Completed | 1/0 [00:00<?, ?it/s]", Bar{}, false},
		{"Loading safetensors checkpoint shards: x 67% Completed | 1/3 [00:00<?, ?it/s]", Bar{}, false},
		{"Loading safetensors using InstantTensor loader:  50% Completed | 1.2G/2.4G [00:01<00:01, 1.2GB/s]", Bar{}, false},
		{"Capturing CUDA graphs: 50%|█████     | 1/2k [00:00<?, ?it/s]", Bar{}, false},
		{"INFO 10-14 12:00:00 [default_loader.py:262] Loading weights took 0.15 seconds", Bar{}, false},
		{"Loading safetensors checkpoint shards:   0% Completed | 0/01 [00:00<?, ?it/s]", Bar{}, false},
		{"Loading safetensors checkpoint shards:  67% Completed | 99999999999/99999999999 [", Bar{}, false},
	} {
		got, ok := LoadBar(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("%q: %+v %v, want %+v %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

// The simulator's bars (fakevllm/progress.go shardsBar) and tqdm's own
// rounding, for every count up to 64 shards: each state reads back.
func TestLoadBarReadsEveryState(t *testing.T) {
	for total := 1; total <= 64; total++ {
		for n := 0; n <= total; n++ {
			pct := (n*200 + total) / (2 * total) // rounded
			line := fmt.Sprintf("Loading safetensors checkpoint shards: %3d%% Completed | %d/%d [00:01<00:02,  1.00it/s]", pct, n, total)
			if b, ok := LoadBar(line); !ok || b.Done != n || b.Total != total || b.Percent != pct {
				t.Fatalf("%q: %+v %v", line, b, ok)
			}
		}
	}
}

func FuzzLoadBar(f *testing.F) {
	f.Add("Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:41<00:20, 20.50s/it]")
	f.Add("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67 [00:01<00:01, 30.77it/s]")
	f.Add("(EngineCore_0 pid=42) Loading pt checkpoint shards: 100% Completed | 1/1 [")
	f.Add("checkpoint shards: 1%|| 0/1")
	f.Fuzz(func(t *testing.T, s string) {
		b, ok := LoadBar(s)
		if !ok {
			if b != (Bar{}) {
				t.Fatalf("LoadBar(%q) = %+v, not ok but not empty", s, b)
			}
			return
		}
		if b.Total <= 0 || b.Done < 0 || b.Done > b.Total || b.Percent < 0 || b.Percent > 100 || b.Total > maxBarCount {
			t.Fatalf("LoadBar(%q) = %+v: counts that do not add up", s, b)
		}
		if b.Phase != PhaseWeights && b.Phase != PhaseGraphs || b.Unit == "" {
			t.Fatalf("LoadBar(%q) = %+v: no phase or unit", s, b)
		}
		if !strings.Contains(s, fmt.Sprintf("%d/%d", b.Done, b.Total)) {
			t.Fatalf("LoadBar(%q) = %+v: counts that are not in the line", s, b)
		}
	})
}
