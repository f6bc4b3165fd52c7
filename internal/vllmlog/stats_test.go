package vllmlog

import (
	"testing"
	"time"
)

func TestParseStats(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Stats
		ok   bool
	}{
		// V1, vllm/v1/metrics/loggers.py.
		{"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%",
			Stats{Running: 1}, true},
		{"Engine 000: Avg prompt throughput: 6335.3 tokens/s, Avg generation throughput: 4.8 tokens/s, Running: 9 reqs, Waiting: 12 reqs, GPU KV cache usage: 62.8%",
			Stats{Prompt: 6335.3, Generation: 4.8, Running: 9, Waiting: 12}, true},
		// V0, vllm/engine/metrics.py.
		{"Avg prompt throughput: 2.4 tokens/s, Avg generation throughput: 0.2 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 3 reqs, GPU KV cache usage: 0.0%, CPU KV cache usage: 0.0%.",
			Stats{Prompt: 2.4, Generation: 0.2, Running: 1, Waiting: 3}, true},
		// The speculative-decoding line is no stats line.
		{"SpecDecoding metrics: Mean acceptance length: 3.29, Accepted throughput: 11.90 tokens/s, Drafted throughput: 15.60 tokens/s", Stats{}, false},
		{"Avg prompt throughput: x tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs", Stats{}, false},
		{"Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: reqs", Stats{}, false},
	} {
		got, ok := ParseStats(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseStats(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestStamp(t *testing.T) {
	want := time.Date(0, 5, 12, 8, 1, 39, 0, time.UTC)
	for _, in := range []string{
		"INFO 05-12 08:01:39 [loggers.py:271] Engine 000: x",
		"INFO 05-12 08:01:39 metrics.py:486] x",
		"(APIServer pid=1) INFO 05-12 08:01:39 [loggers.py:271] x",
		"\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO 05-12 08:01:39 [loggers.py:271] x",
		"2026-05-12T08:01:39.331095044Z (APIServer pid=1) INFO 05-12 08:01:39 [loggers.py:271] x",
		"Dec 02 09:31:24 gpu-node-3 vllm[1234]: WARNING 05-12 08:01:39 [x.py:1] x",
		"INFO 05-12 08:01:39 (VllmWorkerProcess pid=5101) x",
	} {
		got, ok := Stamp(in)
		if !ok || !got.Equal(want) {
			t.Errorf("Stamp(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"INFO:     Application startup complete.", "INFO 13-12 08:01:39 x", "plain text", "INFO 05-12"} {
		if got, ok := Stamp(in); ok {
			t.Errorf("Stamp(%q) = %v, want none", in, got)
		}
	}
}

// FuzzStats: the stats parser and the stamp reader never panic, and what
// they return is sane.
func FuzzStats(f *testing.F) {
	f.Add("(APIServer pid=1) INFO 05-12 08:01:39 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs")
	f.Add("Avg prompt throughput: 1e400 tokens/s, Avg generation throughput: . tokens/s, Running: 99999999999 reqs, Pending: -1 reqs")
	f.Fuzz(func(t *testing.T, line string) {
		if s, ok := ParseStats(Message(line)); ok {
			if s.Prompt < 0 || s.Generation < 0 || s.Running < 0 || s.Waiting < 0 {
				t.Fatalf("negative stats %+v from %q", s, line)
			}
		}
		if ts, ok := Stamp(line); ok && ts.Year() != 0 {
			t.Fatalf("stamp %v has a year", ts)
		}
	})
}
