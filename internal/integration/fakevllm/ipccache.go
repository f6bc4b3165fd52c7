package main

import (
	"bufio"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// --load-format ipc_cache as vLLM 0.32.0's IpcModelLoader does it
// (model_executor/model_loader/weight_cache/ipc_loader.py; facts in
// docs/standby-facts.md):
//
//   - at worker init (before the free-memory check) it asks the daemon
//     how much memory it holds ("get_memory"); the weights it holds count
//     in the utilization budget and the check asks for the rest only;
//   - at load it asks for the state ("get_state" with its fingerprint)
//     and maps the daemon's tensors instead of reading the disk;
//   - fallback (default true): a daemon that is missing, refuses or does
//     not match is a WARNING and a disk load; fallback false waits up to
//     state_timeout_s (300) for the daemon, then fails the start;
//   - the CPU build refuses at load, fallback or not
//     (UnsupportedPlatformForIPCError).
//
// Nothing in vLLM watches the daemon once the weights are mapped. What a
// mapped engine does when the daemon dies is CUDA's (not in vLLM's
// source, not measured yet: scripts/gpu-check.sh measures it); the
// simulator keeps serving and counts the weights as the engine's own from
// then on (the memory stays in use while a process maps it).

// ipcState is the engine's weight cache use.
type ipcState struct {
	on        bool // --load-format ipc_cache
	mode      string
	fallback  bool
	sockPath  string // explicit socket_path
	sockDir   string // explicit socket_dir
	stateWait time.Duration
	mapped    bool // the weights are the daemon's (zero copy)
	daemonPid int
}

const ipcTensors = 291 // the tensors a mapped model reports (a Llama's count)

// ipcExtraConfig reads --model-loader-extra-config for ipc_cache, as the
// loader's constructor does.
func ipcExtraConfig(raw string) (ipcState, error) {
	st := ipcState{on: true, mode: "zero_copy", fallback: true, stateWait: 300 * time.Second}
	if strings.TrimSpace(raw) == "" {
		return st, nil
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return st, fmt.Errorf("json.decoder.JSONDecodeError: %v", err)
	}
	take := func(k string) (any, bool) { v, ok := cfg[k]; delete(cfg, k); return v, ok }
	if v, ok := take("socket_path"); ok {
		st.sockPath = fmt.Sprint(v)
	}
	if v, ok := take("socket_dir"); ok {
		st.sockDir = fmt.Sprint(v)
	}
	if v, ok := take("mode"); ok {
		st.mode = fmt.Sprint(v)
	}
	if v, ok := take("fallback"); ok {
		b, isBool := v.(bool)
		st.fallback = !isBool || b
	}
	take("connect_timeout_s")
	if v, ok := take("state_timeout_s"); ok {
		if f, isNum := v.(float64); isNum {
			st.stateWait = time.Duration(f * float64(time.Second))
		}
	}
	if st.mode != "zero_copy" && st.mode != "copy" {
		return st, fmt.Errorf("ValueError: Invalid weight cache mode %s, expected 'zero_copy' or 'copy'", pyStr(st.mode))
	}
	if len(cfg) > 0 {
		keys := make([]string, 0, len(cfg))
		for k := range cfg {
			keys = append(keys, pyStr(k))
		}
		sort.Strings(keys)
		return st, fmt.Errorf("ValueError: Unexpected extra config keys for load format ipc_cache: [%s]", strings.Join(keys, ", "))
	}
	return st, nil
}

// weightCacheSocketDir is the daemon's socket folder: the given one, else
// the per-user folder under the temp dir (protocol.get_socket_dir).
func weightCacheSocketDir(env *simEnv, dir string) string {
	if dir != "" {
		return dir
	}
	return filepath.Join(env.TempDir, fmt.Sprintf("vllm_weight_cache_%d", os.Getuid()))
}

// weightCacheSocket is a GPU's daemon socket: the md5 of the GPU's UUID
// keeps the name short (protocol.get_socket_path).
func weightCacheSocket(env *simEnv, dir, gpuUUID string) string {
	sum := md5.Sum([]byte(gpuUUID))
	return filepath.Join(weightCacheSocketDir(env, dir), "vllm_weight_cache_"+hex.EncodeToString(sum[:])+".sock")
}

// ipcKey is the simulator's WeightCacheKey: what must match between the
// daemon and the engine.
func ipcKey(model string, tp, rank int) string {
	return fmt.Sprintf("checkpoint=%s tp_size=%d tp_rank=%d", model, tp, rank)
}

// ipcUnavailable is vLLM's WeightCacheUnavailableError (or, for a key
// mismatch, CacheConfigMismatchError): its message.
type ipcUnavailable struct{ msg string }

func (e *ipcUnavailable) Error() string { return e.msg }

// ipcAsk sends one request to the daemon socket and reads its answer,
// failing as the loader's _connect does.
func (e *engine) ipcAsk(path, req string) (msg, error) {
	dir := filepath.Dir(path)
	for _, p := range []string{dir, path} {
		if _, err := os.Lstat(p); err != nil {
			return msg{}, &ipcUnavailable{fmt.Sprintf("Weight cache socket %s is unavailable: [Errno 2] No such file or directory: %s", path, pyStr(p))}
		}
	}
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		errno := "[Errno 111] Connection refused"
		if errors.Is(err, syscall.ENOENT) {
			errno = "[Errno 2] No such file or directory"
		}
		return msg{}, &ipcUnavailable{fmt.Sprintf("Cannot connect to weight cache daemon at %s: %s", path, errno)}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		return msg{}, &ipcUnavailable{fmt.Sprintf("Cannot connect to weight cache daemon at %s: %v", path, err)}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return msg{}, &ipcUnavailable{fmt.Sprintf("Cannot connect to weight cache daemon at %s: %v", path, err)}
	}
	m, err := parseMsg(line)
	if err != nil {
		return msg{}, &ipcUnavailable{"Weight cache daemon error: " + err.Error()}
	}
	return m, nil
}

// ipcSocketOf is rank i's daemon socket.
func (e *engine) ipcSocketOf(r rank) string {
	if e.ipc.sockPath != "" {
		return e.ipc.sockPath
	}
	return weightCacheSocket(e.env, e.ipc.sockDir, r.gpu.dev.UUID)
}

// ipcWait retries op until it answers or state_timeout_s passes (fallback
// false: the daemon may still be loading).
func (e *engine) ipcWait(op func() (msg, error)) (msg, error) {
	deadline := time.Now().Add(e.ipc.stateWait)
	logged := false
	for {
		m, err := op()
		if err == nil {
			return m, nil
		}
		if time.Now().After(deadline) {
			return msg{}, &ipcUnavailable{fmt.Sprintf("Weight cache daemon did not become ready within %.1fs: %v", e.ipc.stateWait.Seconds(), err)}
		}
		if !logged {
			logged = true
			e.log.info("ipc_loader.py:348", "Waiting up to %.1fs for the weight cache daemon to start", e.ipc.stateWait.Seconds())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ipcExternalMemory is get_external_weight_memory: the daemon's memory
// (zero copy), 0 when it cannot be asked and fallback is on.
func (e *engine) ipcExternalMemory() int64 {
	if e.ipc.mode != "zero_copy" {
		return 0
	}
	ask := func() (msg, error) { return e.ipcAsk(e.ipcSocketOf(e.ranks[0]), "get_memory\n") }
	var m msg
	var err error
	if e.ipc.fallback {
		m, err = ask()
		if err != nil {
			e.log.warn("ipc_loader.py:173", "Cannot query weight cache daemon memory (%s); assuming the weights are not externally held", err)
			return 0
		}
	} else if m, err = e.ipcWait(ask); err != nil {
		e.startupFailure(engineStartupTrace(e.env.Era, framesInitDevice, "vllm.model_executor.model_loader.weight_cache.protocol.WeightCacheUnavailableError: "+err.Error()))
	}
	n, _ := m.int("memory_bytes")
	return n
}

// ipcInit reads the loader's config and, on a GPU, the daemon's memory
// before the free-memory check.
func (e *engine) ipcInit() {
	st, err := ipcExtraConfig(e.args.LoaderExtraConfig)
	if err != nil {
		e.startupFailure(engineStartupTrace(e.env.Era, framesLoadModel[:3], err.Error()))
	}
	e.ipc = st
	if e.env.Device == "cpu" {
		return // the CPU worker never asks; it refuses at load
	}
	if ext := e.ipcExternalMemory(); ext > 0 {
		e.mm.External = min(ext, e.mm.Weights)
		requested := e.mm.requested()
		e.log.info("utils.py:751", "Weights are held outside this process: of the %s GiB utilization budget, %s GiB is externally held and %s GiB remains for the engine's own allocations.",
			gibStr(requested), gibStr(ext), gibStr(requested-ext))
	}
}

// ipcLoad maps the weights from the daemon; false means load from disk.
func (e *engine) ipcLoad() bool {
	if e.env.Device == "cpu" {
		e.startupFailure(engineStartupTrace(e.env.Era, framesLoadModel[:3], "vllm.model_executor.model_loader.weight_cache.protocol.UnsupportedPlatformForIPCError: "+ipcCPURefusal))
	}
	var pid int64
	for i, r := range e.ranks {
		ask := func() (msg, error) {
			m, err := e.ipcAsk(e.ipcSocketOf(r), "get_state "+ipcKey(e.args.Model, e.args.TensorParallel, i)+"\n")
			if err != nil {
				return m, err
			}
			switch m.Kind {
			case "mismatch":
				return m, &ipcUnavailable{"WeightCacheKey mismatch on fields: " + pyList(strings.Split(m.Fields["fields"], ","))}
			case "ok":
				return m, nil
			}
			return m, &ipcUnavailable{"Weight cache daemon error: " + strings.ReplaceAll(m.Fields["message"], "_", " ")}
		}
		var m msg
		var err error
		if e.ipc.fallback {
			m, err = ask()
		} else {
			m, err = e.ipcWait(ask)
		}
		if err != nil {
			if !e.ipc.fallback {
				e.startupFailure(engineStartupTrace(e.env.Era, framesLoadModel[:3], "vllm.model_executor.model_loader.weight_cache.protocol.WeightCacheUnavailableError: "+err.Error()))
			}
			e.log.warn("ipc_loader.py:251", "Weight cache unusable (%s); falling back to disk loading", err)
			e.mm.External = 0
			return false
		}
		if i == 0 {
			pid, _ = m.int("pid")
		}
	}
	start := time.Now()
	time.Sleep(e.env.IPCMap) // mapping the handles is what is simulated
	e.ipc.daemonPid = int(pid)
	if e.ipc.mode == "zero_copy" {
		e.ipc.mapped = true
		e.mm.External = e.mm.Weights
	} else {
		// Copy mode: the weights are cloned into this process, then the
		// daemon is asked to release its cache.
		e.allocStartup(e.mm.Weights)
		for _, r := range e.ranks {
			_, _ = e.ipcAsk(e.ipcSocketOf(r), "release\n")
		}
		e.mm.External = 0
	}
	e.log.info("ipc_loader.py:314", "Mapped %d tensors from the weight cache daemon (%s mode)", ipcTensors, e.ipc.mode)
	own := e.mm.Weights - e.mm.External
	e.log.info("gpu_model_runner.py:2007", "Model loading took %.4f GiB and %.6f seconds", float64(own)/float64(gib), time.Since(start).Seconds())
	return true
}

// watchDaemon: once the daemon that holds the mapped weights is gone,
// the engine's mappings are all that keep that memory in use; the
// simulator charges it to the engine from then on (see the top).
func (e *engine) watchDaemon() {
	if !e.ipc.mapped || e.ipc.daemonPid <= 0 || pidAlive(e.ipc.daemonPid) {
		return
	}
	e.ipc.mapped = false
	e.mm.External = 0
}

// ipcCPURefusal is check_ipc_platform_support's message on the CPU build.
const ipcCPURefusal = "platform 'cpu' does not support CUDA IPC weight sharing; only CUDA and ROCm are supported. Use the default --load-format for this platform."

func pyList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = pyStr(v)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// checkFreeMemoryExternal is request_memory with externally held weights:
// only the engine's own share of the budget must be free.
func (e *engine) checkFreeMemoryExternal(free, requested int64) {
	own := requested - e.mm.External
	if free >= own {
		return
	}
	exc := fmt.Sprintf("ValueError: Free memory on device cuda:0 (%s/%s GiB) on startup is less than the engine's budget after excluding external process's weights (%s, %s GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
		gibStr(free), gibStr(e.mm.Total), pyFloat(e.args.GPUMemUtil), gibStr(own))
	e.startupFailure(engineStartupTrace(e.env.Era, framesInitDevice, exc))
}
