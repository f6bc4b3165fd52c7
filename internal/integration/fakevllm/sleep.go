package main

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Sleep mode as vLLM 0.32.0 has it (docs/standby-facts.md has the sources):
//
//   - The routes POST /sleep?level=0|1|2&mode=abort|wait|keep, POST
//     /wake_up[?tags=weights&tags=kv_cache], GET /is_sleeping exist only
//     with VLLM_SERVER_DEV_MODE=1 (404 otherwise), with or without
//     --enable-sleep-mode. Without the flag the engine has no cumem pool:
//     a sleep frees nothing (the simulator: the memory stays), yet the
//     answers are the same.
//   - Level 1 offloads the weights to host memory and discards the KV
//     cache; level 2 discards both (a wake then maps empty memory: the
//     weights must be reloaded before the answers mean anything). Either
//     way the GPU keeps only what the pool does not own (the CUDA context,
//     NCCL buffers): FAKEVLLM_SLEEP_RESIDUAL_MIB here.
//   - While asleep the scheduler is paused: new requests wait, nothing is
//     generated, /health stays 200. (vLLM's default mode=abort aborts the
//     requests running when it falls asleep; the simulator holds them with
//     the new ones until the wake, as mode=keep does. A standby has no
//     traffic.)
//   - A wake from level 1 copies the weights back: FAKEVLLM_WAKE, by
//     default the weights at 20 GiB/s (pinned host memory over PCIe 4).
//   - /metrics: vllm:engine_sleep_state{sleep_state="awake"|
//     "weights_offloaded"|"discard_all"} always (with the stats); after
//     the first operation the histogram vllm:sleep_mode_operation_duration_seconds
//     and the gauge vllm:sleep_mode_operations_in_flight, labelled
//     operation="sleep"|"wake".
//
// API ↔ engine: "sleep level=N" → "slept level=N freed=B used=B";
// "wake" → "woke" (or the engine dies of an OOM when its memory no longer
// fits).

// sleepState is the API process's view of the engine's sleep.
type sleepState struct {
	mu     sync.Mutex
	level  int           // 0: awake; 1 or 2: asleep at that level
	asleep bool          // the scheduler is paused (any level)
	wakeCh chan struct{} // closed at the wake; nil while awake
	reply  chan msg      // the engine's "slept"/"woke"
	opMu   sync.Mutex    // one operation at a time, as vLLM's utility calls run
	ops    map[string]*sleepOpStats
}

type sleepOpStats struct {
	inFlight int
	count    int
	sum      float64
	buckets  []int // cumulative counts per sleepBuckets bound
}

// sleepBuckets are vLLM 0.32.0's (entrypoints/serve/dev/sleep/metrics.py).
var sleepBuckets = []float64{0.01, 0.1, 1, 10, 30, 60, 120, 300, 600}

func newSleepState() *sleepState {
	return &sleepState{reply: make(chan msg, 4), ops: map[string]*sleepOpStats{}}
}

// registerSleepRoutes adds the dev-mode routes, as vLLM registers them
// only with VLLM_SERVER_DEV_MODE=1.
func (a *apiServer) registerSleepRoutes(mux *http.ServeMux) {
	if !a.env.DevMode {
		return
	}
	mux.HandleFunc("/sleep", a.handleSleep)
	mux.HandleFunc("/wake_up", a.handleWake)
	mux.HandleFunc("/is_sleeping", a.handleIsSleeping)
}

// sleepRoutes are the dev routes for the route list vLLM prints.
func (a *apiServer) sleepRoutes() []route {
	if !a.env.DevMode {
		return nil
	}
	return []route{{"/sleep", "POST"}, {"/wake_up", "POST"}, {"/is_sleeping", "GET"}}
}

// queryInt422 is FastAPI's refusal of a query parameter out of bounds.
func queryInt422(w http.ResponseWriter, name, value, typ, msg string, ctx map[string]any) {
	detail := map[string]any{"type": typ, "loc": []string{"query", name}, "msg": msg, "input": value}
	if ctx != nil {
		detail["ctx"] = ctx
	}
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []any{detail}})
}

func (a *apiServer) handleSleep(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	level := 1
	if v := r.URL.Query().Get("level"); r.URL.Query().Has("level") {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil:
			queryInt422(w, "level", v, "int_parsing", "Input should be a valid integer, unable to parse string as an integer", nil)
			return
		case n < 0:
			queryInt422(w, "level", v, "greater_than_equal", "Input should be greater than or equal to 0", map[string]any{"ge": 0})
			return
		case n > 2:
			queryInt422(w, "level", v, "less_than_equal", "Input should be less than or equal to 2", map[string]any{"le": 2})
			return
		}
		level = n
	}
	mode := "abort"
	if r.URL.Query().Has("mode") {
		mode = r.URL.Query().Get("mode")
		if mode != "abort" && mode != "wait" && mode != "keep" {
			queryInt422(w, "mode", mode, "literal_error", "Input should be 'abort', 'wait' or 'keep'", map[string]any{"expected": "'abort', 'wait' or 'keep'"})
			return
		}
	}
	s := a.sleep
	s.opMu.Lock()
	defer s.opMu.Unlock()
	start := s.begin("sleep")
	defer s.end("sleep", start)
	s.mu.Lock()
	if !s.asleep {
		s.asleep = true
		s.wakeCh = make(chan struct{})
	}
	already := s.level > 0
	s.mu.Unlock()
	if level >= 1 {
		m, ok := a.engineCall(formatMsg("sleep", "level", level, "pool", a.args.EnableSleepMode, "again", already))
		if !ok {
			a.writeEngineDead(w)
			return
		}
		if m.Kind == "slept" && !already {
			s.mu.Lock()
			s.level = level
			s.mu.Unlock()
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "sleeping", "level": level})
}

func (a *apiServer) handleWake(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	tags := r.URL.Query()["tags"]
	tagsRepr := "None"
	if len(tags) > 0 {
		q := make([]string, len(tags))
		for i, t := range tags {
			q[i] = pyStr(t)
		}
		tagsRepr = "[" + strings.Join(q, ", ") + "]"
	}
	a.log.info("api_router.py:49", "wake up the engine with tags: %s", tagsRepr)
	s := a.sleep
	s.opMu.Lock()
	defer s.opMu.Unlock()
	start := s.begin("wake")
	defer s.end("wake", start)
	s.mu.Lock()
	level := s.level
	s.mu.Unlock()
	// A partial wake (some tags only) keeps the engine asleep; the
	// simulator wakes everything whatever the tags, except that a wake
	// naming only "scheduling" resumes a level-0 pause.
	if _, ok := a.engineCall(formatMsg("wake", "level", level, "pool", a.args.EnableSleepMode)); !ok {
		// The engine died waking (its memory no longer fits): the
		// request fails as vLLM's utility call does once the engine is dead.
		a.writeEngineDead(w)
		return
	}
	s.mu.Lock()
	s.level = 0
	if s.asleep {
		s.asleep = false
		close(s.wakeCh)
		s.wakeCh = nil
	}
	s.mu.Unlock()
	var tagsJSON any
	if len(tags) > 0 {
		tagsJSON = tags
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "awake", "tags": tagsJSON})
}

func (a *apiServer) handleIsSleeping(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	a.sleep.mu.Lock()
	asleep := a.sleep.asleep
	a.sleep.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"is_sleeping": asleep})
}

// engineCall sends one sleep-mode line to the engine and waits for its
// answer; false when the engine died first.
func (a *apiServer) engineCall(line string) (msg, bool) {
	a.sendEngine(line)
	select {
	case m := <-a.sleep.reply:
		return m, true
	case <-a.engineGone:
		return msg{}, false
	}
}

// holdWhileAsleep blocks a request's next step while the engine sleeps
// (the paused scheduler). It returns false when the request must stop.
func (a *apiServer) holdWhileAsleep(r *http.Request) bool {
	if a.sleep == nil {
		return true
	}
	a.sleep.mu.Lock()
	ch := a.sleep.wakeCh
	a.sleep.mu.Unlock()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	case <-r.Context().Done():
	case <-a.deadCh:
	case <-a.abortCh:
	case <-a.drainCutCh:
	}
	return false
}

func (s *sleepState) begin(op string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ops[op]
	if st == nil {
		// vLLM creates the metrics at the first operation; both
		// operations' series appear then (the labels seen so far).
		st = &sleepOpStats{buckets: make([]int, len(sleepBuckets))}
		s.ops[op] = st
	}
	st.inFlight++
	return time.Now()
}

func (s *sleepState) end(op string, start time.Time) {
	d := time.Since(start).Seconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ops[op]
	st.inFlight--
	st.count++
	st.sum += d
	for i, b := range sleepBuckets {
		if d <= b {
			st.buckets[i]++
		}
	}
}

// sleepMetrics renders vLLM's sleep series for /metrics.
func (a *apiServer) sleepMetrics(b *strings.Builder, labels string) {
	if a.env.Era != eraV1Plain || a.args.DisableLogStats {
		return
	}
	s := a.sleep
	s.mu.Lock()
	defer s.mu.Unlock()
	inner := strings.TrimSuffix(labels, "}")
	state := map[string]int{"awake": 1, "weights_offloaded": 0, "discard_all": 0}
	if s.asleep {
		state["awake"] = 0
		switch s.level {
		case 1:
			state["weights_offloaded"] = 1
		case 2:
			state["discard_all"] = 1
		}
	}
	const name = "vllm:engine_sleep_state"
	fmt.Fprintf(b, "# HELP %s Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n# TYPE %s gauge\n", name, name)
	for _, k := range []string{"awake", "weights_offloaded", "discard_all"} {
		fmt.Fprintf(b, "%s%s,sleep_state=%q} %s\n", name, inner, k, pyFloat(float64(state[k])))
	}
	if len(s.ops) == 0 {
		return
	}
	ops := make([]string, 0, len(s.ops))
	for k := range s.ops {
		ops = append(ops, k)
	}
	sort.Strings(ops)
	const hist = "vllm:sleep_mode_operation_duration_seconds"
	fmt.Fprintf(b, "# HELP %s Duration of one sleep-mode operation.\n# TYPE %s histogram\n", hist, hist)
	for _, op := range ops {
		st := s.ops[op]
		for i, bound := range sleepBuckets {
			fmt.Fprintf(b, "%s_bucket{le=%q,operation=%q} %s\n", hist, pyFloat(bound), op, pyFloat(float64(st.buckets[i])))
		}
		fmt.Fprintf(b, "%s_bucket{le=\"+Inf\",operation=%q} %s\n", hist, op, pyFloat(float64(st.count)))
		fmt.Fprintf(b, "%s_count{operation=%q} %s\n%s_sum{operation=%q} %s\n", hist, op, pyFloat(float64(st.count)), hist, op, strconv.FormatFloat(st.sum, 'g', -1, 64))
	}
	const gauge = "vllm:sleep_mode_operations_in_flight"
	fmt.Fprintf(b, "# HELP %s Sleep-mode operations currently awaited.\n# TYPE %s gauge\n", gauge, gauge)
	for _, op := range ops {
		fmt.Fprintf(b, "%s{operation=%q} %s\n", gauge, op, pyFloat(float64(s.ops[op].inFlight)))
	}
}

// --- the engine's side ---

// engineSleep is the EngineCore's sleep: which memory it gave back.
type engineSleep struct {
	level int // 0 awake
}

// wakeTime is how long a wake takes: FAKEVLLM_WAKE, else the weights
// copied back from pinned host memory at 20 GiB/s (level 1); level 2 has
// nothing to copy (the memory is mapped again, empty).
func (e *engine) wakeTime(level int) time.Duration {
	if e.env.Wake > 0 {
		return e.env.Wake
	}
	if level != 1 {
		return 10 * time.Millisecond
	}
	return time.Duration(float64(e.mm.Weights) / float64(20*gib) * float64(time.Second))
}

// sleepNow frees the pool's memory: everything but the residual.
func (e *engine) sleepNow(m msg) {
	if e.sleep.level > 0 {
		e.log.warn("abstract.py:384", "Executor is already sleeping.")
		e.send(formatMsg("slept", "level", e.sleep.level))
		return
	}
	level, _ := m.int("level")
	start := time.Now()
	e.usedMu.Lock()
	before := e.used
	e.usedMu.Unlock()
	after := before
	backup := int64(0)
	if m.Fields["pool"] == "true" {
		// Every allocation of the cumem pool goes: weights (backed up to
		// host memory at level 1), KV cache, workspace. What stays is
		// what the pool never owned.
		after = min(before, e.env.SleepResidual)
		if level == 1 {
			backup = min(before-after, e.mm.Weights-e.mm.External)
		}
	}
	e.log.info("cumem.py:278", "CuMemAllocator: sleep freed %.2f GiB memory in total, of which %.2f GiB is backed up in CPU and the rest %.2f GiB is discarded directly.",
		float64(before-after)/float64(gib), float64(backup)/float64(gib), float64(before-after-backup)/float64(gib))
	e.sleep.level = int(level)
	e.setUsed(after)
	e.log.info("gpu_worker.py:326", "Sleep mode freed %s GiB memory, %s GiB memory is still in use.",
		gibStr(before-after), gibStr(e.mm.Reserved+e.othersUsed()+after))
	e.log.info("abstract.py:390", "It took %.6f seconds to fall asleep.", time.Since(start).Seconds())
	e.send(formatMsg("slept", "level", level, "freed", before-after, "used", after))
}

// wakeNow takes the memory back (after the copy) and resumes stepping. It
// dies of an OOM when the memory is no longer there.
func (e *engine) wakeNow(m msg) {
	if e.sleep.level == 0 {
		e.log.warn("abstract.py:395", "Executor is not sleeping.")
		e.send("woke\n")
		return
	}
	start := time.Now()
	if m.Fields["pool"] == "true" {
		time.Sleep(e.wakeTime(e.sleep.level)) // the copy back is what is simulated
		want := e.mm.serving(0, 0, 0)
		e.usedMu.Lock()
		cur := e.used
		e.usedMu.Unlock()
		for _, r := range e.ranks {
			if o := e.othersUsedOn(r); r.gpu.dev.Reserved+o+want > r.gpu.dev.Total {
				e.oom(want, cur, o)
			}
		}
		e.setUsed(want)
	}
	e.log.info("abstract.py:412", "It took %.6f seconds to wake up tags %s.", time.Since(start).Seconds(), "{'weights', 'kv_cache'}")
	e.sleep.level = 0
	e.send("woke\n")
}

// sleepModeConfig is ModelConfig's check of --enable-sleep-mode: the CPU
// build refuses it (pydantic wraps the ValueError raised in
// __post_init__, exit 1); CUDA turns the cumem allocator on.
func (a *apiServer) sleepModeConfig() bool {
	if a.env.Device == "cpu" {
		a.log.stderrLines(append(apiStartupTrace(framesModelConfig,
			"pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"),
			"  Value error, Sleep mode is not supported on current platform. [type=value_error, input_value=ArgsKwargs((), {'model': ...nderer_num_workers': 1}), input_type=ArgsKwargs]",
			"    For further information visit https://errors.pydantic.dev/2.14/v/value_error")...)
		return false
	}
	if a.env.Era != eraV0 {
		a.log.info("model.py:659", "Enabling cumem allocator because sleep mode requires it.")
	}
	return true
}

// framesModelConfig: create_engine_config building the ModelConfig (vLLM 0.32.0).
var framesModelConfig = []frame{
	vf("vllm/entrypoints/launchers/api_server/entry.py", 83, "build_async_engine_client_from_engine_args", "vllm_config = engine_args.create_engine_config(usage_context=usage_context)"),
	vf("vllm/engine/arg_utils.py", 2240, "create_engine_config", "model_config = self.create_model_config()"),
	vf("vllm/engine/arg_utils.py", 1955, "create_model_config", "return ModelConfig("),
	{file: pyLib + "/pydantic/_internal/_dataclasses.py", line: 121, fn: "__init__", code: "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)"},
}
