package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The startup plan as vLLM 0.32.0 has it (v1/worker/startup_plan.py, the
// GPU worker only: the CPU worker never reads or writes one). With
// VLLM_ENABLE_STARTUP_PLAN=1 a boot that profiled saves the KV cache size
// it found to {VLLM_CACHE_ROOT}/startup_plan/startup_plan_<fingerprint>.json
// ("Saved startup plan to PATH"); a later boot with the same fingerprint
// and at least as much free memory as then applies it ("Applying
// persisted startup plan ... Memory profiling will be skipped.") and skips
// the memory profiling (the simulator: FAKEVLLM_KV_PROFILE). Less free
// memory than recorded: "Startup plan not applied: ..." and a full
// profile. The fingerprint (16 hex digits of a sha256) covers vLLM's
// version and config hash, the device's name, memory and capability,
// torch and CUDA, the rank and the world size; here: the version, the
// command line the engine got, the device and the rank.

// pyIntFlag reads a vLLM boolean environment variable the way envs.py
// does: bool(int(value)), "" is 0. A value int() refuses is an error
// here (vLLM dies of the ValueError).
func pyIntFlag(v, name string, errs *[]string) bool {
	v = strings.TrimSpace(v)
	if v == "" {
		return false
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		*errs = append(*errs, fmt.Sprintf("%s=%q is not an integer (vLLM reads it with int())", name, v))
		return false
	}
	return n != 0
}

// vllmCacheRoot is envs.VLLM_CACHE_ROOT: VLLM_CACHE_ROOT, else
// $XDG_CACHE_HOME/vllm, else ~/.cache/vllm.
func vllmCacheRoot(get func(string) string) string {
	if v := get("VLLM_CACHE_ROOT"); v != "" {
		return v
	}
	if x := get("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "vllm")
	}
	home := get("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".cache", "vllm")
}

// startupPlan is the file's content (PLAN_SCHEMA_VERSION 1).
type startupPlan struct {
	Schema             int    `json:"schema"`
	Fingerprint        string `json:"fingerprint"`
	KVCacheMemoryBytes int64  `json:"kv_cache_memory_bytes"`
	FreeMemoryBaseline int64  `json:"free_memory_baseline"`
}

func (e *engine) planFingerprint(rank int) string {
	factors := map[string]any{
		"schema": 1, "vllm": versionOf(e.env.Era), "vllm_config": strings.Join(e.args.argv(), " "),
		"device_name": e.gpu.dev.Name, "device_total_memory": e.gpu.dev.Total,
		"rank": rank, "world_size": e.args.TensorParallel,
	}
	b, _ := json.Marshal(factors) // map keys are sorted: sort_keys=True
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

func (e *engine) planPath(fp string) string {
	return filepath.Join(e.env.CacheRoot, "startup_plan", "startup_plan_"+fp+".json")
}

// freeAtInit is the device's free memory at worker init (init_snapshot).
func (e *engine) freeAtInit() int64 {
	return e.gpu.dev.Total - e.gpu.dev.Reserved - e.othersUsed()
}

// applyStartupPlan is maybe_apply_startup_plan: true when the plan sized
// the KV cache (profiling skipped).
func (e *engine) applyStartupPlan(free int64) bool {
	if !e.env.StartupPlan || e.env.Device == "cpu" || e.args.set["--kv-cache-memory-bytes"] {
		return false
	}
	fp := e.planFingerprint(0)
	path := e.planPath(fp)
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var p startupPlan
	if err := json.Unmarshal(data, &p); err != nil {
		e.log.warn("startup_plan.py:104", "Ignoring unreadable startup plan %s: %v", path, err)
		return false
	}
	if p.Schema != 1 || p.Fingerprint != fp || p.KVCacheMemoryBytes <= 0 {
		return false
	}
	if free < p.FreeMemoryBaseline {
		e.log.info("startup_plan.py:128", "Startup plan not applied: current free memory (%.2f GiB) is below the recorded baseline (%.2f GiB); falling back to full memory profiling.",
			float64(free)/float64(gib), float64(p.FreeMemoryBaseline)/float64(gib))
		return false
	}
	e.log.info("startup_plan.py:156", "Applying persisted startup plan (fingerprint %s): kv_cache_memory_bytes=%d (%.2f GiB), recorded free-memory baseline %.2f GiB, current %.2f GiB. Memory profiling will be skipped.",
		fp, p.KVCacheMemoryBytes, float64(p.KVCacheMemoryBytes)/float64(gib), float64(p.FreeMemoryBaseline)/float64(gib), float64(free)/float64(gib))
	e.mm.KVBytes = p.KVCacheMemoryBytes
	e.log.info("gpu_worker.py:669", "Initial free memory %s GiB, reserved %s GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does not respect the gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of KV cache memory size. If OOM'ed, check the difference of initial free memory between the current run and the previous run where kv_cache_memory_bytes is suggested and update it correspondingly.",
		gibStr(free), gibStr(p.KVCacheMemoryBytes))
	return true
}

// saveStartupPlan is maybe_save_startup_plan after a profiled boot, with
// the suggestion line vLLM prints before it.
func (e *engine) saveStartupPlan(free, kv int64) {
	if e.env.Device == "cpu" || e.args.set["--kv-cache-memory-bytes"] {
		return
	}
	e.log.info("gpu_worker.py:1034", "Free memory on device (%s/%s GiB) on startup. Desired GPU memory utilization is (%s, %s GiB). Actual usage is %s GiB for consumed memory (weights + non-torch), %s GiB for peak activation, and 0.00 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=%d` (%s GiB) to fit into requested memory, or `--kv-cache-memory=%d` (%s GiB) to fully utilize gpu memory. Current kv cache memory in use is %s GiB.",
		gibStr(free), gibStr(e.mm.Total), pyFloat(e.args.GPUMemUtil), gibStr(e.mm.requested()), gibStr(e.mm.Weights),
		gibStr(int64(e.args.MaxNumSeqs)*e.mm.SeqCost), kv, gibStr(kv), free-(e.mm.requested()-kv), gibStr(free-(e.mm.requested()-kv)), gibStr(kv))
	if !e.env.StartupPlan {
		return
	}
	fp := e.planFingerprint(0)
	path := e.planPath(fp)
	b, _ := json.Marshal(startupPlan{Schema: 1, Fingerprint: fp, KVCacheMemoryBytes: kv, FreeMemoryBaseline: free})
	tmp := fmt.Sprintf("%s.tmp.%d", path, os.Getpid())
	err := os.MkdirAll(filepath.Dir(path), 0o755)
	if err == nil {
		err = os.WriteFile(tmp, b, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		e.log.warn("startup_plan.py:195", "Failed to save startup plan to %s: %v", path, err)
		return
	}
	e.log.info("startup_plan.py:193", "Saved startup plan to %s", path)
}
