package policy

import (
	"fmt"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// Scores rank root causes when a log holds several: an OOM inside NCCL is an
// OOM, a free-memory check failure explains the KV error that may follow it,
// and a configuration error beats the generic crash lines it produces.
const (
	scoreOOM       = 100
	scoreHostOOM   = 90
	scoreGPUBusy   = 80
	scoreKV        = 70
	scoreConfig    = 55 // argparse, model not found, port in use
	scoreValueErr  = 50 // other startup ValueErrors unrelated to memory, a broken install
	scoreTimeout   = 35 // a collective or a Ray channel timed out: the engine was stuck
	scoreCrash     = 30 // NCCL errors, segfaults, CUDA errors
	scoreDied      = 20 // "died unexpectedly"
	scoreStuck     = 15 // vLLM's own "stuck" warning: a hang only when nothing else explains the log
	scoreException = 10 // any other exception line: evidence, never proof of a failure
)

type rule struct {
	needle string
	cause  Cause
	score  int
}

// rules are tried in order; the first that matches decides a line. Needles
// are literal (strings.Contains, no regexp) to keep Classify fast.
var rules = []rule{
	// Ray's OutOfMemoryError is its memory monitor killing a worker for host
	// memory; it must come before the GPU rule below.
	{"ray.exceptions.OutOfMemoryError", CauseHostOOM, scoreHostOOM},
	{"Task was killed due to the node running low on memory", CauseHostOOM, scoreHostOOM},
	{"killed due to memory pressure", CauseHostOOM, scoreHostOOM}, // raylet
	{"Ray killed this worker", CauseHostOOM, scoreHostOOM},

	{"OutOfMemoryError", CauseOOM, scoreOOM},
	{"CUDA out of memory", CauseOOM, scoreOOM},
	{"CUDA driver error: out of memory", CauseOOM, scoreOOM},
	{"CUDA error: out of memory", CauseOOM, scoreOOM},
	{"'out of memory'", CauseOOM, scoreOOM},               // NCCL: "Cuda failure 'out of memory'", "Cuda failure 2 'out of memory'"
	{"Cannot auto-fit max_model_len", CauseOOM, scoreOOM}, // --max-model-len auto: not enough GPU memory
	{"CUBLAS_STATUS_ALLOC_FAILED", CauseOOM, scoreOOM},
	{"HIP out of memory", CauseOOM, scoreOOM},

	{"has been killed by the OOM killer", CauseHostOOM, scoreHostOOM}, // systemd; Ray's "killed by the OOM killer" is a guess in a list
	{"Cannot allocate memory", CauseHostOOM, scoreHostOOM},            // ENOMEM: mmap of the weights, fork
	{"exited with code 137", CauseHostOOM, scoreHostOOM},              // docker compose: SIGKILL, the container's memory limit
	{"exit code 137", CauseHostOOM, scoreHostOOM},
	{"Out of memory: Killed process", CauseHostOOM, scoreHostOOM},
	{"Memory cgroup out of memory", CauseHostOOM, scoreHostOOM},
	{"oom-kill:", CauseHostOOM, scoreHostOOM},
	{"OOMKilled", CauseHostOOM, scoreHostOOM},

	{"less than desired GPU memory utilization", CauseGPUBusy, scoreGPUBusy},
	{"Error in memory profiling", CauseGPUBusy, scoreGPUBusy},

	{"No available memory for the cache blocks", CauseKVInsufficient, scoreKV},
	{"larger than the available KV cache memory", CauseKVInsufficient, scoreKV},
	{"larger than the maximum number of tokens that can be stored in KV cache", CauseKVInsufficient, scoreKV},
	{"Available KV cache memory: -", CauseKVInsufficient, scoreKV},
	{"# GPU blocks: 0,", CauseKVInsufficient, scoreKV}, // V0: no block left for the KV cache

	{"unrecognized arguments", CauseConfigError, scoreConfig},
	{"ddress already in use", CauseConfigError, scoreConfig},
	{"RepositoryNotFoundError", CauseConfigError, scoreConfig},
	{"Repository Not Found", CauseConfigError, scoreConfig},
	{"is not a local folder and is not a valid model identifier", CauseConfigError, scoreConfig},
	{"Incorrect path_or_model_id", CauseConfigError, scoreConfig},
	{"Invalid repository ID or local directory", CauseConfigError, scoreConfig},
	{"HFValidationError", CauseConfigError, scoreConfig},
	{"GatedRepoError", CauseConfigError, scoreConfig},
	{"Cannot access gated repo", CauseConfigError, scoreConfig},
	{"LocalEntryNotFoundError", CauseConfigError, scoreConfig},
	{"does not appear to have a file named", CauseConfigError, scoreConfig},
	{"FileNotFoundError", CauseConfigError, scoreConfig},

	{"Watchdog caught collective operation timeout", CauseHang, scoreTimeout},
	{"RayChannelTimeoutError", CauseHang, scoreTimeout},
	{"Timed out waiting for object available to read", CauseHang, scoreTimeout},
	{"No available shared memory broadcast block found", CauseHang, scoreStuck},

	{"NCCL error", CauseCrash, scoreCrash},
	{"ncclSystemError", CauseCrash, scoreCrash},
	{"ncclInternalError", CauseCrash, scoreCrash},
	{"ncclUnhandledCudaError", CauseCrash, scoreCrash},
	{"ncclRemoteError", CauseCrash, scoreCrash},
	{"illegal memory access", CauseCrash, scoreCrash},
	{"device-side assert triggered", CauseCrash, scoreCrash},
	{"CUDA error:", CauseCrash, scoreCrash},
	{"Segmentation fault", CauseCrash, scoreCrash},
	{"SIGSEGV", CauseCrash, scoreCrash},
	{"Fatal Python error", CauseCrash, scoreCrash},
	{"core dumped", CauseCrash, scoreCrash},
	{"died unexpectedly", CauseCrash, scoreDied},
	{"exited with exit code", CauseCrash, scoreDied}, // a platform's word for a worker's death
}

// frameRules name functions of vLLM whose "raise" (the source line Python
// prints under the frame) says what failed, for excerpts cut before the
// exception line. The raise must start with raise.
var frameRules = []struct {
	fn, raise string
	cause     Cause
	score     int
}{
	{"in check_enough_kv_cache_memory", "raise ValueError(", CauseKVInsufficient, scoreKV},  // V1 KV check
	{"in _check_enough_kv_cache_memory", "raise ValueError(", CauseKVInsufficient, scoreKV}, // V1 KV check, later name
	{"in raise_if_cache_size_invalid", "raise ValueError(", CauseKVInsufficient, scoreKV},   // V0 KV check
	{"in _dummy_sampler_run", "raise RuntimeError(", CauseOOM, scoreOOM},                    // the sampler warm-up OOM
}

// wrappers only say that the engine died; the root cause is above them.
var wrappers = []string{
	"EngineCore failed to start",
	"Engine core initialization failed",
	"EngineCore encountered a fatal error",
	"EngineCore encountered an issue",
	"AsyncLLM output_handler failed",
	"Got fatal signal from worker processes",
	"EngineDeadError",
	"MQLLMEngine is already dead",
	"Engine loop has died",
	"Engine process failed to start",
}

// prefilter: a line that holds none of these cannot match any rule, wrapper
// or exception, and skips the rule loop (most lines of a log).
// Keep it in step with rules, wrappers and the exception/argparse checks
// (TestPrefilterCoversRules).
var prefilter = []string{"rror", "emory", "died", "NCCL", "nccl", "fault", "Fatal", "ound", "in use",
	"unrecognized", "OOM", "oom-kill", "dumped", "illegal", "assert", "xception", "ngine", "_FAILED", "Value error",
	"stored in KV", "model identifier", "path_or_model_id", "repository ID", "gated repo", "file named", "Watchdog", "SIGSEGV", "output_handler",
	"Timed out", "auto-fit", "exit code", "exited with code", "killed", "fatal signal", "blocks: 0,"}

func mayMatch(msg string) bool {
	for _, p := range prefilter {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// isArgparseError recognises "vllm serve: error: …" / "api_server.py: error: …".
func isArgparseError(msg string) bool {
	i := strings.Index(msg, ": error: ")
	if i <= 0 || i > 48 {
		return false
	}
	for j := 0; j < i; j++ {
		c := msg[j]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' || c == '/' || c == ' ') {
			return false
		}
	}
	return msg[0] != ' '
}

// memoryish: a ValueError about memory is not a configuration mistake to give
// up on; the specific memory rules above classify the known ones.
func memoryish(msg string) bool {
	return strings.Contains(msg, "memory") || strings.Contains(msg, "Memory") || strings.Contains(msg, "KV cache")
}

type lineKind uint8

const (
	kindNone lineKind = iota
	kindRoot
	kindWrapper
)

// matchLine classifies one message (prefixes already stripped).
func matchLine(msg string) (lineKind, Cause, int) {
	// Traceback source lines ("    raise ValueError(\"No available memory…")
	// and frame lines repeat text of the exception below them: they are
	// matched against the rules only (an excerpt may end before the
	// exception), never read as an exception or a wrapper themselves.
	if strings.HasPrefix(msg, "    ") {
		if !mayMatch(msg) {
			return kindNone, "", 0
		}
		return matchRules(msg)
	}
	if isFrame(msg) || !mayMatch(msg) {
		return kindNone, "", 0
	}
	for _, w := range wrappers {
		if strings.Contains(msg, w) {
			return kindWrapper, "", 0
		}
	}
	if k, c, sc := matchRules(msg); k != kindNone {
		return k, c, sc
	}
	if isArgparseError(msg) {
		return kindRoot, CauseConfigError, scoreConfig
	}
	typ, isExc := vllmlog.ExceptionType(msg)
	if (isExc && (strings.HasSuffix(typ, "ValueError") || strings.HasSuffix(typ, "ValidationError"))) ||
		strings.HasPrefix(strings.TrimLeft(msg, " "), "Value error, ") {
		if !memoryish(msg) {
			return kindRoot, CauseConfigError, scoreValueErr
		}
	}
	// A broken install (vllm or one of its modules cannot be imported) does
	// not heal on a restart.
	if typ == "ModuleNotFoundError" || typ == "ImportError" {
		return kindRoot, CauseConfigError, scoreValueErr
	}
	if isExc {
		return kindRoot, CauseCrash, scoreException
	}
	return kindNone, "", 0
}

func matchRules(msg string) (lineKind, Cause, int) {
	for i := range rules {
		if strings.Contains(msg, rules[i].needle) {
			return kindRoot, rules[i].cause, rules[i].score
		}
	}
	return kindNone, "", 0
}

// isFrame recognises a traceback frame line, `File "x.py", line 12, in f`
// (or faulthandler's `File "x.py", line 12 in f`), however indented.
func isFrame(msg string) bool {
	t := strings.TrimLeft(msg, " ")
	return strings.HasPrefix(t, `File "`) && strings.Contains(t, `", line `)
}

// holdsFrame recognises a frame behind a prefix the guard does not strip
// (CI timestamps, compose service names, "[rank0]:") or inside a paste
// that lost its newlines: the line is a traceback, and may hold more.
func holdsFrame(msg string) bool {
	i := strings.Index(msg, `  File "`)
	return i > 0 && strings.Contains(msg[i:], `", line `)
}

// frameCause is what the raise printed under the frame fn says, if anything.
func frameCause(frame, src string) (Cause, int, bool) {
	src = strings.TrimLeft(src, " ")
	if !strings.HasPrefix(src, "raise ") {
		return "", 0, false
	}
	for _, r := range frameRules {
		if strings.HasPrefix(src, r.raise) && strings.Contains(frame, r.fn) {
			return r.cause, r.score, true
		}
	}
	return "", 0, false
}

const maxHits = 16

// hits are the matched lines of one cause at its best score so far.
type hits struct {
	score int
	idx   []int
}

func (h *hits) add(i, score int) {
	switch {
	case score > h.score:
		h.score = score
		h.idx = append(h.idx[:0], i)
	case score == h.score && len(h.idx) < maxHits:
		h.idx = append(h.idx, i)
	case score == h.score && score == scoreException:
		// Generic exceptions: the latest are closest to the death.
		copy(h.idx, h.idx[1:])
		h.idx[len(h.idx)-1] = i
	}
}

// scan is what one pass over the lines found.
type scan struct {
	byCause   map[Cause]*hits
	ready     bool // "Application startup complete." seen
	readyLine int
	wrapper   int // index of the first wrapper line, -1 if none
	traceback bool
	lastFrame int // index of the last traceback frame line, -1 if none
	waiting   int // "Waiting for … core engine proc(s) to start." lines
	start     int // index of the first line of the last run
}

// text is line l as evidence shows it: ANSI stripped, no trailing CR/space.
func text(l Line) string { return strings.TrimRight(vllmlog.StripANSI(l.Text), "\r\n ") }

// runMarkers open a run of vLLM; a saved log may hold several runs and only
// the last one is classified. The guard's own lines are always one run: its
// stdout and stderr interleave, so a traceback on stderr can come before a
// banner line on stdout of the same run, and must not be cut away.
var runMarkers = []string{"vLLM API server version", "vLLM server version", "non-default args:"}

func scanLines(lines []Line, severalRuns bool) *scan {
	s := &scan{byCause: make(map[Cause]*hits, 4), wrapper: -1, readyLine: -1, lastFrame: -1}
	for i := range lines {
		if !severalRuns {
			break
		}
		t := lines[i].Text
		if strings.Contains(t, "erver version") || strings.Contains(t, "non-default args:") {
			for _, m := range runMarkers {
				if strings.Contains(t, m) {
					s.start = i
				}
			}
		}
	}
	for i := s.start; i < len(lines); i++ {
		// A client's text (an access line's path and query, a logged
		// prompt) is never evidence: one GET /v1/models?OutOfMemoryError
		// must not make the next crash an OOM.
		if vllmlog.IsClientText(lines[i].Text) {
			continue
		}
		msg := vllmlog.Message(lines[i].Text)
		if vllmlog.IsStartupComplete(msg) {
			s.ready = true
			s.readyLine = i
			continue
		}
		if strings.Contains(msg, "core engine proc(s) to start") {
			s.waiting++
			continue
		}
		if vllmlog.IsTracebackHeader(msg) {
			s.traceback = true
			continue
		}
		if isFrame(msg) {
			// Excerpts often start inside a traceback: frames are a
			// traceback even without its first line.
			s.traceback = true
			s.lastFrame = i
			continue
		}
		if holdsFrame(msg) {
			s.traceback = true
			s.lastFrame = i
		}
		kind, cause, score := matchLine(msg)
		if kind == kindNone && s.lastFrame >= 0 && s.lastFrame == i-1 {
			// The source line under a frame: a raise in a known check.
			if c, sc, ok := frameCause(vllmlog.Message(lines[i-1].Text), msg); ok {
				kind, cause, score = kindRoot, c, sc
			}
		}
		switch kind {
		case kindWrapper:
			if s.wrapper < 0 {
				s.wrapper = i
			}
		case kindRoot:
			h := s.byCause[cause]
			if h == nil {
				h = &hits{}
				s.byCause[cause] = h
			}
			h.add(i, score)
		}
	}
	return s
}

// best returns the winning cause among the log's hits, ignoring config
// errors when vLLM had become ready (request errors are not fatal) and
// scores below min.
func (s *scan) best(phase Phase, min int) (Cause, *hits) {
	var bc Cause
	var bh *hits
	for _, c := range Causes {
		h := s.byCause[c]
		if h == nil || h.score < min || (c == CauseConfigError && phase == PhaseReady) {
			continue
		}
		if bh == nil || h.score > bh.score {
			bc, bh = c, h
		}
	}
	return bc, bh
}

// evidence turns hit indices into lines, one per distinct message (four TP
// workers printing the same OOM make one line of evidence), at most four.
func (s *scan) evidence(lines []Line, h *hits) []Line {
	if h == nil {
		return nil
	}
	out := make([]Line, 0, 4)
	seen := make(map[string]bool, 4)
	for _, i := range h.idx {
		m := vllmlog.Message(lines[i].Text)
		if seen[m] {
			continue
		}
		seen[m] = true
		out = append(out, Line{N: lines[i].N, Stream: lines[i].Stream, Text: text(lines[i])})
		if len(out) == 4 {
			break
		}
	}
	return out
}

// Classify gives one cause, with its evidence, for one death of vLLM (or,
// with e.Offline, for a saved log, where "" means no failure was found).
// It is a pure function of e.
func Classify(e Exit) Verdict { return verdictOf(e, scanLines(e.Lines, e.Offline)) }

func verdictOf(e Exit, s *scan) Verdict {
	phase := e.Phase
	if phase == "" {
		phase = PhaseStarting
		if s.ready {
			phase = PhaseReady
		}
	}
	v := classify(e, s, phase)
	if v.Cause != "" {
		v.Advice = adviceFor(v)
	}
	return v
}

func classify(e Exit, s *scan, phase Phase) Verdict {
	// The guard's own failure to start vLLM (EMFILE, EAGAIN, ENOMEM, its
	// keeper) says nothing about vLLM's configuration. It is a crash of the
	// start, not a new cause: it backs off and counts toward the crash loop
	// like one, and the summary names it.
	if e.GuardFailure != "" {
		return Verdict{Cause: CauseCrash, Confidence: "high", guardStart: true,
			Summary: "the guard could not start vLLM: " + e.GuardFailure + " (its own error, not vLLM's configuration)"}
	}
	if e.StartFailure != "" {
		return Verdict{Cause: CauseConfigError, Confidence: "high",
			Summary: "vLLM could not be started: " + e.StartFailure}
	}
	if e.Hang != "" {
		// A dead engine also fails liveness; if the log names a memory cause,
		// that is the root cause the ladder must react to.
		if c, h := s.best(phase, scoreKV); h != nil {
			ev := s.evidence(e.Lines, h)
			return Verdict{Cause: c, Confidence: "high", Evidence: ev,
				Summary: summaryFor(c, ev) + " (then killed as hung: " + e.Hang + ")"}
		}
		return Verdict{Cause: CauseHang, Confidence: "high", Summary: "vLLM hung: " + e.Hang}
	}
	if e.HostOOMKill && e.Signal == "SIGKILL" && !e.SignalByGuard {
		ev := s.evidence(e.Lines, s.byCause[CauseHostOOM])
		return Verdict{Cause: CauseHostOOM, Confidence: "high", Evidence: ev,
			Summary: "killed by the kernel OOM killer (SIGKILL, cgroup oom_kill count went up): host memory ran out, not GPU memory"}
	}

	c, h := s.best(phase, scoreDied)
	if h != nil && c != CauseCrash {
		ev := s.evidence(e.Lines, h)
		return Verdict{Cause: c, Confidence: "high", Evidence: ev, Summary: summaryFor(c, ev)}
	}
	// A crash with no OOM line but the GPU at the ceiling is most likely an
	// OOM that died before it could say so (NCCL, a killed worker).
	if !e.Offline && e.Critical > 0 {
		peak := 0.0
		for _, f := range e.MemFractions {
			peak = max(peak, f)
		}
		if peak >= e.Critical {
			var ev []Line
			if h != nil {
				ev = s.evidence(e.Lines, h)
			}
			return Verdict{Cause: CauseOOM, Confidence: "low", Evidence: ev,
				Summary: fmt.Sprintf("GPU out of memory, inferred from memory: no OOM line in the log, but GPU memory reached %.1f%% (critical %.1f%%) just before vLLM died",
					peak*100, e.Critical*100)}
		}
	}
	if h != nil {
		ev := s.evidence(e.Lines, h)
		return Verdict{Cause: CauseCrash, Confidence: "high", Evidence: ev, Summary: summaryFor(CauseCrash, ev)}
	}

	if e.Offline {
		return classifyOffline(e, s, phase)
	}
	// Any exit the guard did not ask for is a failure, whatever its code.
	ev := s.evidence(e.Lines, s.byCause[CauseCrash])
	return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: ev, Summary: exitWords(e, s, ev)}
}

// classifyOffline finishes a saved log with no decisive root-cause line: a
// failure is reported only when the log shows one.
func classifyOffline(e Exit, s *scan, phase Phase) Verdict {
	excs := s.evidence(e.Lines, s.byCause[CauseCrash])
	if s.wrapper >= 0 {
		return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: excs,
			Summary: fmt.Sprintf("vLLM's engine died (line %d: %s) and the log holds no root-cause line above it",
				e.Lines[s.wrapper].N, clip(vllmlog.Message(e.Lines[s.wrapper].Text), 120))}
	}
	if h := s.byCause[CauseHang]; h != nil && !s.traceback {
		// Only vLLM's own "stuck" warning: no exception, no death.
		ev := s.evidence(e.Lines, h)
		return Verdict{Cause: CauseHang, Confidence: "low", Evidence: ev,
			Summary: fmt.Sprintf("vLLM reported a stuck worker or collective %d time(s) and the log shows no other failure: line %d: %s",
				len(h.idx), ev[0].N, clip(vllmlog.Message(ev[0].Text), 160))}
	}
	if phase == PhaseStarting && s.waiting >= 3 && !s.traceback {
		return Verdict{Cause: CauseHang, Confidence: "low",
			Summary: fmt.Sprintf("vLLM stalled while starting: the engine core never came up (%d \"Waiting for … core engine proc(s) to start\" lines)", s.waiting)}
	}
	if phase == PhaseStarting && s.traceback {
		if len(excs) > 0 {
			return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: excs, Summary: summaryFor(CauseCrash, excs)}
		}
		// The excerpt ends inside a traceback: still a failure.
		var ev []Line
		if s.lastFrame >= 0 {
			l := e.Lines[s.lastFrame]
			ev = []Line{{N: l.N, Stream: l.Stream, Text: text(l)}}
		}
		sum := "vLLM crashed: the log holds a traceback but no exception line"
		if len(ev) > 0 {
			sum += fmt.Sprintf(" (its last frame, line %d: %s)", ev[0].N, clip(strings.TrimSpace(vllmlog.Message(ev[0].Text)), 160))
		}
		return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: ev, Summary: sum}
	}
	if phase == PhaseReady {
		return Verdict{Summary: "no failure found: vLLM became ready"}
	}
	return Verdict{Summary: "no failure found: the log ends while vLLM was still starting"}
}

func exitWords(e Exit, s *scan, ev []Line) string {
	var what string
	switch {
	case e.Signal != "" && e.SignalByGuard:
		what = "vLLM died by " + e.Signal + " sent by the guard"
	case e.Signal != "":
		what = "vLLM was killed by " + e.Signal + " (not sent by the guard)"
	case e.ExitCode == 0:
		what = "vLLM exited with code 0 without being asked to stop (vLLM exits 0 after its engine dies)"
	default:
		what = fmt.Sprintf("vLLM exited with code %d", e.ExitCode)
	}
	if len(ev) > 0 {
		what += "; last error: " + clip(vllmlog.Message(ev[len(ev)-1].Text), 160)
	} else if s.wrapper >= 0 {
		what += fmt.Sprintf("; engine death at line %d, no root-cause line in the log", e.Lines[s.wrapper].N)
	}
	return what
}

var causeTitle = map[Cause]string{
	CauseOOM:            "GPU out of memory",
	CauseKVInsufficient: "KV cache does not fit in the GPU memory budget",
	CauseGPUBusy:        "GPU memory held by another process at startup",
	CauseConfigError:    "vLLM rejected its configuration",
	CauseHang:           "vLLM hung",
	CauseCrash:          "vLLM crashed",
	CauseHostOOM:        "host memory ran out (kernel OOM killer)",
}

func summaryFor(c Cause, ev []Line) string {
	t := causeTitle[c]
	if len(ev) == 0 {
		return t
	}
	return fmt.Sprintf("%s: line %d: %s", t, ev[0].N, clip(vllmlog.Message(ev[0].Text), 200))
}

// adviceFor gives the operator's next steps for a verdict, most specific first.
func adviceFor(v Verdict) []string {
	ev := ""
	for _, l := range v.Evidence {
		ev += l.Text + "\n"
	}
	has := func(s string) bool { return strings.Contains(ev, s) || strings.Contains(v.Summary, s) }
	switch v.Cause {
	case CauseOOM:
		a := []string{
			"the guard steps one rung down (lower max_num_seqs and gpu_memory_utilization) and restarts",
			"lower --max-num-seqs or --max-num-batched-tokens to shrink activation peaks; lower gpu_memory_utilization to leave room outside the KV cache",
			"check for other processes on the GPU: vllm-guard gpus",
		}
		if has("warming up sampler") {
			a = append([]string{"the sampler warm-up runs max_num_seqs dummy requests: lower max_num_seqs first"}, a...)
		}
		if has("ncclUnhandledCudaError") || has("Cuda failure") {
			a = append(a, "NCCL ran out of GPU memory for its buffers: leave more room (lower gpu_memory_utilization)")
		}
		return a
	case CauseKVInsufficient:
		return []string{
			"raise gpu_memory_utilization (if the GPU has room) or lower --max-model-len so one full-length sequence fits in the KV cache",
			"a lower max_num_seqs shrinks the profiling run and leaves more memory for the KV cache",
		}
	case CauseGPUBusy:
		return []string{
			"another process holds GPU memory, often an orphaned EngineCore or worker of the previous run: find it with vllm-guard gpus (or nvidia-smi) and stop it",
			"or lower gpu_memory_utilization so this instance fits beside the other tenant",
		}
	case CauseConfigError:
		switch {
		case has("ddress already in use"):
			return []string{"another process listens on vLLM's port: stop it or change [vllm] port", "the guard does not retry a configuration error (exit 78)"}
		case has("unrecognized arguments") || has(": error: "):
			return []string{"fix or remove the flag vLLM rejected ([vllm] command or the extra args); `vllm serve --help` lists this version's flags", "the guard does not retry a configuration error (exit 78)"}
		case has("Repository") || has("model identifier") || has("path_or_model_id") || has("gated repo") || has("GatedRepo") ||
			has("FileNotFound") || has("LocalEntryNotFound") || has("file named") || has("HFValidation"):
			return []string{"check the model name or path in [vllm] command; for gated or private models set HF_TOKEN in [vllm] env; offline (HF_HUB_OFFLINE=1) needs the model in the cache", "the guard does not retry a configuration error (exit 78)"}
		case has("could not be started"):
			return []string{"check [vllm] command: the executable must exist and be executable in the guard's PATH (or give an absolute path)", "the guard does not retry a configuration error (exit 78)"}
		}
		return []string{"fix the vLLM arguments or model configuration named in the evidence ([vllm] command)", "the guard does not retry a configuration error (exit 78)"}
	case CauseHang:
		return []string{
			"read the last lines before the kill: the last load phase reached shows where it stuck",
			"with tensor parallelism check NCCL (NCCL_DEBUG=INFO, /dev/shm size, P2P); raise [readiness] stall_timeout only if loading or compiling legitimately takes longer",
		}
	case CauseHostOOM:
		return []string{
			"host RAM ran out, not GPU memory: raise the memory limit of the unit or container (MemoryMax=, --memory, resources.limits.memory)",
			"reduce host memory use: CPU offload / CPU KV cache size, fewer API server processes, model loading with less host copying",
		}
	}
	a := []string{"read the first error above the engine-death messages; the guard restarts on the same rung with backoff"}
	if has("NCCL") || has("nccl") || has("Watchdog") {
		a = append(a, "NCCL failed: check NCCL_DEBUG=INFO output, /dev/shm size (docker --shm-size), P2P/IB settings and GPU health (nvidia-smi -q, dmesg Xid)")
	}
	if has("illegal memory access") || has("CUDA error") || has("device-side assert") {
		a = append(a, "a CUDA kernel failed: check dmesg for Xid errors; try --enforce-eager to rule out CUDA graphs")
	}
	return a
}
