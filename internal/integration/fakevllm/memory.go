package main

import "time"

// memModel is the engine's GPU memory arithmetic, pure so that tests can
// check it without processes.
type memModel struct {
	Total      int64 // device total
	Reserved   int64 // device reserved (driver, ECC)
	Util       float64
	KVBytes    int64 // --kv-cache-memory-bytes; 0 = use Util
	Weights    int64
	SeqCost    int64
	TokenCost  int64
	LeakPerSec int64
	MaxNumSeqs int
	BytesPerKV int64
	// External is the weights another process holds (a weight cache
	// daemon, --load-format ipc_cache in zero-copy mode): part of the
	// budget, not of this process's own memory.
	External int64
}

// budget is what the engine holds once the KV cache is allocated.
func (m memModel) budget() int64 {
	if m.KVBytes > 0 {
		return m.Weights + m.KVBytes
	}
	return int64(m.Util * float64(m.Total))
}

// requested is utilization × total, what the free-memory check wants.
func (m memModel) requested() int64 { return int64(m.Util * float64(m.Total)) }

// kvAvailable is the KV cache memory after profiling: the budget minus
// the weights and the profiled activation peak of max_num_seqs sequences.
// With --kv-cache-memory-bytes vLLM skips that sizing and takes the bytes.
func (m memModel) kvAvailable() int64 {
	if m.KVBytes > 0 {
		return m.KVBytes
	}
	return m.budget() - m.Weights - int64(m.MaxNumSeqs)*m.SeqCost
}

func (m memModel) kvTokens() int64 {
	if a := m.kvAvailable(); a > 0 {
		return a / m.BytesPerKV
	}
	return 0
}

// serving is the engine's memory while serving.
func (m memModel) serving(running, promptTokens int, sinceReady time.Duration) int64 {
	leak := int64(float64(m.LeakPerSec) * sinceReady.Seconds())
	return m.budget() - m.External + int64(running)*m.SeqCost + int64(promptTokens)*m.TokenCost + leak
}

// safeMaxNumSeqs is the largest max_num_seqs whose peak (every slot
// running) fits under the device total at the current utilization, given
// what else is on the device and the engine's non-sequence memory now.
func (m memModel) safeMaxNumSeqs(others int64, promptTokens int, sinceReady time.Duration) int64 {
	if m.SeqCost <= 0 {
		return int64(m.MaxNumSeqs)
	}
	room := m.Total - m.Reserved - others - m.serving(0, promptTokens, sinceReady)
	if room <= 0 {
		return 0
	}
	return room / m.SeqCost
}

// backgroundSeqs is the simulated background demand at since-ready d:
// none before `after`, then a linear ramp to n over `ramp` (a step if 0).
func backgroundSeqs(n int, after, ramp, d time.Duration) int {
	if n <= 0 || d < after {
		return 0
	}
	t := d - after
	if ramp <= 0 || t >= ramp {
		return n
	}
	return int(float64(n) * float64(t) / float64(ramp))
}
